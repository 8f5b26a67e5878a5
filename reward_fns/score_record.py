"""What the reward reads and writes per sample: a request's fields checked (`ScoreRequest`), the keys every result
carries (`RecordShape`), the record of a sample that could not be scored (`unscored_record`, with its reason from
`FAILURE_REASONS`), and `per_item`, which runs a batched stage and retries it sample by sample when it fails.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from maspo_base.frame_errors import CREDIT_SOURCE_KEYS, NO_ALIGNMENT
from maspo_base.frame_words import FRAME_WORDS_KEY
from maspo_base.speech_tokens.llasa_tokens import CODEBOOK_SIZE
from maspo_base.xcodec2_decoder import HOP_LENGTH, SAMPLE_RATE
from reward_fns.likelihood import MAX_TOKEN_NLL
from reward_fns.reward_settings import ModelSettings

logger = logging.getLogger(__name__)

NOT_HEARD_TWICE = {
    "speech_second_error_rate": float("nan"),
    "speech_second_error_rate_raw": float("nan"),
    "speech_second_transcript": "",
}
"""The second ear's parts of a request that did not ask for it."""

UNHEARD_BY_EAR = {
    "speech_ear_per": 1.0,
    "speech_ear_per_raw": 1.0,
    "speech_ear_nll": MAX_TOKEN_NLL,
    "speech_ear_aligned": 0.0,
    "speech_ear_transcript": "",
}
"""The code ear's parts of a response it did not score (``reward_config.recogniser="ear"``): each at its worst."""

FAILURE_REASONS = {
    "invalid_request": "a field of the request is unusable (wrong type, int64 overflow, blank language, "
    "prompt code out of range, NaN/inf prompt_audio); the detail names it",
    "decode_error": "the codec failed on this response",
    "asr_error": "the recogniser failed on this response",
    "similarity_error": "decoding the prompt or the speaker embedding failed on this response",
    "unscorable_audio": "the waveform to recognise is empty or not finite (NaN/inf)",
    "empty_transcript": "the recogniser heard nothing it could score (silence, noise): worst on every part, never "
    "an error rate of 0",
    "likelihood_error": "the reference likelihood (Whisper forced alignment) failed on this response",
    "quality_error": "the quality score failed on this response (NaN/empty audio; the detail says why)",
    "unphonemisable_text": "the code ear cannot score this text: espeak-ng gives no phonemes for it, or phonemes "
    "the ear never learnt (the detail names them)",
    "ear_error": "the code ear failed on this response",
    "scoring_error": "any other failure on this response",
    "reward_unavailable": "the Serve reward (reward_fns.ray_serve) did not answer this response: its replica died or "
    "its queue stayed full through every retry; the detail says which",
}
"""``speech_reason`` of a sample that failed on its own (the gate's reasons are `llasa_response.GATE_REASONS`)."""


INT64_MAX = np.iinfo(np.int64).max


@dataclass
class ScoreRequest:
    """One response to score. Give ``solution_str`` (veRL's decoded response) or ``token_ids``."""

    ground_truth: str
    solution_str: str | None = None
    token_ids: list[int] | None = None
    language: str | None = None
    prompt_codes: list[int] | None = None  # voice-cloning prompt codes: never scored, decoded for similarity
    prompt_audio: np.ndarray | None = field(default=None, repr=False)  # 16 kHz float32, for similarity
    second_ear: bool = False  # heard by the second ear too (evaluations), never scored by it

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], codebook_size: int = CODEBOOK_SIZE) -> ScoreRequest:
        """Checked (`checked`): a field that cannot be scored raises ``ValueError`` naming it."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown request field(s) {unknown}; valid: {sorted(known)}")
        if "ground_truth" not in data:
            raise ValueError("request lacks 'ground_truth' (the text the speech should say)")
        return cls(**data).checked(codebook_size)

    def checked(self, codebook_size: int = CODEBOOK_SIZE) -> ScoreRequest:
        """This request with its arrays converted, or ``ValueError`` naming the first unusable field; prompt codes
        must lie in ``[0, codebook_size)`` (the codec's codebook; XCodec2's by default)."""
        for name in ("ground_truth", "solution_str", "language"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{name} must be a string, got {type(value).__name__}: {value!r:.80}")
        if not isinstance(self.second_ear, bool | np.bool_):
            raise ValueError(f"second_ear must be true or false, got {self.second_ear!r:.40}")
        if self.language is not None and not self.language.strip():
            raise ValueError(f"language is blank ({self.language!r}); give a code such as 'zh' or 'en', or omit it")
        token_ids = None if self.token_ids is None else _int_array(self.token_ids, "token_ids", 0, INT64_MAX)
        prompt_codes = (
            None if self.prompt_codes is None else _int_array(self.prompt_codes, "prompt_codes", 0, codebook_size - 1)
        )
        prompt_audio = None
        if self.prompt_audio is not None:
            try:
                prompt_audio = np.asarray(self.prompt_audio, dtype=np.float32)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"prompt_audio must be a list of numbers: {exc}") from None
            if prompt_audio.ndim != 1 or prompt_audio.size == 0:
                raise ValueError(f"prompt_audio must be a non-empty 1-D waveform, got shape {prompt_audio.shape}")
            bad = ~np.isfinite(prompt_audio)
            if bad.any():
                first = int(np.flatnonzero(bad)[0])
                raise ValueError(f"prompt_audio[{first}]={prompt_audio[first]}: the waveform must be finite")
        return dataclasses.replace(self, token_ids=token_ids, prompt_codes=prompt_codes, prompt_audio=prompt_audio)


def _int_array(values: Any, name: str, low: int = 0, high: int = CODEBOOK_SIZE - 1) -> np.ndarray:
    """``values`` as int64 [N], every one in ``[low, high]``, else ``ValueError`` naming the first bad element."""
    if not isinstance(values, list | tuple | np.ndarray):
        raise ValueError(f"{name} must be a list of integers, got {type(values).__name__}")
    raw = np.asarray(values) if len(values) else np.zeros(0, np.int64)
    if raw.ndim != 1 or raw.dtype.kind not in "iu" or raw.dtype == np.uint64 and raw.size and raw.max() > INT64_MAX:
        # not plain integers (strings, floats, bools, beyond 64 bits): name the first offender
        for i, v in enumerate(values):
            if isinstance(v, bool) or not isinstance(v, int | np.integer) or not low <= v <= high:
                raise ValueError(f"{name}[{i}]={v!r:.40}: must be an integer in [{low}, {high}]")
        raise ValueError(f"{name} must be a flat list of integers in [{low}, {high}]")
    array = raw.astype(np.int64)
    bad = (array < low) | (array > high)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name}[{first}]={int(array[first])}: must be an integer in [{low}, {high}]")
    return array


@dataclass(frozen=True)
class RecordShape:
    """The keys a reward's results carry beyond the fixed ones, and the score of an unscored response; derived
    from the settings alone (`from_settings`), so a caller without the models (the Serve client) builds the same
    record for a response it could not get scored."""

    invalid_score: float = 0.0
    speaker: bool = False
    likelihood: bool = False
    quality: bool = False
    frame_errors: bool = False
    frame_likelihood: bool = False
    frame_words: bool = False
    second_ear: bool = False
    ear: bool = False

    @classmethod
    def from_settings(cls, settings: ModelSettings) -> RecordShape:
        config = settings.reward_config
        return cls(
            invalid_score=config.invalid_score,
            speaker=bool(settings.speaker),
            likelihood=bool(settings.likelihood),
            quality=bool(settings.quality),
            frame_errors=config.frame_errors,
            frame_likelihood=config.frame_likelihood,
            frame_words=config.frame_words,
            second_ear=bool(settings.second_asr),
            ear=config.recogniser == "ear",
        )


def unscored_record(shape: RecordShape, reason: str, detail: str = "", n_codes: int = 0) -> dict[str, Any]:
    """The result of a response that is not scored: every part at its worst, ``speech_reason`` saying why."""
    out = {
        "score": shape.invalid_score,
        "speech_valid": 0.0,
        "speech_reason": reason,
        "speech_detail": detail,
        "speech_error_rate": 1.0,
        "speech_error_rate_raw": 1.0,
        "speech_intelligibility": 0.0,
        "speech_error_utility": 0.0,
        "speech_rate": 0.0,
        "speech_duration_score": 0.0,
        "speech_duration_s": HOP_LENGTH * n_codes / SAMPLE_RATE,
        "speech_n_codes": float(n_codes),
        "speech_transcript": "",
    }
    if shape.speaker:
        out.update(speech_similarity=0.0, speech_similarity_counted=0.0)
    if shape.likelihood:
        out.update(speech_asr_nll=MAX_TOKEN_NLL, speech_likelihood_utility=0.0)
    if shape.quality:
        out.update(speech_quality_mos=1.0, speech_quality=0.0)
    if shape.frame_errors:
        out["frame_errors"] = NO_ALIGNMENT
    if shape.frame_likelihood:
        out[CREDIT_SOURCE_KEYS["likelihood"]] = NO_ALIGNMENT
    if shape.frame_words:
        out[FRAME_WORDS_KEY] = NO_ALIGNMENT
    if shape.second_ear:
        out.update(NOT_HEARD_TWICE)
    if shape.ear:
        out.update(UNHEARD_BY_EAR)
    return out


def per_item(fn: Callable[[list], list], items: list, what: str) -> list[tuple[Any, str | None]]:
    """Run ``fn`` on the batch; if it raises, on each item alone. Returns ``(result or None, error or None)`` per
    item: one item that fails never takes its neighbours with it."""
    try:
        return [(r, None) for r in fn(items)]
    except Exception as exc:  # noqa: BLE001 - isolate the failing sample, report it
        logger.warning("%s failed on a batch of %d (%s); retrying one by one", what, len(items), exc)
    out = []
    for item in items:
        try:
            out.append((fn([item])[0], None))
        except Exception as exc:  # noqa: BLE001
            out.append((None, error_message(exc)))
    return out


def error_message(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
