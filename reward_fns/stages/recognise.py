"""The recognise stage: what the reward's recogniser (one `reward_fns.asr.AsrBackend` per language) hears of each
waveform. Audio it cannot hear (empty, NaN/inf) and a transcript with nothing to score (silence, noise) are not
scored: silence never earns an error rate of 0."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from reward_fns.asr import AsrBackend
from reward_fns.stages.sample import Sample, batched, per_model
from reward_fns.text_norm import scoring_units


def audible(audio: np.ndarray) -> bool:
    """A waveform a recogniser can hear: not empty, every sample finite."""
    return audio.size > 0 and bool(np.isfinite(audio).all())


def check_waveforms(samples: list[Sample]) -> list[Sample]:
    """Each sample as it is, or ``unscorable_audio`` when its waveform is not `audible`."""
    return [
        s
        if audible(s.audio)
        else s.failed("unscorable_audio", "empty waveform" if s.audio.size == 0 else "waveform has NaN/inf samples")
        for s in samples
    ]


def recognise(samples: list[Sample], asr: Mapping[str, AsrBackend], timed: bool = False) -> list[Sample]:
    """Each sample's ``transcript`` by its language's recogniser, one batch per recogniser; with ``timed`` its
    ``words`` with their times too (one timed transcription serves every frame signal). A sample the recogniser
    fails on alone is ``asr_error``."""

    def hear(backend: AsrBackend, batch: list[Sample]) -> list[Sample]:
        transcribe = backend.transcribe_timed if timed else backend.transcribe
        return batched(
            batch,
            lambda items: transcribe([s.audio for s in items], [s.language for s in items]),
            "ASR",
            "asr_error",
            _heard_timed if timed else _heard,
        )

    return per_model(hear, samples, [asr[s.language] for s in samples])


def _heard(sample: Sample, transcript: str) -> Sample:
    return sample.learnt(transcript=transcript)


def _heard_timed(sample: Sample, heard: tuple) -> Sample:
    transcript, words = heard
    return sample.learnt(transcript=transcript, words=words)


def require_transcript(samples: list[Sample]) -> list[Sample]:
    """Each sample as it is, or ``empty_transcript`` when its transcript has no unit to score."""
    return [
        s if scoring_units(s.transcript, s.language) else s.failed("empty_transcript", f"transcript {s.transcript!r}")
        for s in samples
    ]
