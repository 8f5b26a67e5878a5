"""Per-frame error signals: how a reward says *where* in a response it heard errors, and how that reaches tokens.

A reward reports, beside its score, one value per codec frame of the response, ``e_k`` in [0, 1] (1: frame k is
part of an error, 0: heard as intended; values in between for graded sources). Frame k is the k-th codec token of
the response (for a well-formed Llasa response, codes then the end tag, that is response token k); the prompt's
codes are not part of it.

On the wire the signal is a string (`encode_frame_errors`): veRL turns every reward extra into a numpy array across
the batch, which works for strings of any length but not for lists of different lengths, and its validation metrics
skip strings. The empty string means "no alignment" (a recogniser without timestamps, an unparsable response):
the advantage estimator then gives that sample the plain outcome advantage and counts it.

`scatter_frame_errors` places the decoded signals on the response tokens, vectorised over the batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

NO_ALIGNMENT = ""

CREDIT_SOURCE_KEYS = {"errors": "frame_errors", "likelihood": "frame_likelihood"}
"""``algorithm.maspo.credit_source`` -> the reward extra carrying its per-frame signal: ``errors`` the binary frames
the recogniser heard wrong (`reward_fns.alignment`), ``likelihood`` ``1 - p(word)`` of the reference word aligned to
each frame (`reward_fns.likelihood`); the speech reward reports them with ``reward_config.frame_errors`` /
``reward_config.frame_likelihood``."""


def encode_frame_errors(errors: Sequence[float] | None) -> str:
    """``[0, 1, 0.25]`` -> ``"0,1,0.25"``; ``None`` -> ``""`` (no alignment). Values must be finite, in [0, 1]."""
    if errors is None:
        return NO_ALIGNMENT
    parts = []
    for k, value in enumerate(errors):
        value = float(value)
        if not (math.isfinite(value) and 0.0 <= value <= 1.0):
            raise ValueError(f"frame error {k} is {value!r}; frame errors must be finite numbers in [0, 1]")
        parts.append("1" if value == 1.0 else "0" if value == 0.0 else format(value, ".4g"))
    return ",".join(parts)


def decode_frame_errors(text: object) -> list[float] | None:
    """The inverse of `encode_frame_errors`; ``None`` for no alignment or anything malformed (never raises)."""
    if not isinstance(text, str) or text == NO_ALIGNMENT:
        return None
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        return None
    if not all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in values):
        return None
    return values


def scatter_frame_errors(
    signals: Sequence[object], frame_mask: torch.Tensor, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Place each response's frame errors on its frame tokens.

    ``signals``: one encoded signal per row; ``frame_mask``: ``(B, T)`` bool, True at the codec-frame tokens of
    each (valid) response. Row i is *aligned* when its signal decodes and has exactly as many values as the row
    has frame tokens; then value k lands on the row's k-th frame token. Returns ``(errors, aligned)``:
    ``errors`` ``(B, T)`` (zero off frames and on unaligned rows), ``aligned`` ``(B,)`` bool.
    """
    if len(signals) != frame_mask.shape[0]:
        raise ValueError(f"{len(signals)} frame-error signals for {frame_mask.shape[0]} responses")
    decoded = [decode_frame_errors(s) for s in signals]
    lengths = torch.tensor([-1 if d is None else len(d) for d in decoded], device=frame_mask.device)
    aligned = lengths == frame_mask.sum(dim=-1)
    values = [torch.tensor(d, dtype=dtype) for d, ok in zip(decoded, aligned.tolist()) if ok and d]
    errors = torch.zeros(frame_mask.shape, dtype=dtype, device=frame_mask.device)
    if values:
        # row-major order of the mask's True entries is (row, frame k) order: exactly the concatenated signals
        errors[frame_mask & aligned.unsqueeze(-1)] = torch.cat(values).to(frame_mask.device)
    return errors, aligned
