"""The second ear: a recogniser that never enters the score (`reward_fns.pipeline` module docstring). A request that
asks for it (``second_ear=True``, as evaluation rows do) reports its error rate in the reward's unit beside the
reward's own; one it cannot hear (no audio, audio not `recognise.audible`, no model for its language, the second ear
failing on it) reports every unit wrong:

    speech_second_error_rate = min(ER2, 1),  speech_second_error_rate_raw = ER2,  ER2 = 1 when not heard
"""

from __future__ import annotations

from collections.abc import Mapping

from reward_fns.asr import AsrBackend
from reward_fns.error_rate import error_rate
from reward_fns.score_record import per_item
from reward_fns.stages.recognise import audible
from reward_fns.stages.sample import Sample, per_model
from reward_fns.text_norm import scoring_units


def asks(sample: Sample) -> bool:
    return sample.request is not None and sample.request.second_ear


def hear_again(samples: list[Sample], second_asr: Mapping[str, AsrBackend], unit: str) -> list[Sample]:
    """Each asking sample's result (scored or not: every sample has one by now) with the second ear's parts;
    ``unit`` is the reward's error unit (`reward_fns.reward.RewardConfig.error_unit`)."""
    ears = [
        second_asr.get(s.language) if asks(s) and s.audio is not None and audible(s.audio) else None for s in samples
    ]

    def hear(backend: AsrBackend, batch: list[Sample]) -> list[Sample]:
        heard = per_item(
            lambda items: backend.transcribe([s.audio for s in items], [s.language for s in items]), batch, "second ear"
        )
        return [_reported(s, text if err is None else None, unit) for s, (text, err) in zip(batch, heard)]

    heard = per_model(hear, samples, ears)
    return [_reported(s, None, unit) if asks(s) and ear is None else s for s, ear in zip(heard, ears)]


def _reported(sample: Sample, transcript: str | None, unit: str) -> Sample:
    """The sample's result with the second ear's parts of ``transcript`` (None: not heard)."""
    raw = 1.0
    reference = sample.request.ground_truth
    if transcript is not None and scoring_units(reference, sample.language):
        raw = error_rate(reference, transcript, sample.language, unit).raw
    return sample.learnt(
        result={
            **sample.result,
            "speech_second_error_rate": min(raw, 1.0),
            "speech_second_error_rate_raw": raw,
            "speech_second_transcript": transcript or "",
        }
    )
