"""adv_estimator=maspo with credit_mode=per_unit: each aligned unit (the code ear's phonemes) credited against the
same unit in the group's other responses. Hand-computed values, grpo where there is no credit, invariances."""

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

from maspo_base.frame_errors import encode_frame_errors
from maspo_base.frame_words import encode_frame_words
from maspo_verl.advantage import compute_maspo_credit_advantage
from maspo_verl.credit_config import CreditConfig
from maspo_verl.verl_patches.trainer import credit_inputs_for

EPS = 1e-6
S = 128264  # id of <|s_0|>
END = 128261
SETTINGS = CreditConfig.from_mapping({"credit_mode": "per_unit"})


def algorithm(credit_weight=0.5, norm=True):
    block = {"credit_weight": credit_weight, "credit_mode": "per_unit"}
    return OmegaConf.create({"adv_estimator": "maspo", "norm_adv_by_std_in_grpo": norm, "maspo": block})


def batch(rows):
    """``rows``: (score, frame errors, frame units) per response, each response its frames then the end tag."""
    width = max(len(e) for _, e, _ in rows) + 1
    responses = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    rewards = torch.zeros((len(rows), width), dtype=torch.float64)
    for b, (score, errors, _) in enumerate(rows):
        n = len(errors)
        responses[b, :n] = S + torch.arange(n)
        responses[b, n] = END
        mask[b, : n + 1] = 1
        rewards[b, n] = score
    errors = [encode_frame_errors(e) if e is not None else "" for _, e, _ in rows]
    units = [encode_frame_words(u) if u is not None else "" for _, _, u in rows]
    return responses, mask, rewards, credit_inputs_for(responses, mask, errors, SETTINGS, units)


def grpo(rewards, mask, index, norm=True):
    return compute_grpo_outcome_advantage(rewards, mask, index, epsilon=EPS, norm_adv_by_std_in_grpo=norm)[0]


def test_hand_computed_group_of_three():
    # unit 0's errors 0.2, 0.4, 0.6 (mean 0.4, std 0.2): a = +1, 0, -1; unit 1's 0.8, 0.4, 0.0 (std 0.4): -1, 0, +1
    rows = [
        (1.0, [0.2, 0.2, 0.8, 0.8], [0, 0, 1, 1]),
        (0.0, [0.4, 0.4, 0.4], [0, 1, 1]),
        (0.5, [0.0, 0.6, 0.6, 0.0], [-1, 0, 0, 1]),  # a frame before the first unit: no unit credit
    ]
    responses, mask, rewards, inputs = batch(rows)
    index = np.array(["g"] * 3, dtype=object)
    adv, _ = compute_maspo_credit_advantage(rewards, mask, index, config=algorithm(0.5), credit_inputs=inputs)
    outcome = grpo(rewards, mask, index)
    expected = outcome.clone()
    for b, unit_advantage in enumerate(([1, 1, -1, -1], [0, 0, 0], [0, -1, -1, 1])):
        expected[b, : len(unit_advantage)] += 0.5 * torch.tensor(unit_advantage, dtype=torch.float64)
    torch.testing.assert_close(adv, expected * mask, atol=1e-5, rtol=0)
    assert inputs.metrics["maspo_credit/credited_unit_fraction"] == 1.0


def test_without_std_normalisation_unit_credit_is_the_error_difference():
    rows = [(1.0, [0.2, 0.8], [0, 1]), (0.0, [0.6, 0.4], [0, 1])]
    responses, mask, rewards, inputs = batch(rows)
    index = np.array(["g", "g"], dtype=object)
    adv, _ = compute_maspo_credit_advantage(
        rewards, mask, index, config=algorithm(1.0, norm=False), credit_inputs=inputs
    )
    outcome = grpo(rewards, mask, index, norm=False)
    torch.testing.assert_close(
        adv[:, :2] - outcome[:, :2], torch.tensor([[0.2, -0.2], [-0.2, 0.2]], dtype=torch.float64)
    )


@pytest.mark.parametrize("seed", range(3))
def test_lambda_zero_and_unaligned_responses_are_grpo_bit_for_bit(seed):
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(6):
        n = int(rng.integers(2, 9))
        units = np.sort(rng.integers(-1, 4, n)).tolist()
        rows.append((float(rng.random()), rng.random(n).round(3).tolist(), units))
    rows[1] = (rows[1][0], rows[1][1], None)  # no alignment reported
    responses, mask, rewards, inputs = batch(rows)
    index = np.array(["a", "b"] * 3, dtype=object)
    outcome = grpo(rewards, mask, index)
    zero, _ = compute_maspo_credit_advantage(rewards, mask, index, config=algorithm(0.0), credit_inputs=inputs)
    assert torch.equal(zero, outcome)
    some, _ = compute_maspo_credit_advantage(rewards, mask, index, config=algorithm(0.5), credit_inputs=inputs)
    assert torch.equal(some[1], outcome[1]) and not bool(inputs.aligned[1])
    assert inputs.metrics["maspo_credit/unaligned_samples"] == 1.0


def test_a_unit_only_one_response_aligned_gets_no_credit_and_groups_stay_apart():
    rows = [
        (1.0, [0.9, 0.1], [0, 1]),
        (0.0, [0.1], [0]),  # unit 1 only in response 0 of group g
        (1.0, [0.5, 0.5], [0, 1]),  # group h: alone, nothing to compare
    ]
    responses, mask, rewards, inputs = batch(rows)
    index = np.array(["g", "g", "h"], dtype=object)
    adv, _ = compute_maspo_credit_advantage(rewards, mask, index, config=algorithm(0.5), credit_inputs=inputs)
    credit = adv - grpo(rewards, mask, index)
    assert credit[0, 1] == 0 and credit[2].abs().sum() == 0
    assert credit[0, 0] == pytest.approx(-0.5 * 0.4 / 0.565685, rel=1e-5)  # (0.9, 0.1): deviation 0.4, std 0.5657
    assert credit[0, 0] == pytest.approx(-credit[1, 0])
    assert inputs.metrics["maspo_credit/credited_unit_fraction"] == pytest.approx(2 / 5)


def test_row_order_does_not_change_any_rows_advantage():
    rng = np.random.default_rng(7)
    rows = [(float(rng.random()), rng.random(5).round(3).tolist(), [0, 0, 1, 2, 2]) for _ in range(6)]
    index = np.array(["a", "b", "a", "b", "a", "b"], dtype=object)
    order = rng.permutation(6)
    _, mask, rewards, inputs = batch(rows)
    adv, _ = compute_maspo_credit_advantage(rewards, mask, index, config=algorithm(), credit_inputs=inputs)
    _, mask_p, rewards_p, inputs_p = batch([rows[i] for i in order])
    adv_p, _ = compute_maspo_credit_advantage(
        rewards_p, mask_p, index[order], config=algorithm(), credit_inputs=inputs_p
    )
    torch.testing.assert_close(adv_p, adv[order], atol=1e-12, rtol=0)


def test_per_unit_credit_needs_the_units_and_the_mode_is_checked():
    with pytest.raises(Exception, match="credit_mode"):
        CreditConfig.from_mapping({"credit_mode": "per_word"})
    responses = torch.tensor([[S, END]])
    inputs = credit_inputs_for(responses, torch.ones_like(responses), ["0.5"], CreditConfig.from_mapping({}))
    rewards = torch.tensor([[0.0, 1.0]], dtype=torch.float64)
    with pytest.raises(ValueError, match="frame_words"):
        compute_maspo_credit_advantage(
            rewards, torch.ones_like(responses), np.array(["g"]), config=algorithm(), credit_inputs=inputs
        )
