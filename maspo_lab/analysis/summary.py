"""Means and 95 % intervals over repeats (a fidelity measurement's, `maspo_lab.analysis.fidelity.measure`; a long
run's seeds or sentences) and over the steps of one run, and the table cell that prints one (`interval_cell`).

Over independent repeats (`mean_interval`), an interval is ``mean +- t_{0.975, n-1} * std / sqrt(n)`` over the
``n`` repeats (Student's t; NaN for n < 2). The steps of one run are not independent draws (neighbouring steps share
the model's state, and a drifting run's differences are autocorrelated), so a mean over steps gets batch means
instead (`batch_means_interval`): the t interval of the means of `BATCHES` contiguous blocks of steps.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from maspo_lab.analysis import log_ratios


def mean_interval(values: Iterable[float], level: float = 0.95) -> tuple[float, float, int]:
    """(mean, half-width of the t interval at ``level`` (95 % by default), count) of the finite values, taken as
    independent draws (seeds, sentences, repeats; the steps of one run are not: `batch_means_interval`)."""
    from scipy.stats import t as student_t

    finite = [v for v in values if math.isfinite(v)]
    n = len(finite)
    if n == 0:
        return float("nan"), float("nan"), 0
    mean = sum(finite) / n
    if n < 2:
        return mean, float("nan"), n
    std = math.sqrt(sum((v - mean) ** 2 for v in finite) / (n - 1))
    return mean, float(student_t.ppf((1 + level) / 2, n - 1)) * std / math.sqrt(n), n


BATCHES = 10
"""How many contiguous batches `batch_means_interval` cuts a run's steps into: 20 steps each in a 200-step run, 10 in
its second half. Fixed rather than growing with the run, so that the t quantile (9 degrees of freedom: 2.262) and
what a batch holds are the same in every table; each batch needs 2 steps or more."""


def batch_means_interval(
    values: Iterable[float], batches: int = BATCHES, level: float = 0.95
) -> tuple[float, float, int]:
    """(mean, half-width of the batch-means t interval at ``level``, count) of the finite values of one run's steps,
    in step order. Non-overlapping batch means: with ``n`` values, ``k = batches`` and ``b = n // k`` steps a batch,
    the last ``k * b`` values are cut into ``k`` contiguous batches (the first ``n - k * b`` steps sit in none) and

        Ybar_j = mean of batch j                                   j = 1..k
        half-width = t_{0.975, k-1} * sd_j(Ybar_j) / sqrt(k)

    around the mean of all ``n`` values. Batches of ``b`` steps are close to independent when the series'
    autocorrelation dies out within ``b`` steps, so the interval counts the drift that a t interval over the steps
    (`mean_interval`, which takes them as independent draws) misses: with lag-1 autocorrelation ``rho`` (AR(1)),
    the naive half-width is too narrow by about ``sqrt((1 + rho) / (1 - rho))``. NaN half-width for fewer than
    ``2 * batches`` values (a batch of one step is no batch)."""
    from scipy.stats import t as student_t

    if batches < 2:
        raise ValueError(f"batch means need at least 2 batches, got batches={batches}")
    finite = [v for v in values if math.isfinite(v)]
    n = len(finite)
    mean = sum(finite) / n if n else float("nan")
    size = n // batches
    if size < 2:
        return mean, float("nan"), n
    kept = finite[n - batches * size :]
    means = [sum(kept[j * size : (j + 1) * size]) / size for j in range(batches)]
    centre = sum(means) / batches
    sd = math.sqrt(sum((m - centre) ** 2 for m in means) / (batches - 1))
    return mean, float(student_t.ppf((1 + level) / 2, batches - 1)) * sd / math.sqrt(batches), n


def interval_cell(mean: float, half: float, digits: int = 3, sign: bool = False, of: tuple[int, int] = (0, 0)) -> str:
    """A table cell: mean +- 95 % half-width (left out where there is none, one value), "-" without a mean; ``of``:
    (seeds paired, seeds of the row), named when a paired figure rests on fewer seeds than the row."""
    if not math.isfinite(mean):
        return "-"
    text = f"{mean:+.{digits}f}" if sign else f"{mean:.{digits}f}"
    text += f" +- {half:.{digits}f}" if math.isfinite(half) else ""
    return text + (f" ({of[0]} of {of[1]} seeds)" if of[0] < of[1] else "")


def estimator_table(rows: Sequence[dict[str, Any]], references: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per estimator, clip and k: cosine with the reference (mean, interval), relative norm, clip fraction,
    and the k's ppo_kl, half-split cosine and noise ceiling (means over repeats)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        groups[(row["estimator"], row["clip"], row["k"])].append(row)
    per_k: dict[int, list[dict]] = defaultdict(list)
    for reference in references:
        per_k[reference["k"]].append(reference)
    table = []
    for (estimator, clip, k), members in groups.items():
        cos, cos_ci, n = mean_interval(r["cosine"] for r in members)
        norm, norm_ci, _ = mean_interval(r["relative_norm"] for r in members)
        table.append(
            {
                "estimator": estimator,
                "clip": clip,
                "k": k,
                "repeats": n,
                "cosine": cos,
                "cosine_ci95": cos_ci,
                "relative_norm": norm,
                "relative_norm_ci95": norm_ci,
                "clip_fraction": mean_interval(r["clip_fraction"] for r in members)[0],
                "ppo_kl": mean_interval(r["ppo_kl"] for r in per_k[k])[0],
                "half_split_cosine": mean_interval(r["half_split_cosine"] for r in per_k[k])[0],
                "noise_ceiling": mean_interval(r["ceiling"] for r in per_k[k])[0],
            }
        )
    return table


SHORT_WINDOW = 8
"""The longest window of the short-window exponent (``short_length_exponent``): 8 codes, 160 ms, phoneme-sized. Less
each response's mean, long windows are shrunk by the centring itself (a window of half a response has a mean near 0
whatever the tokens do), which steepens a fit over every length."""


def log_ratio_table(stats: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per k > 0, for ``d`` and for ``d`` less each response's mean (``within_``; `log_ratios.within_response`):
    the autocorrelation by lag and the window std by length, means and 95 % intervals over repeats; the exponent
    gamma of ``std ~ L**-gamma`` fitted to the mean stds (``length_exponent``) and fitted per repeat (its mean and
    interval over repeats), over every length and over lengths up to `SHORT_WINDOW` (``short_length_exponent``);
    the share of the variance the responses' means hold (``shared_fraction``)."""
    per_k: dict[int, list[dict]] = defaultdict(list)
    for stat in stats:
        per_k[stat["k"]].append(stat)
    table = []
    for k in sorted(per_k):
        members = per_k[k]
        lengths = sorted(int(L) for L in members[0]["window_std"])
        row: dict[str, Any] = {"k": k, "repeats": len(members), "window_lengths": lengths}
        for prefix in ("", "within_"):
            lags = len(members[0][f"{prefix}autocorrelation"])
            autocorrelation = [mean_interval(m[f"{prefix}autocorrelation"][i] for m in members) for i in range(lags)]
            stds = [mean_interval(m[f"{prefix}window_std"][str(L)] for m in members) for L in lengths]
            row |= {
                f"{prefix}autocorrelation": [mean for mean, _, _ in autocorrelation],
                f"{prefix}autocorrelation_ci95": [ci for _, ci, _ in autocorrelation],
                f"{prefix}window_std": [mean for mean, _, _ in stds],
                f"{prefix}window_std_ci95": [ci for _, ci, _ in stds],
            }
            for name, fitted in (("", lengths), ("short_", [L for L in lengths if L <= SHORT_WINDOW])):
                mean_stds = [mean for L, (mean, _, _) in zip(lengths, stds) if L in fitted]
                per_repeat = [
                    log_ratios.length_exponent(fitted, [m[f"{prefix}window_std"][str(L)] for L in fitted])
                    for m in members
                ]
                exponent, exponent_ci, _ = mean_interval(per_repeat)
                row |= {
                    f"{prefix}{name}length_exponent": log_ratios.length_exponent(fitted, mean_stds),
                    f"{prefix}{name}length_exponent_per_repeat": exponent,
                    f"{prefix}{name}length_exponent_per_repeat_ci95": exponent_ci,
                }
        shared, shared_ci, _ = mean_interval(m["shared_fraction"] for m in members)
        table.append(row | {"shared_fraction": shared, "shared_fraction_ci95": shared_ci})
    return table
