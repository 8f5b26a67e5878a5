"""XCodec2's codebook: a finite scalar quantiser (FSQ) of 8 dimensions with 4 levels each, and its fused fast path.

A codec id is a base-4 number: digit ``d_k = (id // 4**k) % 4`` is dimension k (k = 0 least significant) and the
code value on that dimension is ``c_k = (d_k - 2) / 2``. Distances between consecutive codes are measured on these
digits, not on the raw id (``|Δid| = 1`` moves dimension 0, ``|Δid| = 16384`` moves dimension 7). The id whose
digits are all 2 is the all-zero code, `ZERO_CODE` (43690). The lattice in general is `maspo_base.speech_tokens.fsq`;
here its 8 x 4 case is computed from byte tables (`fsq_far_steps`: one fused pass over the token ids), which the
``fsq`` segmenter uses on XCodec2's codebook.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch

from .fsq import FSQ_METRICS, FsqLattice

FSQ_LEVELS = 4
FSQ_DIMS = 8
XCODEC2_FSQ = FsqLattice((FSQ_LEVELS,) * FSQ_DIMS)
"""XCodec2's lattice: 8 dimensions x 4 levels, 65,536 codes."""
ZERO_DIGIT = FSQ_LEVELS // 2
"""The digit whose code value ``(d - 2) / 2`` is 0."""
ZERO_CODE = XCODEC2_FSQ.zero_code  # 43690
"""The codec id of the all-zero code (every digit 2): silence-like, used as padding."""


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


def _table_cache(build):
    """``functools.cache`` for the lookup tables, in a plain dict: ``torch.compile`` traces through ``functools.cache``
    (and would rebuild a table inside every compiled call), while a dict entry it reads as a constant."""
    tables: dict = {}

    @functools.wraps(build)
    def cached(*key):
        if key not in tables:
            tables[key] = build(*key)
        return tables[key]

    return cached


@_table_cache
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


_MAX_UNITS = {"l1": FSQ_DIMS * (FSQ_LEVELS - 1), "l2": FSQ_DIMS * (FSQ_LEVELS - 1) ** 2, "changed_dims": FSQ_DIMS}
_OFF_CODEBOOK = 1 << 7  # high-half entry of any pair with an id outside the codebook: sets bit 7 whatever the low half
_HIGH_SLOTS = _HALF + 2  # high bytes 0..255 and two off-codebook slots: below 0 and at or above 65536


@_table_cache
def _far_step_tables(metric: str, threshold_units: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The uint8 tables of `fsq_far_steps`: low halves as in `_half_distance_table`, and high halves biased by
    ``127 - threshold`` so that ``low + high`` has bit 7 set exactly when ``units > threshold``.

    The high table is indexed by ``(h_prev + 1) * 258 + (h_cur + 1)`` with ``h = clamp(id >> 8, -1, 256)``; a pair
    with an id outside ``[0, 65536)`` gets ``128``. Sums stay below 256: ``units <= 72`` and a low half is at most 36.
    """
    threshold = min(threshold_units, _MAX_UNITS[metric])  # above the largest distance no pair is far
    low = _half_distance_table(metric, device)
    high = torch.full((_HIGH_SLOTS, _HIGH_SLOTS), _OFF_CODEBOOK, dtype=torch.uint8, device=device)
    high[1:-1, 1:-1] = (low.view(_HALF, _HALF).int() + (127 - threshold)).to(torch.uint8)
    return low, high.reshape(-1)


def fsq_far_steps(token_ids: torch.Tensor, offset: int, threshold_units: int, metric: str = "l1") -> torch.Tensor:
    """``(B, T)`` bool: token t starts a segment because ``units(t-1, t) > threshold_units`` (see `units_threshold`),
    or token t or t-1 is not a codec token (vocabulary id outside ``offset + [0, 65536)``), or t is a row's first.

    Equal to comparing `fsq_step_units` of the codec ids with the threshold and isolating non-codec tokens, in fewer
    passes: ids go to int32 once, each is split into its low byte and its clamped high byte, and the two table
    lookups of a pair add up to a byte whose bit 7 is the answer (`_far_step_tables`), so no comparison pass."""
    low_table, high_table = _far_step_tables(metric, threshold_units, str(token_ids.device))
    shape = token_ids.shape
    # id - offset + 256: the same low byte, and a high byte one up, so that below-the-codebook ids clamp to slot 0
    codes = token_ids.reshape(-1).to(torch.int32, copy=True).sub_(offset - _HALF)
    if codes.numel() > 1:
        low = codes & 0xFF
        high = codes.bitwise_right_shift_(8).clamp_(0, _HIGH_SLOTS - 1)
        low_pairs = (low[:-1] << 8).bitwise_or_(low[1:])
        high_pairs = torch.add(high[1:], high[:-1], alpha=_HIGH_SLOTS)
        steps = low_table.index_select(0, low_pairs).add_(high_table.index_select(0, high_pairs))
        far = steps.bitwise_right_shift_(7).view(torch.bool)
        starts = torch.nn.functional.pad(far, (1, 0), value=True).view(shape)
    else:
        starts = torch.ones(shape, dtype=torch.bool, device=token_ids.device)
    if shape[-1]:
        starts[..., 0] = True
    return starts


def units_threshold(threshold: float, metric: str) -> int:
    """The threshold in integer distance units: ``dist > threshold`` exactly when ``units > units_threshold(...)``.

    ``l2`` compares squared level steps with ``4 threshold**2``; units are integers, so the floor keeps ``>`` exact
    and the comparison stays in integers. A threshold at or above the largest distance (24, 72 or 8 units) becomes
    that distance: no pair is above it, and the value stays within the uint8 units it is compared with."""
    units = math.floor(4.0 * threshold * threshold if metric == "l2" else threshold)
    return min(units, _MAX_UNITS[metric])


def fsq_step_distance(previous: torch.Tensor, current: torch.Tensor, metric: str = "l1") -> torch.Tensor:
    """Distance between XCodec2 codes on the FSQ lattice, elementwise (float32).

    - ``l1``: ``sum_k |d_k(a) - d_k(b)|`` level steps (0..24)
    - ``l2``: ``sqrt(sum_k (c_k(a) - c_k(b))**2)`` with ``c_k = (d_k - 2) / 2`` (0..sqrt(18))
    - ``changed_dims``: dimensions whose level differs (0..8)
    """
    pairs = torch.stack([previous.reshape(-1), current.reshape(-1)], dim=-1)
    distance = fsq_step_units(pairs, metric).view(previous.shape).to(torch.float32)
    return distance.sqrt() / 2 if metric == "l2" else distance
