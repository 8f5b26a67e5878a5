"""Log-ratio statistics against hand-computed values on a small fixed tensor."""

from __future__ import annotations

import math

import pytest
import torch

from maspo_verl.analysis import log_ratios
from reward_fns.speech_tokens import llasa_tokens as lt

# row 0: 1 -1 1 -1; row 1: 2 2 (then padding, whose value must not count)
D = torch.tensor([[1.0, -1.0, 1.0, -1.0], [2.0, 2.0, 7.0, 7.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)


def test_lag_autocorrelation_by_hand():
    # mean 2/3; centred values 1/3 -5/3 1/3 -5/3 | 4/3 4/3; variance (1+25+1+25+16+16)/9/6 = 14/9
    # lag 1: pairs (1/3)(-5/3) x3 + (4/3)(4/3) = 1/9 over 4 pairs -> (1/36) / (14/9) = 1/56
    # lag 2: (1/3)(1/3) + (-5/3)(-5/3) = 26/9 over 2 -> (13/9) / (14/9) = 13/14
    # lag 3: (1/3)(-5/3) over 1 -> (-5/9) / (14/9) = -5/14; lag 4: no pair inside a response
    r = log_ratios.lag_autocorrelation(D, MASK, max_lag=4)
    assert r[:3].tolist() == pytest.approx([1 / 56, 13 / 14, -5 / 14], abs=1e-12)
    assert math.isnan(r[3])


def test_lag_autocorrelation_of_constant_log_ratios_is_nan_not_a_division_by_zero():
    r = log_ratios.lag_autocorrelation(torch.ones(2, 5), torch.ones(2, 5, dtype=torch.bool), max_lag=2)
    assert torch.isnan(r).all()


def test_window_log_ratio_std_by_hand():
    # L = 1: the six valid values, population std sqrt(14/9)
    assert log_ratios.window_log_ratio_std(D, MASK, 1) == (pytest.approx(math.sqrt(14) / 3, abs=1e-12), 6)
    # L = 2: full windows (1, -1) (1, -1) (2, 2) -> means 0 0 2; the half-padded window of row 1 does not count
    assert log_ratios.window_log_ratio_std(D, MASK, 2) == (pytest.approx(math.sqrt(8) / 3, abs=1e-12), 3)
    # L = 4: one full window only: no spread to measure
    std, count = log_ratios.window_log_ratio_std(D, MASK, 4)
    assert math.isnan(std) and count == 1
    with pytest.raises(ValueError, match="window length"):
        log_ratios.window_log_ratio_std(D, MASK, 0)


def test_length_exponent_recovers_a_power_law_and_skips_missing_points():
    lengths = [1, 2, 4, 8, 16]
    assert log_ratios.length_exponent(lengths, [0.7 * L**-0.3 for L in lengths]) == pytest.approx(0.3)
    assert log_ratios.length_exponent(lengths, [0.7, 0.7, 0.7, float("nan"), 0.0]) == pytest.approx(0.0, abs=1e-12)
    assert math.isnan(log_ratios.length_exponent(lengths, [1.0, *[float("nan")] * 4]))


def test_threshold_for_length_picks_the_candidate_nearest_the_target():
    codes = [0, 0, 100, 100, 100, 100, 5000, 5000]  # raw-id jumps of 100 and 4900
    ids = torch.tensor([[lt.CODEC_OFFSET + c for c in codes]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    old = torch.zeros(ids.shape)
    # threshold 0 or 50: both jumps cut -> segments 2, 4, 2 (mean 8/3); 10000: one segment of 8
    assert log_ratios.threshold_for_length("token_jump", [0, 50, 10000], 8, old, mask, ids) == (10000, 8.0)
    assert log_ratios.threshold_for_length("token_jump", [0, 50, 10000], 3, old, mask, ids) == (0, pytest.approx(8 / 3))
    # threshold 1000 cuts at the 4900 jump only: 6, 2
    assert log_ratios.threshold_for_length("token_jump", [1000, 10000], 4, old, mask, ids) == (1000, 4.0)
