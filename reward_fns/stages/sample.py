"""A response on its way through the reward's stages (`Sample`), why one is not scored (`Failure`), and how a stage
runs over a batch.

A stage maps a list of live samples to the same samples, in order, each with what the stage learnt of it or, where
the stage failed on that sample alone, its `Failure`. `through` gives a stage only the samples still live and puts
its answers back in place; `batched` runs one model call over the samples and, when it raises, runs it again sample
by sample (`score_record.per_item`), so a sample that fails never takes its neighbours with it; `per_model` gives
each model the samples it serves, one batch per model even when it serves several languages.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from maspo_base.xcodec2_decoder import HOP_LENGTH
from reward_fns.alignment import TimedWord
from reward_fns.likelihood import ReferenceLikelihood
from reward_fns.score_record import RecordShape, ScoreRequest, per_item, unscored_record


@dataclass(frozen=True)
class Failure:
    """Why a sample is not scored: its ``speech_reason`` (`score_record.FAILURE_REASONS`, or the gate's), the
    message (``speech_detail``) and the response's length in codes."""

    reason: str
    detail: str = ""
    n_codes: int = 0

    def record(self, shape: RecordShape) -> dict[str, Any]:
        """The sample's result: every part at its worst (`score_record.unscored_record`)."""
        return unscored_record(shape, self.reason, self.detail, self.n_codes)


@dataclass(frozen=True)
class Sample:
    """One response of a batch and what the stages learnt of it so far; a stage returns a changed copy."""

    request: ScoreRequest | None = None
    """The checked request; None when the request itself is unusable."""
    language: str = ""
    """Base language code (`text_norm.base_language`): which recogniser hears it."""
    codes: np.ndarray | None = field(default=None, repr=False)
    """The response's speech codes (None when scored from audio)."""
    audio: np.ndarray | None = field(default=None, repr=False)
    """16 kHz float32 waveform: decoded from ``codes``, or given."""
    transcript: str = ""
    """What the recogniser heard."""
    words: list[TimedWord] | None = None
    """The heard words with their times, when the frame signals ask for them and the recogniser gives them."""
    likelihood: ReferenceLikelihood | None = None
    """The recogniser's likelihood of the reference text given the audio."""
    quality: float | None = None
    """DNSMOS overall MOS of the audio."""
    prompt: np.ndarray | None = field(default=None, repr=False)
    """The voice prompt's waveform (given, or decoded from the prompt codes), for speaker similarity."""
    similarity: float | None = None
    """Speaker similarity of the audio to the prompt."""
    phonemes: tuple[str, ...] | None = None
    """The phonemes the code ear should hear (its targets)."""
    result: dict[str, Any] | None = field(default=None, repr=False)
    """The result `score_batch` returns for it: set when scored, or from the failure at the end."""
    failure: Failure | None = None

    @property
    def live(self) -> bool:
        return self.failure is None

    @property
    def n_codes(self) -> int:
        """The response's length in codes: from its waveform once decoded (one code per ``HOP_LENGTH`` samples)."""
        if self.audio is not None:
            return len(self.audio) // HOP_LENGTH
        return 0 if self.codes is None else len(self.codes)

    def failed(self, reason: str, detail: str = "", n_codes: int | None = None) -> Sample:
        """This sample, not scored because of ``reason``; its length is `n_codes` unless given."""
        return self.learnt(failure=Failure(reason, detail, self.n_codes if n_codes is None else n_codes))

    def learnt(self, **values: Any) -> Sample:
        """A copy of this sample with these fields set (what a stage learnt of it)."""
        unknown = values.keys() - _FIELDS
        if unknown:
            raise TypeError(f"Sample has no field(s) {sorted(unknown)}; fields: {sorted(_FIELDS)}")
        # dataclasses.replace re-runs the frozen __init__ (8 us a copy here against 2 us; ~5 copies a sample a batch)
        copy = object.__new__(Sample)
        copy.__dict__.update(self.__dict__, **values)
        return copy


_FIELDS = frozenset(f.name for f in dataclasses.fields(Sample))

Stage = Callable[[list[Sample]], list[Sample]]


def through(
    stage: Stage, samples: Sequence[Sample], where: Callable[[Sample], bool] = lambda s: s.live
) -> list[Sample]:
    """``stage`` run on the samples ``where`` selects (the live ones), the others passed on as they are, in order."""
    chosen = [sample for sample in samples if where(sample)]
    if not chosen:
        return list(samples)
    answered = stage(chosen)
    if len(answered) != len(chosen):
        raise RuntimeError(f"a reward stage answered {len(answered)} samples for {len(chosen)}")
    done = iter(answered)
    return [next(done) if where(sample) else sample for sample in samples]


def batched(
    samples: list[Sample],
    run: Callable[[list[Sample]], Sequence[Any]],
    what: str,
    reason: str,
    keep: Callable[[Sample, Any], Sample],
    detail: str = "{}",
) -> list[Sample]:
    """``run`` (one value per sample) on the samples as one batch, again one by one if it raises; ``keep(sample,
    value)`` records a value, and a sample it fails on alone fails with ``reason``, the error in ``detail``."""
    outcomes = per_item(run, samples, what)
    return [
        keep(sample, value) if err is None else sample.failed(reason, detail.format(err))
        for sample, (value, err) in zip(samples, outcomes)
    ]


def per_model(
    stage: Callable[[Any, list[Sample]], list[Sample]], samples: Sequence[Sample], models: Sequence[Any]
) -> list[Sample]:
    """``stage(model, batch)`` once per model over the samples it serves (``models[k]`` serves ``samples[k]``; None:
    no model, passed on), models in the order they first appear: a model serving several languages hears them in
    one batch."""
    distinct: list[Any] = []
    for model in models:
        if model is not None and not any(model is seen for seen in distinct):
            distinct.append(model)
    out = list(samples)
    for model in distinct:
        served = [own is model for own in models]
        answered = iter(stage(model, [sample for sample, mine in zip(samples, served) if mine]))
        out = [next(answered) if mine else sample for sample, mine in zip(out, served)]
    return out
