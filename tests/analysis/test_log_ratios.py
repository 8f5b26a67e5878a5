"""Log-ratio statistics against hand-computed values on a small fixed tensor."""

from __future__ import annotations

import math

import pytest
import torch

from maspo_base.speech_tokens import llasa_tokens as lt
from maspo_lab.analysis import log_ratios

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


def test_within_response_takes_each_responses_own_mean_away_by_hand():
    # row 0's mean is 0: unchanged; row 1's is 2 (padding not counted): 0 0, and padding stays 0
    within = log_ratios.within_response(D, MASK)
    assert within.tolist() == [[1.0, -1.0, 1.0, -1.0], [0.0, 0.0, 0.0, 0.0]]
    # its autocorrelation: mean 0, variance 4/6; lag 1: three pairs of -1 and one of 0 over 4 -> (-3/4) / (2/3)
    r = log_ratios.lag_autocorrelation(within, MASK, max_lag=2)
    assert r.tolist() == pytest.approx([-9 / 8, (1 + 1) / 2 / (2 / 3)], abs=1e-12)


def test_shared_fraction_by_hand():
    # mean 2/3; total sum of squares 6 x 14/9 = 28/3; within the responses 4 (row 0) + 0 (row 1): shared 16/28
    assert log_ratios.shared_fraction(D, MASK) == pytest.approx(4 / 7, abs=1e-12)
    each_moves_as_one = torch.tensor([[0.5, 0.5, 0.5], [-1.0, -1.0, 9.0]])
    assert log_ratios.shared_fraction(each_moves_as_one, torch.tensor([[1, 1, 1], [1, 1, 0]])) == pytest.approx(1.0)
    assert log_ratios.shared_fraction(torch.tensor([[1.0, -1.0]]), torch.ones(1, 2)) == pytest.approx(0.0)
    assert math.isnan(log_ratios.shared_fraction(torch.ones(2, 3), torch.ones(2, 3)))


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


def test_log_ratio_table_gives_intervals_over_repeats_and_the_exponent_per_repeat():
    from scipy.stats import t as student_t

    from maspo_lab.analysis import summary

    def stat(repeat, stds, within_stds, autocorrelation, shared):
        return {
            "repeat": repeat,
            "k": 4,
            "autocorrelation": autocorrelation,
            "within_autocorrelation": [a / 2 for a in autocorrelation],
            "window_std": {str(L): s for L, s in zip((1, 2, 4), stds)},
            "within_window_std": {str(L): s for L, s in zip((1, 2, 4), within_stds)},
            "window_count": {"1": 8, "2": 4, "4": 2},
            "shared_fraction": shared,
        }

    independent = [1.0, 2**-0.5, 0.5]  # gamma 0.5
    one_piece = [1.0, 1.0, 1.0]  # gamma 0
    (row,) = summary.log_ratio_table(
        [stat(0, independent, one_piece, [0.2, 0.1], 0.3), stat(1, one_piece, one_piece, [0.4, 0.3], 0.5)]
    )
    t = float(student_t.ppf(0.975, 1))
    assert row["k"] == 4 and row["repeats"] == 2 and row["window_lengths"] == [1, 2, 4]
    assert row["autocorrelation"] == pytest.approx([0.3, 0.2])
    # two values 0.2 apart: std 0.1 sqrt(2), interval t std / sqrt(2) = 0.1 t
    assert row["autocorrelation_ci95"] == pytest.approx([t * 0.1] * 2)
    assert row["within_autocorrelation"] == pytest.approx([0.15, 0.1])
    assert row["window_std"] == pytest.approx([1.0, (1 + 2**-0.5) / 2, 0.75])
    assert row["length_exponent"] == pytest.approx(log_ratios.length_exponent([1, 2, 4], row["window_std"]))
    assert row["length_exponent_per_repeat"] == pytest.approx(0.25)
    assert row["length_exponent_per_repeat_ci95"] == pytest.approx(t * 0.25)
    assert row["within_length_exponent"] == pytest.approx(0.0, abs=1e-12)
    assert row["within_length_exponent_per_repeat_ci95"] == pytest.approx(0.0, abs=1e-12)
    # the short-window fit: every length here is <= 8, so it is the fit over every length
    assert row["short_length_exponent_per_repeat"] == row["length_exponent_per_repeat"]
    assert row["shared_fraction"] == pytest.approx(0.4)
    assert row["shared_fraction_ci95"] == pytest.approx(t * 0.1)


def test_the_short_window_exponent_leaves_out_windows_longer_than_a_phoneme():
    from maspo_lab.analysis import summary

    lengths = (1, 2, 4, 8, 16, 64)
    stds = [L**-0.3 if L <= summary.SHORT_WINDOW else L**-0.3 * 0.1 for L in lengths]  # long windows shrunk
    stat = {
        "repeat": 0,
        "k": 1,
        "shared_fraction": 0.5,
        **{f"{p}autocorrelation": [0.1] for p in ("", "within_")},
        **{f"{p}window_std": {str(L): s for L, s in zip(lengths, stds)} for p in ("", "within_")},
    }
    (row,) = summary.log_ratio_table([stat])
    assert row["short_length_exponent"] == pytest.approx(0.3) == row["within_short_length_exponent"]
    assert row["length_exponent"] > 0.5  # the shrunk long windows steepen the fit over every length
    assert math.isnan(row["short_length_exponent_per_repeat_ci95"])  # one repeat: no interval
