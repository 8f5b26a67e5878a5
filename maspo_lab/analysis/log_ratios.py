"""Structure of the token log-ratios ``d_t = log pi_theta(y_t) - log pi_old(y_t)`` of a batch of responses.

Two statistics tell whether a segment ratio averages noise away or not:

- `lag_autocorrelation`: how alike ``d_t`` and ``d_{t+lag}`` are within a response. With ``m`` the mean and
  ``v = mean (d_t - m)**2`` over all response tokens, and ``P_lag`` the pairs ``(t, t+lag)`` of one response,

      r(lag) = mean_{(t, t+lag) in P_lag} (d_t - m)(d_{t+lag} - m) / v

  (0 when tokens are independent, 1 when a response moves as one).
- `window_log_ratio_std`: the std over all full windows of ``L`` tokens (``t // L``, as the ``fixed`` segmenter
  cuts) of the segment log-ratio ``l = (1/L) sum_{t in window} d_t``. Independent tokens give
  ``std(l) = std(d) L**-1/2``, the shrinkage MASPO's default ``clip_length_exponent = 0.5`` assumes; perfectly
  correlated ones give ``L**0``. `length_exponent` fits ``std(l) ~ L**-gamma`` (least squares on the logs).

A shift shared by a whole response (every code of it moved the same way) shows as correlation at every lag. One
sequence ratio (GSPO's) carries that shift already; what segments add over it is the rest.
`within_response` takes each response's own mean away, ``e_t = d_t - mean_{s in response} d_s``, so that the
same two statistics of ``e`` say whether what is left has segment-sized structure; `shared_fraction` is the share
of ``d``'s variance that the responses' means hold,

    shared = sum_i T_i (m_i - m)**2 / sum_{i, t} (d_it - m)**2

(``m_i`` response ``i``'s mean over its ``T_i`` tokens: 1 when each response moves as one, about ``1/T`` when
tokens are independent). Centring within a response biases ``e``'s autocorrelation by about ``-1/(T - 1)``.

`threshold_for_length` picks, for a threshold segmenter, the threshold whose mean segment length is nearest a
target, from the segmenter's own layout on given responses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def lag_autocorrelation(log_ratio: torch.Tensor, mask: torch.Tensor, max_lag: int) -> torch.Tensor:
    """``r(lag)`` for lag ``1..max_lag`` (module docstring), ``(max_lag,)``; NaN where no pair exists or ``v = 0``.

    ``log_ratio`` and ``mask`` are ``(B, T)``; a pair needs both tokens inside the mask."""
    mask = mask.bool()
    values = log_ratio.to(torch.float64)
    count = mask.sum()
    mean = values[mask].sum() / count.clamp(min=1)
    centred = torch.where(mask, values - mean, values.new_zeros(()))
    variance = centred.pow(2).sum() / count.clamp(min=1)
    result = torch.full((max_lag,), float("nan"), dtype=torch.float64)
    for lag in range(1, min(max_lag, values.shape[-1] - 1) + 1):
        pairs = mask[:, lag:] & mask[:, :-lag]
        n = int(pairs.sum())
        if n and float(variance) > 0:
            result[lag - 1] = (centred[:, lag:] * centred[:, :-lag] * pairs).sum() / n / variance
    return result


def within_response(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``e_t = d_t - mean_{s in response} d_s`` inside the mask, 0 outside (module docstring), float64."""
    mask = mask.bool()
    values = torch.where(mask, log_ratio.to(torch.float64), 0.0)
    means = values.sum(dim=-1, keepdim=True) / mask.sum(dim=-1, keepdim=True).clamp(min=1)
    return torch.where(mask, values - means, 0.0)


def shared_fraction(log_ratio: torch.Tensor, mask: torch.Tensor) -> float:
    """The share of ``d_t``'s variance over all response tokens that the responses' own means hold (module
    docstring); NaN when ``d`` does not vary."""
    mask = mask.bool()
    values = torch.where(mask, log_ratio.to(torch.float64), 0.0)
    total = ((values - values[mask].mean()) * mask).pow(2).sum()
    within = within_response(log_ratio, mask).pow(2).sum()
    return float((total - within) / total) if float(total) > 0 else float("nan")


def window_log_ratio_std(log_ratio: torch.Tensor, mask: torch.Tensor, length: int) -> tuple[float, int]:
    """(std, count) of the mean log-ratio over every full window of ``length`` tokens (windows ``t // length`` of a
    right-padded response, all inside the mask); population std (divide by count), NaN when count < 2."""
    if length < 1:
        raise ValueError(f"window length must be >= 1, got {length}")
    batch, width = log_ratio.shape
    full = width // length
    if full == 0:
        return float("nan"), 0
    values = log_ratio[:, : full * length].to(torch.float64).reshape(batch, full, length)
    inside = mask[:, : full * length].bool().reshape(batch, full, length).all(dim=-1)
    means = values.mean(dim=-1)[inside]
    if means.numel() < 2:
        return float("nan"), int(means.numel())
    return float(means.std(correction=0)), int(means.numel())


def length_exponent(lengths: Sequence[int], stds: Sequence[float]) -> float:
    """gamma of the least-squares fit ``log std = c - gamma log L`` over the finite, positive stds; NaN below 2."""
    points = [(math.log(L), math.log(s)) for L, s in zip(lengths, stds) if math.isfinite(s) and s > 0]
    if len(points) < 2:
        return float("nan")
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    return -sxy / sxx


def mean_segment_length(settings, old_log_prob: torch.Tensor, mask: torch.Tensor, response_ids: torch.Tensor) -> float:
    """Mean length of the segments a `maspo_verl.config.MaspoConfig`'s segmenter cuts these responses into."""
    layout = settings.segment_layout(old_log_prob, mask.bool(), response_ids)
    return float(layout.lengths[1 : layout.num_segments + 1].to(torch.float64).mean())


def threshold_for_length(
    segmenter: str,
    candidates: Sequence[float],
    target: float,
    old_log_prob: torch.Tensor,
    mask: torch.Tensor,
    response_ids: torch.Tensor,
    codec: dict | None = None,
) -> tuple[float, float]:
    """(threshold, its mean segment length): the candidate threshold of ``segmenter`` whose mean segment length on
    these responses is nearest ``target`` (the smaller threshold on a tie). ``codec``: the ``maspo.codec`` settings
    that read the responses' ids (Llasa-1B's layout by default; ``{"layout": "mini-llasa"}`` on the speech task)."""
    from maspo_verl.config import MaspoConfig

    best = None
    for threshold in candidates:
        values = {"segmenter": {"name": segmenter, "threshold": threshold}, **({"codec": codec} if codec else {})}
        settings = MaspoConfig.from_mapping(values, key="segmenter")
        length = mean_segment_length(settings, old_log_prob, mask, response_ids)
        if best is None or abs(length - target) < abs(best[1] - target):
            best = (threshold, length)
    return best
