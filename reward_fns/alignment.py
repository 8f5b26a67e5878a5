"""Where the recogniser heard errors: timestamped transcript + reference -> one error value per codec frame.

Input: the recogniser's words (or Paraformer's characters) with their times, the reference text, the language and
the number of codec frames of the response (XCodec2: `FRAMES_PER_SECOND` = 50, frame k covers
``[k / 50, (k + 1) / 50)`` s of the decoded audio and is response code k).

1. Each timed word is normalised exactly as the score normalises text (`text_norm.scoring_units`): it becomes zero
   or more scoring units (lower-cased words; characters for Chinese), each with the word's time span.
2. Reference units and these hypothesis units are aligned with jiwer (the alignment the error rate counts).
3. Frames of substituted and inserted hypothesis units are errors: every frame overlapping ``[start, end)``.
   A deleted reference unit marks the place it is missing: the frames from the last frame of the hypothesis unit
   before it to the first frame of the one after it (from frame 0, or to the last frame, at either end; every frame
   when nothing was recognised).

No timestamps (a backend without them, or a failed recognition) means no alignment: `NO_ALIGNMENT` on the wire.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

import jiwer

from .text_norm import scoring_units

_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_PARAFORMER_TOKEN = re.compile(f"[{_CJK}]|[^\\s{_CJK}]+")

FRAMES_PER_SECOND = 50
"""XCodec2 codec frames per second of audio (16 kHz, hop 320)."""


class TimedWord(NamedTuple):
    """A recognised word (or character) and its span in seconds."""

    text: str
    start: float
    end: float


def timed_units(words: Sequence[TimedWord], lang: str) -> list[TimedWord]:
    """Scoring units of the timed words (step 1), each with its word's span."""
    return [TimedWord(unit, w.start, w.end) for w in words for unit in scoring_units(w.text, lang)]


def _frames_of(start: float, end: float, n_frames: int) -> range:
    first = max(0, min(n_frames - 1, math.floor(start * FRAMES_PER_SECOND)))
    last = max(first, min(n_frames - 1, math.ceil(end * FRAMES_PER_SECOND) - 1))
    return range(first, last + 1)


def frame_errors_from_words(reference: str, words: Sequence[TimedWord], lang: str, n_frames: int) -> list[float]:
    """One value per codec frame, 1 where the recogniser heard an error (module docstring, steps 1-3)."""
    errors = [0.0] * n_frames
    if n_frames == 0:
        return errors
    ref = scoring_units(reference, lang)
    hyp = timed_units(words, lang)
    if not hyp:
        return [1.0] * n_frames
    if not ref:
        ops = [("insert", 0, 0, 0, len(hyp))]
    else:
        alignment = jiwer.process_words(" ".join(ref), " ".join(u.text for u in hyp)).alignments[0]
        ops = [(c.type, c.ref_start_idx, c.ref_end_idx, c.hyp_start_idx, c.hyp_end_idx) for c in alignment]
    for kind, _, _, hyp_start, hyp_end in ops:
        if kind in ("substitute", "insert"):
            for unit in hyp[hyp_start:hyp_end]:
                for k in _frames_of(unit.start, unit.end, n_frames):
                    errors[k] = 1.0
        elif kind == "delete":
            before = hyp[hyp_start - 1] if hyp_start > 0 else None
            after = hyp[hyp_start] if hyp_start < len(hyp) else None
            first = _frames_of(before.start, before.end, n_frames)[-1] if before else 0
            last = _frames_of(after.start, after.end, n_frames)[0] if after else n_frames - 1
            for k in range(min(first, last), max(first, last) + 1):
                errors[k] = 1.0
    return errors


def paraformer_words(result: dict[str, Any]) -> list[TimedWord] | None:
    """FunASR Paraformer's ``generate(..., output_timestamp=True)`` result -> timed tokens; None without timestamps.

    The result's ``text`` holds the tokens (Chinese characters space-separated or joined, English subwords joined
    into words) and ``timestamp`` one ``[start_ms, end_ms]`` per token. Each CJK character is a token, other text
    splits at whitespace; a count that does not match the timestamps is no alignment."""
    stamps = result.get("timestamp")
    text = result.get("text", "")
    if not isinstance(stamps, list | tuple) or not stamps:
        return None
    tokens = _PARAFORMER_TOKEN.findall(text)
    if len(tokens) != len(stamps):
        return None
    return [TimedWord(tok, float(s) / 1000.0, float(e) / 1000.0) for tok, (s, e) in zip(tokens, stamps)]


def whisper_words(segments: Any) -> list[TimedWord]:
    """faster-whisper segments from ``transcribe(..., word_timestamps=True)`` -> timed words."""
    return [TimedWord(w.word.strip(), float(w.start), float(w.end)) for s in segments for w in (s.words or [])]
