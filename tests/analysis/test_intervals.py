"""Intervals of a mean (`maspo_lab.analysis.summary`): over independent repeats a t interval, over the steps of one
run batch means, by hand; on an autocorrelated series batch means are wider than the t interval over the steps."""

from __future__ import annotations

import math

import pytest

from maspo_lab.analysis.summary import BATCHES, batch_means_interval, mean_interval


def test_batch_means_by_hand():
    # 3 batches of 2: means 2, 3, 7 (centre 4, sd sqrt(7)), t(0.975, 2) = 4.3027
    mean, half, n = batch_means_interval([1, 3, 2, 4, 6, 8], batches=3)
    assert (mean, n) == (pytest.approx(4.0), 6)
    assert half == pytest.approx(4.302653 * math.sqrt(7) / math.sqrt(3), rel=1e-6)
    # 7 values, 3 batches of 2: the first step sits in no batch, but the mean is over all 7
    mean, half7, n = batch_means_interval([100, 1, 3, 2, 4, 6, 8], batches=3)
    assert (mean, n) == (pytest.approx(124 / 7), 7) and half7 == pytest.approx(half)


def test_batch_means_are_the_t_interval_of_the_batch_means():
    values = [0.1 * ((7 * i) % 11) for i in range(40)]  # 10 batches of 4
    means = [sum(values[4 * j : 4 * j + 4]) / 4 for j in range(BATCHES)]
    _, expected, _ = mean_interval(means)
    assert batch_means_interval(values)[1] == pytest.approx(expected)


def _ar1(rho: float, innovations: list[float]) -> list[float]:
    """x_t = rho x_{t-1} + e_t, from x_0 = e_0."""
    series = [innovations[0]]
    for e in innovations[1:]:
        series.append(rho * series[-1] + e)
    return series


def test_on_a_strongly_autocorrelated_series_batch_means_are_wider_than_the_t_interval_over_steps():
    import numpy as np

    innovations = np.random.default_rng(0).standard_normal(200).tolist()
    # independent draws: the two agree to within the batch means' own noise (9 degrees of freedom; over generator
    # seeds 0-499 the ratio ranged 0.44-1.80, so no seed is lucky here)
    _, naive, _ = mean_interval(innovations)
    _, batched, _ = batch_means_interval(innovations)
    assert 0.3 < batched / naive < 2.5
    # AR(1) at rho = 0.9: the mean's standard error is sqrt((1 + rho) / (1 - rho)) = 4.4 times the naive one's;
    # batches of 20 steps (about 2 of the series' correlation times, 1 / (1 - rho) = 10) keep most of it (over
    # generator seeds 0-499 the ratio was 2.09 at the least, 3.7 on average)
    series = _ar1(0.9, innovations)
    _, naive, _ = mean_interval(series)
    _, batched, _ = batch_means_interval(series)
    assert batched > 1.5 * naive


def test_a_slow_drift_is_wide_by_construction():
    # +1 for 20 steps, -1 for 20 steps, ...: lag-1 autocorrelation 0.9; the 10 batches of 20 are +-1 in turn, so
    # batch means give t(0.975, 9) * sd(+-1) / sqrt(10) where the steps give t(0.975, 199) * 1 / sqrt(200)
    series = [1.0 if (i // 20) % 2 == 0 else -1.0 for i in range(200)]
    _, naive, _ = mean_interval(series)
    mean, batched, _ = batch_means_interval(series)
    assert mean == pytest.approx(0.0)
    assert batched == pytest.approx(2.262157 * math.sqrt(10 / 9) / math.sqrt(10), rel=1e-5)
    assert naive == pytest.approx(1.971957 * math.sqrt(200 / 199) / math.sqrt(200), rel=1e-5)
    assert batched > 5 * naive


def test_a_constant_series_has_a_zero_half_width():
    assert batch_means_interval([0.25] * 30) == (pytest.approx(0.25), 0.0, 30)


def test_too_short_a_series_has_a_mean_and_no_interval():
    mean, half, n = batch_means_interval([1.0] * (2 * BATCHES - 1))  # batches of one step are no batches
    assert (mean, n) == (1.0, 2 * BATCHES - 1) and math.isnan(half)
    mean, half, n = batch_means_interval([])
    assert math.isnan(mean) and math.isnan(half) and n == 0
    # non-finite values are left out, as mean_interval leaves them
    assert batch_means_interval([math.nan] + [0.5] * 20)[::2] == (pytest.approx(0.5), 20)
    with pytest.raises(ValueError, match="batches=1"):
        batch_means_interval([1.0, 2.0], batches=1)
