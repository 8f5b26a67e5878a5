"""The score stage: a recognised sample's error rate and score (`reward_fns.reward.compose`) as its result, then the
per-frame signals the credit reads (`maspo_base.frame_errors`, `maspo_base.frame_words`) when the config asks.

For a sample of ``n`` codes (``n = len(audio) // HOP_LENGTH``, the codec's frames):

    frame_errors[k]      1 where frame k overlaps a unit the recogniser got wrong or the place of a missing one, else 0
                         (`alignment.frame_errors_from_words`)
    frame_words[k]       the index of the heard word covering frame k, -1 where none does
                         (`alignment.frame_words_from_words`)
    frame_likelihood[k]  1 - p(w), w the reference word whose aligned span covers frame k, 0 where none does
                         (`likelihood.ReferenceLikelihood.frame_surprise`)
"""

from __future__ import annotations

from typing import Any

from maspo_base.frame_errors import CREDIT_SOURCE_KEYS, encode_frame_errors
from maspo_base.frame_words import FRAME_WORDS_KEY, encode_frame_words
from maspo_base.xcodec2_decoder import SAMPLE_RATE
from reward_fns.alignment import frame_errors_from_words, frame_words_from_words
from reward_fns.error_rate import error_rate
from reward_fns.reward import RewardConfig, compose
from reward_fns.score_record import RecordShape, error_message, unscored_record
from reward_fns.stages.sample import Sample


def score(samples: list[Sample], config: RewardConfig, shape: RecordShape, speaker: bool = False) -> list[Sample]:
    """Each sample's ``result``: its error rate against the reference and its score; ``speaker``: the reward
    compares voices, so a sample without a prompt scores similarity 0. A reference with nothing to score is
    ``empty_reference``, any other failure ``scoring_error``."""
    return [_scored(s, config, shape, speaker) for s in samples]


def _scored(sample: Sample, config: RewardConfig, shape: RecordShape, speaker: bool) -> Sample:
    try:
        try:
            er = error_rate(sample.request.ground_truth, sample.transcript, sample.language, config.error_unit)
        except ValueError as exc:
            return sample.failed("empty_reference", str(exc))
        similarity = 0.0 if speaker and sample.similarity is None else sample.similarity  # no prompt: no voice to match
        result = unscored_record(shape, "ok", "", sample.n_codes)
        result.update(
            compose(
                config,
                er.value,
                len(sample.audio) / SAMPLE_RATE,
                er.language_units,
                sample.language,
                similarity,
                asr_nll=sample.likelihood.nll if sample.likelihood is not None else None,
                quality=sample.quality,
            ),
            speech_valid=1.0,
            speech_error_rate=er.value,
            speech_error_rate_raw=er.raw,
            speech_transcript=sample.transcript,
        )
    except Exception as exc:  # noqa: BLE001 - one sample's problem, reported in its result
        return sample.failed("scoring_error", error_message(exc))
    return sample.learnt(result=result)


def add_frame_signals(samples: list[Sample], config: RewardConfig) -> list[Sample]:
    """Each scored sample's result with the frame signals ``config`` asks for (module docstring); those from the
    recogniser's word times stay unaligned where it gave none. A failure is ``scoring_error``."""
    out = []
    for sample in samples:
        try:
            signals = frame_signals(sample, config)
        except Exception as exc:  # noqa: BLE001
            out.append(sample.failed("scoring_error", error_message(exc)))
            continue
        out.append(sample.learnt(result={**sample.result, **signals}))
    return out


def frame_signals(sample: Sample, config: RewardConfig) -> dict[str, Any]:
    """The encoded frame signals of one recognised sample (module docstring)."""
    n_frames, signals = sample.n_codes, {}
    if config.frame_errors and sample.words is not None:
        errors = frame_errors_from_words(sample.request.ground_truth, sample.words, sample.language, n_frames)
        signals["frame_errors"] = encode_frame_errors(errors)
    if config.frame_words and sample.words is not None:
        signals[FRAME_WORDS_KEY] = encode_frame_words(frame_words_from_words(sample.words, sample.language, n_frames))
    if config.frame_likelihood:
        signals[CREDIT_SOURCE_KEYS["likelihood"]] = encode_frame_errors(sample.likelihood.frame_surprise(n_frames))
    return signals
