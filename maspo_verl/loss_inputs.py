"""What the MASPO loss needs beyond veRL's policy-loss call (response token ids, the heard words on them, mini-batch
segment counts), and what it hands back beyond veRL's return value (the sums its metrics are ratios of).

veRL 0.9.1's ``ppo_loss`` narrows each micro-batch to ``response_mask, old_log_probs, advantages`` before it calls
the registered policy loss, so token ids never reach it; and a loss sees one micro-batch, while the ``seg-mean``
aggregation divides by the number of segments in the whole mini-batch. `maspo_verl.verl_patches.actor` fills this
context inside veRL's actor worker; tests and direct callers use `provide_loss_inputs`.

veRL averages a loss's metrics over the micro-batches with equal weight, so a ratio such as the clipped fraction of
segments would depend on how veRL groups the rows (``use_dynamic_bsz`` groups them by token count). Inside
`collect_metric_sums` each MASPO loss call adds the sums behind its metrics, so the worker can report each metric of
the whole mini-batch (`maspo_verl.loss.metrics_from_sums`).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LossInputs:
    response_ids: torch.Tensor | None = None
    """``(B, T)`` token ids of the micro-batch's responses, aligned with ``response_mask``."""
    minibatch_num_segments: int | None = None
    """Segments in the global mini-batch (all micro-batches, all data-parallel ranks), for ``seg-mean``."""
    heard_words: torch.Tensor | None = None
    """``(B, T)`` int64 heard word of each response token (`maspo_base.frame_words.scatter_frame_words`), for
    segmenters registered with ``needs_heard_words``; placed in the batch by the trainer hook."""


_NONE = LossInputs()
_CURRENT: contextvars.ContextVar[LossInputs | None] = contextvars.ContextVar("maspo_loss_inputs", default=None)


def current_loss_inputs() -> LossInputs:
    return _CURRENT.get() or _NONE


@contextlib.contextmanager
def provide_loss_inputs(
    response_ids: torch.Tensor | None = None,
    minibatch_num_segments: int | None = None,
    heard_words: torch.Tensor | None = None,
) -> Iterator[LossInputs]:
    """Make ``response_ids`` (and the mini-batch segment count, the heard words) visible to MASPO losses called in
    this block."""
    inputs = LossInputs(
        response_ids=response_ids, minibatch_num_segments=minibatch_num_segments, heard_words=heard_words
    )
    token = _CURRENT.set(inputs)
    try:
        yield inputs
    finally:
        _CURRENT.reset(token)


class MetricSums:
    """Element-wise sums of the MASPO losses' metric sums (`maspo_verl.loss.METRIC_SUMS`) over the calls made while
    it is collecting: the micro-batches of one mini-batch."""

    def __init__(self) -> None:
        self.totals: list[float] | None = None
        self.calls = 0

    def add(self, sums: list[float]) -> None:
        self.totals = list(sums) if self.totals is None else [a + b for a, b in zip(self.totals, sums, strict=True)]
        self.calls += 1


_COLLECTING: contextvars.ContextVar[MetricSums | None] = contextvars.ContextVar("maspo_metric_sums", default=None)


@contextlib.contextmanager
def collect_metric_sums() -> Iterator[MetricSums]:
    """Sum the metric sums of every MASPO loss call in this block."""
    collected = MetricSums()
    token = _COLLECTING.set(collected)
    try:
        yield collected
    finally:
        _COLLECTING.reset(token)


def record_metric_sums(sums: list[float]) -> None:
    """Called by the loss: add ``sums`` to the collection in progress, if any."""
    collected = _COLLECTING.get()
    if collected is not None:
        collected.add(sums)
