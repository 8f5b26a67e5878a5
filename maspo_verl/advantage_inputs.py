"""What MASPO's advantage estimator needs beyond veRL's estimator call: where each response's errors were heard.

veRL 0.9.1 calls a registered estimator with ``token_level_rewards, response_mask, config, index`` only; the reward's
per-frame signal sits elsewhere (``non_tensor_batch`` in the legacy trainer, the TransferQueue in the default one).
`maspo_verl.verl_patches.trainer` places it on the response tokens and provides it here around veRL's
``compute_advantage``; tests and direct callers use `provide_credit_inputs` or pass ``credit_inputs=`` to the
estimator.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch


@dataclass
class CreditInputs:
    frame_errors: torch.Tensor
    """``(B, T)`` error of each frame token in [0, 1] (zero elsewhere), aligned with ``response_mask``."""
    frame_mask: torch.Tensor
    """``(B, T)`` bool: True at the codec-frame tokens of each response."""
    aligned: torch.Tensor
    """``(B,)`` bool: False where the reward reported no alignment (the sample keeps the outcome advantage)."""
    frame_units: torch.Tensor | None = None
    """``(B, T)`` int64, the target unit each frame token is aligned to (`maspo_base.frame_words.scatter_frame_words`:
    a unit index >= 0, or a negative code); what ``credit_mode=per_unit`` groups frames by."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Filled by the estimator: what it did this step (`maspo_verl.advantage.CREDIT_METRICS`)."""


_CURRENT: contextvars.ContextVar[CreditInputs | None] = contextvars.ContextVar("maspo_credit_inputs", default=None)


def current_credit_inputs() -> CreditInputs | None:
    return _CURRENT.get()


@contextlib.contextmanager
def provide_credit_inputs(inputs: CreditInputs) -> Iterator[CreditInputs]:
    """Make ``inputs`` visible to ``adv_estimator=maspo`` called in this block."""
    token = _CURRENT.set(inputs)
    try:
        yield inputs
    finally:
        _CURRENT.reset(token)
