"""What a model reads in place of the text it is asked to say: a text front end its checkpoint declares.

Llasa-1B reads the text as written. A small model trained on a few hours of speech learns English spelling slowly
(mini-llasa, `maspo_lab.speaking_model`, read letters and still said most words wrong: docs/history.md), so a
checkpoint may declare a front end that turns the text into a spelling of its sounds first. The declaration is the
tokenizer's ``text_frontend`` setting (saved in ``tokenizer_config.json``; absent means ``"text"``), so every place
that renders a prompt for a tokenizer (`maspo_base.speech_tokens.llasa_prompt.render_prompt_ids`, `model_text`)
renders the one the model was trained on. The reward always scores against the text itself.

Front ends:

- ``"text"``: the text as written (Llasa-1B, and any checkpoint that declares nothing);
- ``"espeak-ng:en-us"``: espeak-ng's US English phoneme mnemonics (``espeak-ng -v en-us -q -x``; Debian's
  ``espeak-ng``, installed by ``scripts/setup.sh``), printable ASCII with stress marks and word breaks, clauses
  joined by a space: "Keep away from fire." -> ``k'i:p a#w'eI frVm f'aI3``. espeak-ng's pronunciations are the
  front end's, not the recordings' (flite's), and they differ in places (numbers, a few words): the model learns
  that difference as it learns the voice.

A checkpoint that learnt several voices reads a speaker tag before the text (``"[rms] k'i:p a#w'eI frVm f'aI3"``):
training tags every prompt with its recording's voice, and the tokenizer's ``speaker`` setting names the voice its
prompts are tagged with everywhere else (`reader_of`); its ``speakers`` setting lists the voices it learnt, and
another voice is refused (`check_speaker`). A checkpoint of one voice declares none and reads no tag.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

TEXT_FRONTEND_KEY = "text_frontend"
"""The tokenizer setting (``tokenizer_config.json``) that names a checkpoint's front end."""

SPEAKER_KEY = "speaker"
"""The tokenizer setting that names the voice a checkpoint of several voices speaks in (absent: one voice, no tag)."""

SPEAKERS_KEY = "speakers"
"""The tokenizer setting that lists every voice a checkpoint of several voices learnt."""

PLAIN = "text"
ESPEAK_EN_US = "espeak-ng:en-us"


@functools.lru_cache(maxsize=65536)
def espeak_phonemes(text: str, voice: str = "en-us") -> str:
    """espeak-ng's phoneme mnemonics of ``text`` (one line per clause, joined by a space); empty for no speech."""
    if shutil.which("espeak-ng") is None:
        raise RuntimeError(
            "the text front end 'espeak-ng:<voice>' needs espeak-ng (Debian package espeak-ng; scripts/setup.sh)"
        )
    out = subprocess.run(
        ["espeak-ng", "-v", voice, "-q", "-x", "--", text], check=True, capture_output=True, text=True
    ).stdout
    return " ".join(line.strip() for line in out.splitlines() if line.strip())


FRONTENDS: dict[str, Callable[[str], str]] = {
    PLAIN: str,  # the text as written
    ESPEAK_EN_US: functools.partial(espeak_phonemes, voice="en-us"),
}


def get_frontend(name: str) -> Callable[[str], str]:
    try:
        return FRONTENDS[name]
    except KeyError:
        raise ValueError(f"unknown {TEXT_FRONTEND_KEY} {name!r}; valid: {sorted(FRONTENDS)}") from None


def _declared(tokenizer) -> dict:
    """The settings a tokenizer was saved with (``tokenizer_config.json``), where its declarations live."""
    return getattr(tokenizer, "init_kwargs", None) or {}


def frontend_of(tokenizer) -> str:
    """The front end ``tokenizer`` declares (``"text"`` when it declares none)."""
    return _declared(tokenizer).get(TEXT_FRONTEND_KEY) or PLAIN


def speaker_of(tokenizer) -> str | None:
    """The speaker ``tokenizer`` declares (None: a checkpoint of one voice)."""
    return _declared(tokenizer).get(SPEAKER_KEY) or None


def speakers_of(tokenizer) -> tuple[str, ...] | None:
    """The voices ``tokenizer``'s model learnt (None where it declares none: one voice, or a list not saved)."""
    return tuple(_declared(tokenizer).get(SPEAKERS_KEY) or ()) or None


def check_speaker(tokenizer, speaker: str) -> None:
    """Refuse a ``speaker`` that ``tokenizer``'s model did not learn: one voice only, or a voice not in its list."""
    if speaker_of(tokenizer) is None:
        raise ValueError(f"{SPEAKER_KEY} {speaker!r}: the model learnt one voice (its tokenizer declares none)")
    voices = speakers_of(tokenizer)
    if voices is not None and speaker not in voices:
        raise ValueError(f"{SPEAKER_KEY} {speaker!r}: not a voice the model learnt; valid: {', '.join(voices)}")


def speaker_tag(speaker: str) -> str:
    """The tag a speaker's prompts begin with: ``"[rms] "``."""
    if not speaker or not all(c.isalnum() or c in "-_" for c in speaker):
        raise ValueError(f"{SPEAKER_KEY} {speaker!r}: want a voice name of letters, digits, '-' and '_'")
    return f"[{speaker}] "


class Reader:
    """What a model reads for a text: its speaker's tag (if any), then its front end's reading of the text."""

    def __init__(self, frontend: str = PLAIN, speaker: str | None = None):
        self.frontend = get_frontend(frontend)
        self.tag = speaker_tag(speaker) if speaker else ""

    def __call__(self, text: str) -> str:
        return self.tag + self.frontend(text)


def reader_of(tokenizer, speaker: str | None = None) -> Reader:
    """The reader of ``tokenizer``'s model, in its declared speaker's voice unless ``speaker`` names another voice it
    learnt (`check_speaker`)."""
    if speaker is not None:
        check_speaker(tokenizer, speaker)
    return Reader(frontend_of(tokenizer), speaker or speaker_of(tokenizer))


def reader_of_checkpoint(model_dir: str | Path) -> Reader:
    """`reader_of` a checkpoint folder, read from its ``tokenizer_config.json`` without loading the tokenizer (the
    text as written for a hub id or a model that declares nothing)."""
    config = Path(model_dir) / "tokenizer_config.json"
    declared = json.loads(config.read_text()) if config.is_file() else {}
    return Reader(declared.get(TEXT_FRONTEND_KEY) or PLAIN, declared.get(SPEAKER_KEY) or None)


def model_text(tokenizer, text: str, speaker: str | None = None) -> str:
    """What the model of ``tokenizer`` reads for ``text`` (`reader_of`)."""
    return reader_of(tokenizer, speaker)(text)
