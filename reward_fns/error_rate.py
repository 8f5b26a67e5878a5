"""Character/word error rate with jiwer, on the units of `text_norm.scoring_units`.

    ER = (S + D + I) / N

with S, D, I the substitutions, deletions and insertions of a minimum edit alignment and N the number of reference
units. For a reward ER is clipped to [0, 1]; the raw value (which can exceed 1 with insertions) is kept alongside.
An empty transcript against a non-empty reference is N deletions: ER = 1, never 0.

Units (``unit``): ``language`` is Seed-TTS-eval's choice, characters for Chinese (and Japanese, Cantonese), words
otherwise; ``char`` counts characters in every language: for a language scored by words, the characters of its
normalised words joined by single spaces (a space is a character), which gives a small model partial credit for a
word it almost says.
"""

from __future__ import annotations

from dataclasses import dataclass

import jiwer

from reward_fns.text_norm import CHARACTER_LANGUAGES, base_language, scoring_units

ERROR_UNITS = ("language", "char")
_SPACE = "\u2581"  # a space as a unit of its own: jiwer splits on whitespace


@dataclass(frozen=True)
class ErrorRate:
    value: float  # clipped to [0, 1]
    raw: float  # (S + D + I) / N, unclipped
    ref_units: int  # N
    hyp_units: int
    unit: str  # "char" or "word"
    language_units: int  # the reference's units in its language's own unit (for the speech rate)


def error_rate(reference: str, hypothesis: str, lang: str, unit: str = "language") -> ErrorRate:
    """The error rate of ``hypothesis`` against ``reference`` in ``unit`` (module docstring), Seed-TTS-eval
    normalised.

    Raises ``ValueError`` when the reference normalises to nothing (nothing to score against).
    """
    if unit not in ERROR_UNITS:
        raise ValueError(f"unit={unit!r}; valid: {list(ERROR_UNITS)}")
    by_language = "char" if base_language(lang) in CHARACTER_LANGUAGES else "word"
    ref, hyp = scoring_units(reference, lang), scoring_units(hypothesis, lang)
    language_units = len(ref)
    unit = by_language if unit == "language" else unit
    if unit == "char" and by_language == "word":
        ref, hyp = ([_SPACE if c == " " else c for c in " ".join(words)] for words in (ref, hyp))
    if not ref:
        raise ValueError(f"reference text {reference!r} is empty after normalisation: nothing to score against")
    if not hyp:
        raw = 1.0
    else:
        out = jiwer.process_words(" ".join(ref), " ".join(hyp))
        raw = (out.substitutions + out.deletions + out.insertions) / len(ref)
    return ErrorRate(
        value=min(max(raw, 0.0), 1.0),
        raw=raw,
        ref_units=len(ref),
        hyp_units=len(hyp),
        unit=unit,
        language_units=language_units,
    )
