"""XCodec2's codebook: a finite scalar quantiser (FSQ) of 8 dimensions with 4 levels each.

A codec id is a base-4 number: digit ``d_k = (id // 4**k) % 4`` is dimension k (k = 0 least significant) and the
code value on that dimension is ``c_k = (d_k - 2) / 2``. Distances between consecutive codes are measured on these
digits, not on the raw id (``|Δid| = 1`` moves dimension 0, ``|Δid| = 16384`` moves dimension 7). The id whose
digits are all 2 is the all-zero code, `ZERO_CODE` (43690).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch

FSQ_LEVELS = 4
FSQ_DIMS = 8
ZERO_DIGIT = FSQ_LEVELS // 2
"""The digit whose code value ``(d - 2) / 2`` is 0."""
ZERO_CODE = sum(ZERO_DIGIT * FSQ_LEVELS**k for k in range(FSQ_DIMS))  # 43690
"""The codec id of the all-zero code (every digit 2): silence-like, used as padding."""

FSQ_METRICS = ("l1", "l2", "changed_dims")


def digits_of(code: int) -> tuple[int, ...]:
    """FSQ digits of one codec id: ``d_k = (code // 4**k) % 4``, k = 0..7."""
    return tuple((code // FSQ_LEVELS**k) % FSQ_LEVELS for k in range(FSQ_DIMS))


def code_of(digits: Sequence[int]) -> int:
    """Codec id of FSQ digits: ``sum_k d_k * 4**k``."""
    return sum(d * FSQ_LEVELS**k for k, d in enumerate(digits))


def fsq_digits(codec_ids: torch.Tensor, levels: int = FSQ_LEVELS, dims: int = FSQ_DIMS) -> torch.Tensor:
    """Digits of each codec id on the FSQ lattice: ``(..., dims)`` with ``d_k = (id // levels**k) % levels``."""
    place_values = levels ** torch.arange(dims, device=codec_ids.device)
    return (codec_ids.long().unsqueeze(-1) // place_values) % levels


_HALF_DIGITS = FSQ_DIMS // 2  # a codec id splits into two bytes of 4 base-4 digits each
_HALF = FSQ_LEVELS**_HALF_DIGITS
assert _HALF == 256, "fsq_step_distance splits a codec id into two bytes"


@functools.cache
def _half_distance_table(metric: str, device: str) -> torch.Tensor:
    """``table[a * 256 + b]``: the metric's contribution of 4 digits between bytes a and b, in integer units (uint8).

    Units: level steps for ``l1``, squared level steps for ``l2`` (summed over both halves; the distance in code units
    is ``sqrt(units) / 2``), changed dimensions for ``changed_dims``. One byte an entry keeps the table (64 KiB) and
    the gathered values small.
    """
    values = torch.arange(_HALF)
    digits = fsq_digits(values, dims=_HALF_DIGITS)
    step = (digits.unsqueeze(1) - digits.unsqueeze(0)).abs()
    if metric == "l1":
        table = step.sum(-1)
    elif metric == "l2":
        table = step.pow(2).sum(-1)
    elif metric == "changed_dims":
        table = (step > 0).sum(-1)
    else:
        raise ValueError(f"unknown FSQ metric {metric!r}; valid: {list(FSQ_METRICS)}")
    return table.reshape(-1).to(device=device, dtype=torch.uint8)


def fsq_step_units(codec_ids: torch.Tensor, metric: str = "l1") -> torch.Tensor:
    """Distance units (see `_half_distance_table`) between consecutive codes along the last dim: ``(..., T - 1)``.

    Each id is split once into its low and high byte (4 digits each); a pair of consecutive bytes indexes the table.
    Ids outside ``[0, 65536)`` are read modulo 65536: callers mask them.
    """
    table = _half_distance_table(metric, str(codec_ids.device))
    codes = codec_ids.int()
    low, high = codes & 0xFF, (codes >> 8) & 0xFF
    low_pairs = (low[..., :-1] << 8) | low[..., 1:]
    high_pairs = (high[..., :-1] << 8) | high[..., 1:]
    units = table.index_select(0, low_pairs.reshape(-1)) + table.index_select(0, high_pairs.reshape(-1))
    return units.view(low_pairs.shape)


def units_threshold(threshold: float, metric: str) -> int:
    """The threshold in integer distance units: ``dist > threshold`` exactly when ``units > units_threshold(...)``.

    ``l2`` compares squared level steps with ``4 threshold**2``; units are integers, so the floor keeps ``>`` exact
    and the comparison stays in integers."""
    return math.floor(4.0 * threshold * threshold if metric == "l2" else threshold)


def fsq_step_distance(previous: torch.Tensor, current: torch.Tensor, metric: str = "l1") -> torch.Tensor:
    """Distance between XCodec2 codes on the FSQ lattice, elementwise (float32).

    - ``l1``: ``sum_k |d_k(a) - d_k(b)|`` level steps (0..24)
    - ``l2``: ``sqrt(sum_k (c_k(a) - c_k(b))**2)`` with ``c_k = (d_k - 2) / 2`` (0..sqrt(18))
    - ``changed_dims``: dimensions whose level differs (0..8)
    """
    pairs = torch.stack([previous.reshape(-1), current.reshape(-1)], dim=-1)
    distance = fsq_step_units(pairs, metric).view(previous.shape).to(torch.float32)
    return distance.sqrt() / 2 if metric == "l2" else distance
