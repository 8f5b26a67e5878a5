"""The reward formula with hand-computed values."""

import math

import pytest

from reward_fns.reward import RewardConfig, compose, duration_score, intelligibility


def test_default_reward_is_one_minus_tanh_of_three_times_the_error():
    cfg = RewardConfig()
    assert compose(cfg, 0.0, 2.0, 10, "zh")["score"] == 1.0
    assert compose(cfg, 1 / 6, 2.0, 10, "zh")["score"] == pytest.approx(1 - math.tanh(0.5))  # 0.5379
    assert intelligibility(1.0, 3.0) == pytest.approx(0.004945, abs=1e-6)


def test_duration_score_is_one_inside_the_bounds_and_decays_as_a_power_outside():
    assert duration_score(5.0, (2.0, 9.0), 2.0) == 1.0
    assert duration_score(12.0, (2.0, 9.0), 2.0) == pytest.approx((9 / 12) ** 2)  # exp(-2 ln(12/9))
    assert duration_score(1.0, (2.0, 9.0), 2.0) == pytest.approx((1 / 2) ** 2)
    assert duration_score(0.0, (2.0, 9.0), 2.0) == 0.0


def test_weighted_components():
    cfg = RewardConfig(w_intelligibility=1.0, w_similarity=1.0, w_duration=2.0, similarity_max_error=0.3)
    # ER 0: r_int 1; sim 0.6 counted; 24 chars in 2 s = 12 chars/s -> r_dur 0.5625
    out = compose(cfg, 0.0, 2.0, 24, "zh", similarity=0.6)
    assert out["speech_rate"] == pytest.approx(12.0)
    assert out["score"] == pytest.approx((1.0 + 0.6 + 2 * 0.5625) / 4)
    # ER 0.5 > similarity_max_error: similarity is reported but not counted
    out = compose(cfg, 0.5, 2.0, 8, "zh", similarity=0.6)
    assert out["speech_similarity"] == 0.6 and out["speech_similarity_counted"] == 0.0
    assert out["score"] == pytest.approx((1 - math.tanh(1.5) + 0 + 2 * 1.0) / 4)
    # English uses the word bounds: 10 words in 1 s is above 4.5 words/s
    assert compose(cfg, 0.0, 1.0, 10, "en")["speech_duration_score"] == pytest.approx((4.5 / 10) ** 2)


def test_config_errors_name_the_key():
    with pytest.raises(ValueError, match="w_duartion"):
        RewardConfig.from_dict({"w_duartion": 1.0})
    with pytest.raises(ValueError, match="positive sum"):
        RewardConfig(w_intelligibility=0.0)
    with pytest.raises(ValueError, match="rate_bounds"):
        RewardConfig(rate_bounds={"char": (5.0, 2.0)})
