"""The speech reward: intelligibility, optional speaker similarity and duration sanity, as one score.

For a response with error rate ER (CER for Chinese, WER otherwise; `error_rate`), speaker similarity ``sim`` to the
prompt audio and speech rate ``rho`` (reference units per second of decoded audio):

    r_int = 1 - tanh(alpha * ER)                                 alpha = cer_scale (3, CosyVoice2 / Llasa GRPO recipes)
    r_sim = max(sim, 0) if ER <= similarity_max_error else 0     similarity counts only for intelligible speech
    r_dur = 1                                   if lo <= rho <= hi
            exp(-duration_sharpness * |ln(rho / bound)|)  otherwise, bound the violated one of (lo, hi)
    score = (w_int * r_int + w_sim * r_sim + w_dur * r_dur) / (w_int + w_sim + w_dur)

The defaults (w_int = 1, the others 0) give ``score = 1 - tanh(3 * ER)``. A response the gate rejects (truncated,
no speech, stray text, codes out of range) or that fails in decoding or recognition scores ``invalid_score``, and
its ``speech_reason`` says why.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

from maspo_verl import settings
from maspo_verl.settings import InvalidSetting

from .text_norm import CHARACTER_LANGUAGES, base_language

DEFAULT_RATE_BOUNDS = {"char": (2.0, 9.0), "word": (1.0, 4.5)}
"""Plausible speech rates: Chinese characters per second, words per second elsewhere (read speech is ~4-5 and ~2.5)."""


@dataclass
class RewardConfig:
    """Every knob of the reward; `from_dict` rejects unknown keys, wrong types and NaN/inf naming the key."""

    cer_scale: float = 3.0
    w_intelligibility: float = 1.0
    w_similarity: float = 0.0
    w_duration: float = 0.0
    similarity_max_error: float = 0.3
    rate_bounds: dict[str, tuple[float, float]] = field(default_factory=lambda: dict(DEFAULT_RATE_BOUNDS))
    duration_sharpness: float = 2.0
    invalid_score: float = 0.0
    frame_errors: bool = False
    """Also report where the recogniser heard errors, per codec frame (the ``frame_errors`` extra that
    ``adv_estimator=maspo`` reads; `reward_fns.alignment`). Whisper then transcribes one waveform at a time."""

    def __post_init__(self) -> None:
        self.rate_bounds = {**DEFAULT_RATE_BOUNDS, **{k: tuple(v) for k, v in self.rate_bounds.items()}}
        settings.validate(self, "reward_config")

    def validate(self) -> None:
        """Ranges; every number finite (also when built directly rather than through `from_dict`)."""
        numbers = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "rate_bounds"}
        for name, value in numbers.items():
            if not math.isfinite(value):
                raise InvalidSetting(name, f"{name} must be a finite number, got {value!r}")
        weights = {f: numbers[f] for f in ("w_intelligibility", "w_similarity", "w_duration")}
        if any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
            raise InvalidSetting("", f"reward weights must be >= 0 with a positive sum, got {weights}")
        if self.cer_scale <= 0:
            raise InvalidSetting("cer_scale", f"cer_scale must be > 0, got {self.cer_scale}")
        for unit, bounds in self.rate_bounds.items():
            ok = unit in DEFAULT_RATE_BOUNDS and len(bounds) == 2 and all(math.isfinite(b) for b in bounds)
            if not ok or not 0 < bounds[0] < bounds[1]:
                raise InvalidSetting(
                    "rate_bounds", f"rate_bounds[{unit!r}]={bounds}: keys are 'char'/'word', need finite 0 < lo < hi"
                )

    @classmethod
    def from_dict(cls, values: dict | None) -> RewardConfig:
        """From a plain mapping (``reward_kwargs.reward_config``, ``--reward-config``), checked by `settings.build`."""
        return settings.build(cls, values, "reward_config")

    def to_dict(self) -> dict:
        return asdict(self)


def intelligibility(error: float, cer_scale: float) -> float:
    """``1 - tanh(cer_scale * ER)``: 1 for a perfect transcript, 0.005 at ER = 1 with the default scale."""
    return 1.0 - math.tanh(cer_scale * error)


def duration_score(rate: float, bounds: tuple[float, float], sharpness: float) -> float:
    """1 inside ``bounds``; decays as ``exp(-sharpness * |ln(rate / bound)|)`` outside."""
    lo, hi = bounds
    if rate <= 0:
        return 0.0
    if rate < lo:
        return math.exp(-sharpness * math.log(lo / rate))
    if rate > hi:
        return math.exp(-sharpness * math.log(rate / hi))
    return 1.0


def compose(
    config: RewardConfig,
    error: float,
    duration_s: float,
    ref_units: int,
    lang: str,
    similarity: float | None = None,
) -> dict[str, float]:
    """The score and its components (``speech_*`` keys) for one recognised response."""
    unit = "char" if base_language(lang) in CHARACTER_LANGUAGES else "word"
    rate = ref_units / duration_s if duration_s > 0 else 0.0
    r_int = intelligibility(error, config.cer_scale)
    r_dur = duration_score(rate, config.rate_bounds[unit], config.duration_sharpness)
    r_sim = max(similarity, 0.0) if similarity is not None and error <= config.similarity_max_error else 0.0
    total = config.w_intelligibility + config.w_similarity + config.w_duration
    score = (config.w_intelligibility * r_int + config.w_similarity * r_sim + config.w_duration * r_dur) / total
    out = {
        "score": score,
        "speech_intelligibility": r_int,
        "speech_rate": rate,
        "speech_duration_score": r_dur,
    }
    if similarity is not None:
        out["speech_similarity"] = similarity
        out["speech_similarity_counted"] = r_sim
    return out
