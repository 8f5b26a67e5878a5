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

The same timed words also say which word was heard where (`frame_words_from_words`, the ``frame_words`` signal of
`maspo_base.frame_words`): per frame, the index of the heard word covering it, -1 where none does.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

import jiwer

from maspo_base.frame_words import UNHEARD
from reward_fns.text_norm import scoring_units

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


_BOUNDARY_TOLERANCE = 1e-6
"""In frames: a span edge this close to a frame boundary lies on it (0.34 s * 50 is 17.000000000000004)."""


def _word_frame_range(start: float, end: float, n_frames: int) -> tuple[float, float, range]:
    """The span in frame units and the frames it overlaps (at least the one holding its start), clamped."""
    a, b = start * FRAMES_PER_SECOND, end * FRAMES_PER_SECOND
    first = max(0, min(n_frames - 1, math.floor(a + _BOUNDARY_TOLERANCE)))
    last = max(first, min(n_frames - 1, math.ceil(b - _BOUNDARY_TOLERANCE) - 1))
    return a, b, range(first, last + 1)


def _frames_of(start: float, end: float, n_frames: int) -> range:
    """The frames a span ``[start, end)`` s overlaps (`_word_frame_range`)."""
    return _word_frame_range(start, end, n_frames)[2]


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


def frame_words_from_words(words: Sequence[TimedWord], lang: str, n_frames: int) -> list[int]:
    """Per codec frame, the index in ``words`` of the heard word covering it; -1 (`UNHEARD`) where none does.

    A heard word is a timed word with at least one scoring unit (`text_norm.scoring_units`, as the score normalises:
    punctuation alone is no word). It covers the frames its span ``[start, end)`` overlaps, at least the frame
    holding its start (a zero-length word), clamped to the response's frames; a span edge within
    `_BOUNDARY_TOLERANCE` of a frame boundary lies on it, so adjacent words ending and starting at one time share no
    frame. Overlaps: a frame covered by several words (overlapping timestamps, or a boundary inside the frame) goes
    to the word that covers the larger part of its 20 ms, the earlier in ``words`` on a tie; a word left with no
    frame has none (its index then appears nowhere). No words (nothing heard): every frame -1.
    """
    owner = [UNHEARD] * n_frames
    cover = [0.0] * n_frames
    if n_frames == 0:
        return owner
    for index, word in enumerate(words):
        if not scoring_units(word.text, lang):
            continue
        a, b, frames = _word_frame_range(word.start, word.end, n_frames)
        for k in frames:
            part = max(0.0, min(b, k + 1) - max(a, k))
            if owner[k] == UNHEARD or part > cover[k]:
                owner[k], cover[k] = index, part
    return owner


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
    """faster-whisper segments from ``transcribe(..., word_timestamps=True)`` (long-form audio) -> timed words."""
    return [TimedWord(w.word.strip(), float(w.start), float(w.end)) for s in segments for w in (s.words or [])]


WHISPER_PREPEND_PUNCTUATION = "\"'“¿([{-"
WHISPER_APPEND_PUNCTUATION = "\"'.。,，!！?？:：”)]}、"
"""faster-whisper's ``transcribe`` defaults: punctuation joined to the word after / before it."""

UNSPACED_LANGUAGES = frozenset({"zh", "ja", "th", "lo", "my", "yue"})
"""Languages whose Whisper words are split at unicode characters, not spaces (faster-whisper's tokenizer)."""


def aligned_words(alignment: Sequence[dict[str, Any]], language: str = "en") -> list[TimedWord]:
    """faster-whisper's ``find_alignment`` of one transcript (``{"word", "tokens", "start", "end", ...}`` per word,
    seconds from the start of the audio) -> timed words, one per word of the transcript as it is spelt.

    ``find_alignment`` starts a new word at a space and at every punctuation token, so "morning." comes as "morning"
    and ".", and "Psych-Sef" as "Psych" and "-Sef". Punctuation is first joined to its neighbour as faster-whisper's
    ``transcribe(word_timestamps=True)`` does (``merge_punctuations`` with its default sets; the word keeps its own
    span); then, in a spaced language, a word that does not start with a space continues the one before it (the
    span grows to its end). So the timed words are the transcript split at spaces and normalise to the transcript's
    scoring units, whichever punctuation Whisper wrote. Blank words are dropped."""
    from faster_whisper.transcribe import merge_punctuations

    merged = [dict(w, tokens=list(w.get("tokens", []))) for w in alignment]
    merge_punctuations(merged, WHISPER_PREPEND_PUNCTUATION, WHISPER_APPEND_PUNCTUATION)
    words: list[dict[str, Any]] = []
    for w in merged:
        if not w["word"]:
            continue
        if words and language not in UNSPACED_LANGUAGES and not w["word"][0].isspace():
            words[-1] = dict(words[-1], word=words[-1]["word"] + w["word"], end=w["end"])
        else:
            words.append(w)
    return [TimedWord(w["word"].strip(), float(w["start"]), float(w["end"])) for w in words if w["word"].strip()]
