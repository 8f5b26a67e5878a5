"""Character/word error rate with jiwer, on the units of `text_norm.scoring_units`.

    ER = (S + D + I) / N

with S, D, I the substitutions, deletions and insertions of a minimum edit alignment and N the number of reference
units. For a reward ER is clipped to [0, 1]; the raw value (which can exceed 1 with insertions) is kept alongside.
An empty transcript against a non-empty reference is N deletions: ER = 1, never 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import jiwer

from .text_norm import CHARACTER_LANGUAGES, base_language, scoring_units


@dataclass(frozen=True)
class ErrorRate:
    value: float  # clipped to [0, 1]
    raw: float  # (S + D + I) / N, unclipped
    ref_units: int  # N
    hyp_units: int
    unit: str  # "char" or "word"


def error_rate(reference: str, hypothesis: str, lang: str) -> ErrorRate:
    """CER (Chinese) or WER (other languages) of ``hypothesis`` against ``reference``, Seed-TTS-eval normalised.

    Raises ``ValueError`` when the reference normalises to nothing (nothing to score against).
    """
    unit = "char" if base_language(lang) in CHARACTER_LANGUAGES else "word"
    ref, hyp = scoring_units(reference, lang), scoring_units(hypothesis, lang)
    if not ref:
        raise ValueError(f"reference text {reference!r} is empty after normalisation: nothing to score against")
    if not hyp:
        raw = 1.0
    else:
        out = jiwer.process_words(" ".join(ref), " ".join(hyp))
        raw = (out.substitutions + out.deletions + out.insertions) / len(ref)
    return ErrorRate(value=min(max(raw, 0.0), 1.0), raw=raw, ref_units=len(ref), hyp_units=len(hyp), unit=unit)
