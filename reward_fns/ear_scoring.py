"""The speech reward heard by the code ear (``reward_config.recogniser="ear"``): a response's codes read as phonemes,
no audio decoded.

For a response of ``n`` codes whose text espeak-ng reads as ``N`` phonemes, the code ear (`reward_fns.code_ear`)
gives its phoneme error rate PER and its CTC likelihood ``nll = -log p(phonemes | codes) / N``; the score is the
reward's own composition (`reward_fns.reward.compose`) with

    ER = min(PER, 1),   asr_nll = nll,   duration = n / frame rate

so ``intelligibility="error_rate"`` scores ``1 - tanh(cer_scale * PER)``, ``"likelihood"`` ``exp(-nll /
nll_scale)`` and ``"anchors"`` their harmonic mean. Every result carries the ear's parts (`EAR_KEYS`); the audio
recogniser's (``speech_error_rate``, ``speech_transcript``) are NaN and empty unless the request asked for the
second ear (evaluation rows), whose audio is then decoded and heard by the ASR and the second ear as always,
reported beside the ear's score and never scored.

Per frame, from the ear's forced alignment: ``frame_errors`` (``reward_config.frame_errors``) is ``1 - score`` of
the phoneme each code is aligned to (0 before the first phoneme), and ``frame_words`` (``reward_config.frame_words``)
the index of that phoneme (-1 before the first): the ``heard_words`` segmenter then cuts one segment per phoneme,
and ``adv_estimator=maspo`` with ``credit_mode=per_unit`` gives each phoneme its group-relative advantage.

A response the ear cannot score gets the reward's unscored record with its reason: no codes or codes outside the
codec (the gate's reasons), text espeak-ng gives no phonemes for or phonemes the ear never learnt
(``unphonemisable_text``), a failure of the ear itself (``ear_error``); its neighbours are scored as if it were not
there. Too few codes for the text's phonemes is no failure: the ear's PER is measured, its likelihood is 0
(``nll`` is reported as `MAX_TOKEN_NLL`) and there is no alignment.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from maspo_base.frame_errors import NO_ALIGNMENT, encode_frame_errors
from maspo_base.frame_words import FRAME_WORDS_KEY, encode_frame_words
from reward_fns.code_ear import CodeEar, Heard
from reward_fns.likelihood import MAX_TOKEN_NLL
from reward_fns.reward import RewardConfig, compose
from reward_fns.score_record import UNHEARD_BY_EAR, RecordShape, unscored_record
from reward_fns.stages.sample import Sample, batched, through
from reward_fns.text_norm import scoring_units

EAR_KEYS = tuple(UNHEARD_BY_EAR)
NOT_HEARD_BY_AUDIO = {"speech_error_rate": math.nan, "speech_error_rate_raw": math.nan, "speech_transcript": ""}
"""The audio recogniser's parts of a response the ear scored and nobody decoded."""
AUDIO_KEYS = ("speech_error_rate", "speech_error_rate_raw", "speech_transcript")


def score_with_ear(
    samples: list[Sample], ear: CodeEar, config: RewardConfig, shape: RecordShape, frame_rate: int
) -> list[Sample]:
    """Each sample's ``result`` as the ear hears its codes (module docstring), in one batch; ``shape`` is the
    reward's (`reward_fns.pipeline.SpeechReward.record_shape`), ``frame_rate`` the codes per second."""

    def hear(batch: list[Sample]) -> list[Sample]:
        return batched(
            batch,
            lambda items: ear.hear([s.codes for s in items], [s.phonemes for s in items]),
            "code ear",
            "ear_error",
            lambda sample, heard: sample.learnt(result=_scored(heard, sample, config, shape, frame_rate)),
        )

    return through(hear, [_phonemised(sample, ear) for sample in samples])


def _phonemised(sample: Sample, ear: CodeEar) -> Sample:
    """The sample with the phonemes its text should be heard as, or ``unphonemisable_text``."""
    try:
        return sample.learnt(phonemes=ear.targets(sample.request.ground_truth))
    except ValueError as exc:
        return sample.failed("unphonemisable_text", str(exc))


def _scored(heard: Heard, sample: Sample, config: RewardConfig, shape: RecordShape, frame_rate: int) -> dict[str, Any]:
    text, lang, n_codes = sample.request.ground_truth, sample.language, sample.n_codes
    nll = heard.nll if math.isfinite(heard.nll) else math.inf
    parts = compose(
        config, min(heard.per, 1.0), n_codes / frame_rate, len(scoring_units(text, lang)), lang, asr_nll=nll
    )
    parts.pop("speech_asr_nll", None)
    parts.pop("speech_likelihood_utility", None)
    out = unscored_record(shape, "ok", "", n_codes)
    out.update(parts)
    out.update(NOT_HEARD_BY_AUDIO)
    out.update(
        speech_valid=1.0,
        speech_ear_per=min(heard.per, 1.0),
        speech_ear_per_raw=heard.per,
        speech_ear_nll=min(nll, MAX_TOKEN_NLL),
        speech_ear_aligned=float(heard.aligned),
        speech_ear_transcript=" ".join(heard.transcript),
    )
    if config.frame_errors:
        errors = np.nan_to_num(1.0 - heard.frame_scores, nan=0.0).clip(0.0, 1.0)
        out["frame_errors"] = encode_frame_errors(errors) if heard.aligned else NO_ALIGNMENT
    if config.frame_words:
        out[FRAME_WORDS_KEY] = encode_frame_words(heard.frame_units) if heard.aligned else NO_ALIGNMENT
    return out
