"""A finite scalar quantiser's lattice (FSQ, Mentzer et al. 2023): a codec id as mixed-radix digits.

With levels ``L_0 .. L_{D-1}`` a codec id is

    id = sum_k d_k * prod_{j<k} L_j,      d_k in [0, L_k)      (dimension 0 least significant)

as `vector_quantize_pytorch.FSQ` numbers its codes (XCodec2: 8 dimensions of 4 levels; the mini codec: 5 of 4). The
code value on dimension k is ``c_k = (d_k - h_k) / h_k`` with ``h_k = L_k // 2``; the zero code has every
``d_k = h_k``. Distances between consecutive codes are measured on the digits (`FsqLattice.step_distance`):

- ``l1``: ``sum_k |d_k(a) - d_k(b)|``, level steps;
- ``l2``: ``sqrt(sum_k (c_k(a) - c_k(b))**2)``, in code units;
- ``changed_dims``: the number of dimensions whose level differs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

FSQ_METRICS = ("l1", "l2", "changed_dims")


@dataclass(frozen=True)
class FsqLattice:
    """The digits of an FSQ codebook with ``levels`` per dimension."""

    levels: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.levels or any(int(n) < 2 for n in self.levels):
            raise ValueError(f"FSQ levels must be >= 2 per dimension, got {self.levels}")

    @property
    def dims(self) -> int:
        return len(self.levels)

    @property
    def codebook_size(self) -> int:
        return math.prod(self.levels)

    @property
    def place_values(self) -> tuple[int, ...]:
        """``prod_{j<k} L_j`` for each dimension k."""
        values, value = [], 1
        for n in self.levels:
            values.append(value)
            value *= n
        return tuple(values)

    @property
    def zero_code(self) -> int:
        """The id whose every code value is 0 (``d_k = L_k // 2``)."""
        return sum((n // 2) * p for n, p in zip(self.levels, self.place_values))

    def digits_of(self, code: int) -> tuple[int, ...]:
        """Digits of one codec id."""
        return tuple((code // p) % n for n, p in zip(self.levels, self.place_values))

    def code_of(self, digits) -> int:
        """Codec id of digits."""
        return sum(int(d) * p for d, p in zip(digits, self.place_values))

    def digits(self, codec_ids: torch.Tensor) -> torch.Tensor:
        """Digits of each codec id: ``(..., dims)`` int64."""
        place = torch.tensor(self.place_values, device=codec_ids.device)
        levels = torch.tensor(self.levels, device=codec_ids.device)
        return (codec_ids.long().unsqueeze(-1) // place) % levels

    def max_distance(self, metric: str) -> float:
        """The largest distance between two codes under ``metric``."""
        if metric == "l1":
            return float(sum(n - 1 for n in self.levels))
        if metric == "l2":
            return math.sqrt(sum(((n - 1) / (n // 2)) ** 2 for n in self.levels))
        if metric == "changed_dims":
            return float(self.dims)
        raise ValueError(f"unknown FSQ metric {metric!r}; valid: {list(FSQ_METRICS)}")

    def step_distance(self, codec_ids: torch.Tensor, metric: str = "l1") -> torch.Tensor:
        """Distance between consecutive codes along the last dim: float32 ``(..., T - 1)`` (module docstring).

        Ids outside ``[0, codebook_size)`` are read digit by digit modulo the levels: callers mask them."""
        if metric not in FSQ_METRICS:
            raise ValueError(f"unknown FSQ metric {metric!r}; valid: {list(FSQ_METRICS)}")
        digits = self.digits(codec_ids)
        step = (digits[..., 1:, :] - digits[..., :-1, :]).abs()
        if metric == "l1":
            return step.sum(-1).float()
        if metric == "changed_dims":
            return (step > 0).sum(-1).float()
        half = torch.tensor([n // 2 for n in self.levels], device=codec_ids.device, dtype=torch.float32)
        return (step.float() / half).square().sum(-1).sqrt()
