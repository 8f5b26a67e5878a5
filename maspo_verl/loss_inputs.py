"""What the MASPO loss needs beyond veRL's policy-loss call: response token ids and mini-batch segment counts.

veRL 0.9.1's ``ppo_loss`` narrows each micro-batch to ``response_mask, old_log_probs, advantages`` before it calls
the registered policy loss, so token ids never reach it; and a loss sees one micro-batch, while the ``seg-mean``
aggregation divides by the number of segments in the whole mini-batch. `maspo_verl.verl_patches.actor` fills this
context inside veRL's actor worker; tests and direct callers use `provide_loss_inputs`.
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


_NONE = LossInputs()
_CURRENT: contextvars.ContextVar[LossInputs | None] = contextvars.ContextVar("maspo_loss_inputs", default=None)


def current_loss_inputs() -> LossInputs:
    return _CURRENT.get() or _NONE


@contextlib.contextmanager
def provide_loss_inputs(
    response_ids: torch.Tensor | None = None, minibatch_num_segments: int | None = None
) -> Iterator[LossInputs]:
    """Make ``response_ids`` (and the mini-batch segment count) visible to MASPO losses called in this block."""
    inputs = LossInputs(response_ids=response_ids, minibatch_num_segments=minibatch_num_segments)
    token = _CURRENT.set(inputs)
    try:
        yield inputs
    finally:
        _CURRENT.reset(token)
