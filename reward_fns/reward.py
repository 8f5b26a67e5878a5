"""The speech reward: intelligibility, optional speaker similarity, duration sanity and sound quality, as one score.

For a response with error rate ER (CER for Chinese, WER otherwise, or CER always with ``error_unit="char"``;
`error_rate`), the recogniser's likelihood of the
reference ``asr_nll`` (`likelihood`), speaker similarity ``sim`` to the prompt audio, speech rate ``rho`` (reference
units per second of decoded audio) and DNSMOS overall quality ``mos`` in [1, 5] (`quality`):

    u_c   = 1 - tanh(alpha * ER)                                 alpha = cer_scale (3, CosyVoice2 / Llasa GRPO recipes)
    u_n   = exp(-asr_nll / nll_scale)                            nll_scale 3 (the anchors' t_n)
    r_int = u_c                                                  intelligibility = "error_rate" (default)
            clip((lc + ln) / (lc / u_c + ln / u_n), 0, 1)        intelligibility = "anchors": the TTS-RL anchors'
                                                                 weighted harmonic mean (0 when u_c or u_n is 0)
            u_n                                                  intelligibility = "likelihood"
    r_q   = clip((mos - 1) / 4, 0, 1)
    r_sim = max(sim, 0) if ER <= similarity_max_error else 0     similarity counts only for intelligible speech
    r_dur = 1                                   if lo <= rho <= hi
            exp(-duration_sharpness * |ln(rho / bound)|)  otherwise, bound the violated one of (lo, hi)
    score = (w_int * r_int + w_sim * r_sim + w_dur * r_dur + w_q * r_q) / (w_int + w_sim + w_dur + w_q)

With ``recogniser="ear"`` the code ear reads the codes instead (`reward_fns.ear_scoring`): ER is its phoneme error
rate and ``asr_nll`` its CTC likelihood of the text's phonemes, per phoneme; the rest is the same.

The defaults (w_int = 1, the others 0) give ``score = 1 - tanh(3 * ER)``; ``intelligibility="anchors"`` with the
defaults gives the anchors' reward exactly (lc 0.6, ln 0.4, bc = cer_scale 3, tn = nll_scale 3). A response the gate
rejects (truncated, no speech, stray text, codes out of range), that fails in decoding, recognition or likelihood,
or whose transcript is empty scores ``invalid_score`` with every part at its worst, and its ``speech_reason`` says
why: silence never earns an error rate of 0.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Literal, get_args, get_type_hints

from maspo_base import typed_settings
from maspo_base.typed_settings import InvalidSetting
from reward_fns.likelihood import likelihood_utility
from reward_fns.text_norm import CHARACTER_LANGUAGES, base_language

REWARD_WEIGHTS = ("w_intelligibility", "w_similarity", "w_duration", "w_quality")

DEFAULT_RATE_BOUNDS = {"char": (2.0, 9.0), "word": (1.0, 4.5)}
"""Plausible speech rates: Chinese characters per second, words per second elsewhere (read speech is ~4-5 and ~2.5)."""


@dataclass
class RewardConfig:
    """Every knob of the reward; `from_dict` rejects unknown keys, wrong types and NaN/inf naming the key."""

    cer_scale: float = 3.0
    error_unit: Literal["language", "char"] = "language"
    """What ER counts (`reward_fns.error_rate`): ``language`` is Seed-TTS-eval's (CER for Chinese, WER otherwise);
    ``char`` is CER in every language."""
    w_intelligibility: float = 1.0
    w_similarity: float = 0.0
    w_duration: float = 0.0
    w_quality: float = 0.0
    """Weight of the DNSMOS quality part ``r_q`` (needs the ``quality`` backend of the reward's settings)."""
    intelligibility: Literal["error_rate", "anchors", "likelihood"] = "error_rate"
    """``error_rate``: ``r_int = u_c``; ``anchors``: the anchors' harmonic mean of ``u_c`` and ``u_n``;
    ``likelihood``: ``r_int = u_n`` (both need a likelihood: a ``likelihood`` model for every language scored, or
    the code ear's, which gives one for every response)."""
    recogniser: Literal["audio", "ear"] = "audio"
    """What hears a response for its score: ``audio``, the codec decodes it and the ASR transcribes it (ER: CER or
    WER, ``asr_nll``: Whisper's); ``ear``, the code ear reads its codes (ER: the phoneme error rate, ``asr_nll``:
    the ear's CTC likelihood per phoneme; `reward_fns.ear_scoring`), no audio decoded."""
    anchor_error_weight: float = 0.6
    """lc of the anchors' harmonic mean."""
    anchor_likelihood_weight: float = 0.4
    """ln of the anchors' harmonic mean."""
    nll_scale: float = 3.0
    """tn: ``u_n = exp(-asr_nll / nll_scale)``."""
    similarity_max_error: float = 0.3
    rate_bounds: dict[str, tuple[float, float]] = field(default_factory=lambda: dict(DEFAULT_RATE_BOUNDS))
    duration_sharpness: float = 2.0
    invalid_score: float = 0.0
    frame_errors: bool = False
    """Also report where the recogniser heard errors, per codec frame (the ``frame_errors`` extra that
    ``adv_estimator=maspo`` reads with ``credit_source=errors``; `reward_fns.alignment`). Whisper then transcribes
    one waveform at a time."""
    frame_likelihood: bool = False
    """Also report, per codec frame, ``1 - p(word)`` of the reference word aligned there (the ``frame_likelihood``
    extra that ``adv_estimator=maspo`` reads with ``credit_source=likelihood``; `reward_fns.likelihood`)."""
    frame_words: bool = False
    """Also report which word the recogniser heard at each codec frame (the ``frame_words`` extra that the
    ``heard_words`` segmenter reads; `reward_fns.alignment.frame_words_from_words`). Whisper then transcribes one
    waveform at a time, as for ``frame_errors``."""

    def __post_init__(self) -> None:
        self.rate_bounds = {**DEFAULT_RATE_BOUNDS, **{k: tuple(v) for k, v in self.rate_bounds.items()}}
        typed_settings.validate(self, "reward_config")

    def validate(self) -> None:
        """Ranges; every number finite; the choices valid (also when built directly rather than through `from_dict`)."""
        hints = get_type_hints(type(self))
        for name in ("error_unit", "intelligibility", "recogniser"):
            valid = get_args(hints[name])
            if getattr(self, name) not in valid:
                raise InvalidSetting(name, f"{name}={getattr(self, name)!r} is not valid; valid values: {list(valid)}")
        numbers = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("rate_bounds", "intelligibility", "error_unit", "recogniser")
        }
        for name, value in numbers.items():
            if not math.isfinite(value):
                raise InvalidSetting(name, f"{name} must be a finite number, got {value!r}")
        weights = {f: numbers[f] for f in REWARD_WEIGHTS}
        for name, value in weights.items():
            if value < 0:
                raise InvalidSetting(name, f"{name} must be >= 0, got {value}")
        if sum(weights.values()) <= 0:
            raise InvalidSetting("", f"reward weights must be >= 0 with a positive sum, got {weights}")
        for name in ("cer_scale", "nll_scale"):
            if getattr(self, name) <= 0:
                raise InvalidSetting(name, f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("anchor_error_weight", "anchor_likelihood_weight"):
            if getattr(self, name) < 0:
                raise InvalidSetting(name, f"{name} must be >= 0, got {getattr(self, name)}")
        if self.anchor_error_weight + self.anchor_likelihood_weight <= 0:
            raise InvalidSetting("anchor_error_weight", "anchor_error_weight + anchor_likelihood_weight must be > 0")
        for unit, bounds in self.rate_bounds.items():
            ok = unit in DEFAULT_RATE_BOUNDS and len(bounds) == 2 and all(math.isfinite(b) for b in bounds)
            if not ok or not 0 < bounds[0] < bounds[1]:
                raise InvalidSetting(
                    "rate_bounds", f"rate_bounds[{unit!r}]={bounds}: keys are 'char'/'word', need finite 0 < lo < hi"
                )

    @classmethod
    def from_dict(cls, values: dict | None) -> RewardConfig:
        """From a plain mapping (``reward_kwargs.reward_config``, ``--reward-config``), checked by
        `typed_settings.build`."""
        return typed_settings.build(cls, values, "reward_config")

    def to_dict(self) -> dict:
        return asdict(self)


def intelligibility(error: float, cer_scale: float) -> float:
    """``1 - tanh(cer_scale * ER)``: 1 for a perfect transcript, 0.005 at ER = 1 with the default scale."""
    return 1.0 - math.tanh(cer_scale * error)


def anchors_composite(u_c: float, u_n: float, lc: float = 0.6, ln: float = 0.4) -> float:
    """The anchors' weighted harmonic mean ``(lc + ln) / (lc / u_c + ln / u_n)`` clipped to [0, 1]; 0 when a
    utility with positive weight is 0 (its limit)."""
    if (lc > 0 and u_c <= 0) or (ln > 0 and u_n <= 0):
        return 0.0
    denominator = (lc / u_c if lc > 0 else 0.0) + (ln / u_n if ln > 0 else 0.0)
    return min(max((lc + ln) / denominator, 0.0), 1.0)


def quality_score(mos: float) -> float:
    """``r_q = clip((mos - 1) / 4, 0, 1)``: DNSMOS's 1-5 scale onto [0, 1]."""
    return min(max((mos - 1.0) / 4.0, 0.0), 1.0)


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
    asr_nll: float | None = None,
    quality: float | None = None,
) -> dict[str, float]:
    """The score and its components (``speech_*`` keys) for one recognised response (module docstring).

    ``asr_nll`` is required with ``intelligibility="anchors"``, ``quality`` (DNSMOS OVRL) with ``w_quality > 0``."""
    unit = "char" if base_language(lang) in CHARACTER_LANGUAGES else "word"
    rate = ref_units / duration_s if duration_s > 0 else 0.0
    u_c = intelligibility(error, config.cer_scale)
    u_n = None if asr_nll is None else likelihood_utility(asr_nll, config.nll_scale)
    if config.intelligibility in ("anchors", "likelihood") and u_n is None:
        raise ValueError(f"intelligibility={config.intelligibility!r} needs asr_nll (configure a likelihood model)")
    if config.intelligibility == "anchors":
        r_int = anchors_composite(u_c, u_n, config.anchor_error_weight, config.anchor_likelihood_weight)
    elif config.intelligibility == "likelihood":
        r_int = u_n
    else:
        r_int = u_c
    if config.w_quality > 0 and quality is None:
        raise ValueError("w_quality > 0 needs the quality score (configure a quality backend)")
    r_q = quality_score(quality) if quality is not None else 0.0
    r_dur = duration_score(rate, config.rate_bounds[unit], config.duration_sharpness)
    r_sim = max(similarity, 0.0) if similarity is not None and error <= config.similarity_max_error else 0.0
    parts = {"w_intelligibility": r_int, "w_similarity": r_sim, "w_duration": r_dur, "w_quality": r_q}
    total = sum(getattr(config, w) for w in REWARD_WEIGHTS)
    score = sum(getattr(config, w) * parts[w] for w in REWARD_WEIGHTS) / total
    out = {
        "score": score,
        "speech_intelligibility": r_int,
        "speech_error_utility": u_c,
        "speech_rate": rate,
        "speech_duration_score": r_dur,
    }
    if similarity is not None:
        out["speech_similarity"] = similarity
        out["speech_similarity_counted"] = r_sim
    if asr_nll is not None:
        out["speech_asr_nll"] = asr_nll
        out["speech_likelihood_utility"] = u_n
    if quality is not None:
        out["speech_quality_mos"] = quality
        out["speech_quality"] = r_q
    return out
