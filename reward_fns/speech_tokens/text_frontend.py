"""What a model reads in place of the text it is asked to say: a text front end its checkpoint declares.

Llasa-1B reads the text as written. A small model trained on a few hours of speech learns English spelling slowly
(mini-llasa, `maspo_verl.speaking_model`, read letters for 61 CPU minutes and still said most words wrong), so a
checkpoint may declare a front end that turns the text into a spelling of its sounds first. The declaration is the
tokenizer's ``text_frontend`` setting (saved in ``tokenizer_config.json``; absent means ``"text"``), so every place
that renders a prompt for a tokenizer (`reward_fns.speech_tokens.llasa_prompt.render_prompt_ids`, `model_text`)
renders the one the model was trained on. The reward always scores against the text itself.

Front ends:

- ``"text"``: the text as written (Llasa-1B, and any checkpoint that declares nothing);
- ``"espeak-ng:en-us"``: espeak-ng's US English phoneme mnemonics (``espeak-ng -v en-us -q -x``; Debian's
  ``espeak-ng``, installed by ``scripts/setup.sh``), printable ASCII with stress marks and word breaks, clauses
  joined by a space: "Keep away from fire." -> ``k'i:p a#w'eI frVm f'aI3``. espeak-ng's pronunciations are the
  front end's, not the recordings' (flite's), and they differ in places (numbers, a few words): the model learns
  that difference as it learns the voice.
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


def frontend_of(tokenizer) -> str:
    """The front end ``tokenizer`` declares (``"text"`` when it declares none)."""
    return (getattr(tokenizer, "init_kwargs", None) or {}).get(TEXT_FRONTEND_KEY) or PLAIN


def frontend_of_checkpoint(model_dir: str | Path) -> str:
    """The front end a checkpoint folder's ``tokenizer_config.json`` declares (``"text"`` when none, or no file:
    a hub id or a model that declares nothing), read without loading the tokenizer."""
    config = Path(model_dir) / "tokenizer_config.json"
    declared = json.loads(config.read_text()).get(TEXT_FRONTEND_KEY) if config.is_file() else None
    return declared or PLAIN


def model_text(tokenizer, text: str) -> str:
    """What the model of ``tokenizer`` reads for ``text``."""
    return get_frontend(frontend_of(tokenizer))(text)
