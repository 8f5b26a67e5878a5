"""The speaking testbed's corpus: English sentences from Debian's fortune files, spoken by flite's voices at 16 kHz.

`build_corpus` writes, under one folder:

- ``wav/<voice>/<id>.flac``: 16 kHz mono speech (flite 2.2's ``rms``, ``slt``, ``awb``, ``kal16`` voices speak at
  16 kHz natively), one file per sentence and voice;
- ``manifest.jsonl``: one line per utterance, ``{"id", "text", "voice", "split", "audio", "seconds"}``, ``audio``
  relative to the folder; ``split`` is ``train`` or ``heldout``, chosen per sentence, so a held-out sentence is
  held out in every voice;
- ``corpus.json``: how it was built (sources, voices, speeds, counts, the filters below).

Speed perturbation (`perturb_speed`, Kaldi's ``speed`` augmentation) adds, for a factor ``f``, a copy of every
utterance played ``f`` times as fast: resampled by ``1/f``, so it lasts ``1/f`` as long and its pitch is ``f``
times as high. A copy is a voice of its own, ``<voice>-sp<100 f>`` (``rms-sp90``), with its own speaker tag: the
same sentences and splits, another speaker to learn from.

Sentences (`candidate_sentences`) are cut from the records of ``/usr/share/games/fortunes/*`` at sentence ends and
kept when they start with a capital, hold only letters, spaces and ``' , ; : -`` before their final ``. ! ?``, have
5-12 words and no word in capitals (acronyms read oddly); then shuffled by ``seed``. An utterance is kept when it
lasts ``min_seconds``..``max_seconds`` (1-4 s: 50-200 codes at 50 per second).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

FORTUNES = Path("/usr/share/games/fortunes")
VOICES = ("rms", "slt", "awb", "kal16")
"""flite 2.2's 16 kHz English voices (Debian's ``flite``); ``rms`` is the one Whisper tiny.en hears best."""
SPEEDS = (0.9, 1.1)
"""The speed perturbation of the shipped build's corpus (`perturb_speed`): Kaldi's factors."""
SAMPLE_RATE = 16_000
MANIFEST = "manifest.jsonl"
SPLITS = ("train", "heldout")
_SENTENCE = re.compile(r"[A-Z][A-Za-z' ,;:-]*[a-z][.!?]")
_PERTURBED = re.compile(r"-sp\d+$")


@dataclass(frozen=True)
class Utterance:
    """One line of the manifest."""

    id: str
    text: str
    voice: str
    split: str
    audio: str
    seconds: float


def candidate_sentences(root: Path = FORTUNES, min_words: int = 5, max_words: int = 12) -> list[str]:
    """Every distinct sentence of the fortune files that passes the module docstring's filters, sorted."""
    files = sorted(p for p in root.iterdir() if p.is_file() and not p.suffix) if root.is_dir() else []
    if not files:
        raise FileNotFoundError(
            f"no fortune files under {root}: install Debian's fortunes (bash scripts/setup.sh does)"
        )
    found = set()
    for path in files:
        for record in path.read_text(errors="ignore").split("\n%\n"):
            for sentence in re.split(r"(?<=[.!?])\s+", " ".join(record.split())):
                words = sentence.split()
                if (
                    _SENTENCE.fullmatch(sentence)
                    and min_words <= len(words) <= max_words
                    and not any(len(w) > 1 and w.strip(",;:.!?'-").isupper() for w in words)
                ):
                    found.add(sentence)
    return sorted(found)


def perturbed_voice(voice: str, factor: float) -> str:
    """The voice name of ``voice``'s utterances played ``factor`` times as fast: ``rms-sp90`` for 0.9."""
    check_speed(factor)
    return f"{voice}-sp{round(factor * 100)}"


def with_speeds(voices: Sequence[str], speeds: Sequence[float]) -> tuple[str, ...]:
    """``voices``, then their copies at each speed in turn: ``rms slt rms-sp90 slt-sp90 rms-sp110 slt-sp110``."""
    return (*voices, *(perturbed_voice(v, f) for f in speeds for v in voices))


def is_perturbed(voice: str) -> bool:
    """Whether ``voice`` names speed-perturbed copies (`perturbed_voice`)."""
    return bool(_PERTURBED.search(voice))


def check_speed(factor: float) -> None:
    if not (math.isfinite(factor) and 0.5 <= factor <= 2.0 and round(factor * 100) != 100):
        raise ValueError(f"speed factor {factor}: want a number in 0.5..2.0 other than 1 (0.9, 1.1 for Kaldi's)")


def change_speed(audio, factor: float):
    """``audio`` played ``factor`` times as fast at the same sample rate (polyphase resampling by 100 / 100 f)."""
    from scipy.signal import resample_poly

    return resample_poly(audio, 100, round(factor * 100)).astype(audio.dtype)


def heldout(text: str, fraction: float) -> bool:
    """Whether a sentence is held out: its hash, not its position, so adding sentences moves none."""
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64 < fraction


def speak(text: str, voice: str, path: Path) -> float:
    """Say ``text`` with flite's ``voice`` into ``path`` (FLAC, 16 kHz mono); returns the seconds of audio."""
    import soundfile as sf

    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "say.wav"
        subprocess.run(["flite", "-voice", voice, "-t", text, "-o", str(wav)], check=True, capture_output=True)
        audio, rate = sf.read(wav, dtype="int16")
    if rate != SAMPLE_RATE or audio.ndim != 1:
        raise RuntimeError(f"flite voice {voice!r} gave {rate} Hz with shape {audio.shape}; expected 16 kHz mono")
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, audio, SAMPLE_RATE, format="FLAC")
    return len(audio) / SAMPLE_RATE


def check_flite(voices: Sequence[str]) -> None:
    """Fail early, naming what is missing: the ``flite`` program or one of ``voices``."""
    if shutil.which("flite") is None:
        raise FileNotFoundError("flite is not installed: install Debian's flite (bash scripts/setup.sh does)")
    listed = subprocess.run(["flite", "-lv"], check=True, capture_output=True, text=True).stdout.split(":")[-1]
    missing = sorted(set(voices) - set(listed.split()))
    if missing:
        raise ValueError(f"flite has no voice {missing}; it lists {listed.split()}")


def build_corpus(
    out: str | Path,
    *,
    sentences: int = 6000,
    voices: Sequence[str] = VOICES,
    heldout_fraction: float = 0.05,
    min_seconds: float = 1.0,
    max_seconds: float = 4.0,
    seed: int = 0,
    jobs: int = 2,
    source: Path = FORTUNES,
    log=print,
) -> Path:
    """Write the corpus (module docstring) under ``out``: ``sentences`` sentences, each spoken by every voice."""
    out = Path(out)
    check_flite(voices)
    texts = candidate_sentences(source)
    random.Random(seed).shuffle(texts)
    if sentences > len(texts):
        raise ValueError(
            f"sentences={sentences}: the fortune files under {source} hold only {len(texts)} that pass the filters "
            "(Debian's fortunes holds 8,561, fortunes-min alone 510: bash scripts/setup.sh installs fortunes)"
        )
    texts = texts[:sentences]
    jobs_list = [(i, text, voice) for i, text in enumerate(texts) for voice in voices]
    start = time.monotonic()

    def one(job: tuple[int, str, str]) -> Utterance | None:
        i, text, voice = job
        relative = Path("wav") / voice / f"{i:05d}.flac"
        seconds = speak(text, voice, out / relative)
        if not min_seconds <= seconds <= max_seconds:
            (out / relative).unlink()
            return None
        split = SPLITS[1] if heldout(text, heldout_fraction) else SPLITS[0]
        return Utterance(f"{i:05d}", text, voice, split, str(relative), round(seconds, 4))

    kept = _kept(one, jobs_list, jobs, "spoken", 500, log)
    write_manifest(out, kept)
    summary = {
        "source": str(source),
        "voices": list(voices),
        "sentences": sentences,
        "seed": seed,
        "heldout_fraction": heldout_fraction,
        "seconds": [min_seconds, max_seconds],
        "utterances": {v: {s: sum(u.voice == v and u.split == s for u in kept) for s in SPLITS} for v in voices},
        "hours": round(sum(u.seconds for u in kept) / 3600, 3),
        "build_seconds": round(time.monotonic() - start, 1),
    }
    (out / "corpus.json").write_text(json.dumps(summary, indent=1) + "\n")
    return out


def perturb_speed(
    root: str | Path,
    factors: Sequence[float],
    *,
    min_seconds: float = 1.0,
    max_seconds: float = 4.0,
    jobs: int = 2,
    log=print,
) -> list[Utterance]:
    """Add to the corpus at ``root`` a speed-perturbed copy (module docstring) of every utterance of its voices at
    each of ``factors``, kept when ``min_seconds``..``max_seconds`` long; voices already there are left as they are.
    Returns the utterances added; the manifest and ``corpus.json`` list them."""
    import soundfile as sf

    root = Path(root)
    for factor in factors:
        check_speed(factor)
    rows = read_manifest(root)
    held = {u.voice for u in rows}
    sources = [u for u in rows if not is_perturbed(u.voice)]
    jobs_list = [(u, factor) for factor in factors for u in sources if perturbed_voice(u.voice, factor) not in held]

    def one(job: tuple[Utterance, float]) -> Utterance | None:
        source, factor = job
        voice = perturbed_voice(source.voice, factor)
        audio = change_speed(load_audio(root, source), factor)
        seconds = len(audio) / SAMPLE_RATE
        if not min_seconds <= seconds <= max_seconds:
            return None
        relative = Path("wav") / voice / f"{source.id}.flac"
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        sf.write(root / relative, audio, SAMPLE_RATE, format="FLAC")
        return Utterance(source.id, source.text, voice, source.split, str(relative), round(seconds, 4))

    added = _kept(one, jobs_list, jobs, "sped up or slowed down", 2000, log)
    write_manifest(root, rows + added)
    summary_path = root / "corpus.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    summary["speeds"] = sorted({*summary.get("speeds", []), *factors})
    counts = summary.setdefault("utterances", {})
    for u in added:
        counts.setdefault(u.voice, {s: 0 for s in SPLITS})[u.split] += 1
    summary["hours"] = round(sum(u.seconds for u in rows + added) / 3600, 3)
    summary_path.write_text(json.dumps(summary, indent=1) + "\n")
    return added


def _kept(one, jobs_list: list, jobs: int, done: str, every: int, log) -> list[Utterance]:
    """``one(job)`` of every job on ``jobs`` threads, in order: the utterances it kept (not None), with progress."""
    kept: list[Utterance] = []
    start = time.monotonic()
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        for n, utterance in enumerate(pool.map(one, jobs_list), 1):
            if utterance is not None:
                kept.append(utterance)
            if n % every == 0 or n == len(jobs_list):
                elapsed = time.monotonic() - start
                log(f"[corpus] {n}/{len(jobs_list)} utterances {done}, {len(kept)} kept, {elapsed:.0f}s")
    return kept


def write_manifest(root: Path, utterances: Iterable[Utterance]) -> Path:
    path = Path(root) / MANIFEST
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for u in utterances:
            f.write(json.dumps(asdict(u)) + "\n")
    return path


def read_manifest(root: str | Path, voice: str | None = None, split: str | None = None) -> list[Utterance]:
    """The corpus's utterances, optionally of one voice and one split (``ValueError`` naming a missing file)."""
    path = Path(root) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{root} is not a corpus: it lacks {MANIFEST} (build one with maspo-verl corpus)")
    rows = [Utterance(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
    return [u for u in rows if (voice is None or u.voice == voice) and (split is None or u.split == split)]


def load_audio(root: str | Path, utterance: Utterance):
    """The utterance's waveform, float32 at 16 kHz."""
    import soundfile as sf

    audio, rate = sf.read(Path(root) / utterance.audio, dtype="float32")
    if rate != SAMPLE_RATE:
        raise ValueError(f"{utterance.audio}: {rate} Hz, the corpus is {SAMPLE_RATE} Hz")
    return audio
