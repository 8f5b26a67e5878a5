"""adv_estimator=maspo: hand-computed credit, equality with veRL's grpo where there is no credit, invariances."""

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, compute_grpo_outcome_advantage

from maspo_base.frame_errors import encode_frame_errors, scatter_frame_errors
from maspo_verl.advantage import compute_maspo_credit_advantage, group_reward_unit
from maspo_verl.advantage_inputs import CreditInputs, provide_credit_inputs
from maspo_verl.verl_patches.trainer import credit_inputs_for

EPS = 1e-6
S = 128264  # id of <|s_0|>: token S + c is codec frame c
END = 128261  # <|SPEECH_GENERATION_END|>


def algorithm(credit_weight=0.5, norm=True):
    return OmegaConf.create(
        {"adv_estimator": "maspo", "norm_adv_by_std_in_grpo": norm, "maspo": {"credit_weight": credit_weight}}
    )


def outcome_rewards(scores, mask):
    """veRL's layout: the score on the last valid token."""
    rewards = torch.zeros(mask.shape, dtype=torch.float64)
    last = mask.sum(-1) - 1
    rewards[torch.arange(len(scores)), last] = torch.tensor(scores, dtype=torch.float64)
    return rewards


def grpo(rewards, mask, index, norm=True):
    return compute_grpo_outcome_advantage(rewards, mask, index, epsilon=EPS, norm_adv_by_std_in_grpo=norm)[0]


def test_registered_under_maspo():
    assert ADV_ESTIMATOR_REGISTRY["maspo"] is compute_maspo_credit_advantage


def test_hand_computed_group():
    # one group of 3; rows: [4 frames + end], [2 frames + end + pad pad], [1 frame, pad...]
    responses = torch.tensor(
        [
            [S + 1, S + 2, S + 3, S + 4, END],
            [S + 5, S + 6, END, 0, 0],
            [S + 7, 0, 0, 0, 0],
        ]
    )
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    scores = [1.0, 0.0, 0.5]
    signals = [encode_frame_errors([0, 1, 0, 0]), encode_frame_errors([1, 1]), encode_frame_errors([1])]
    inputs = credit_inputs_for(responses, mask, signals, _settings())
    rewards = outcome_rewards(scores, mask)
    index = np.array(["a", "a", "a"], dtype=object)
    adv, returns = compute_maspo_credit_advantage(rewards, mask, index, config=algorithm(0.5), credit_inputs=inputs)

    std = 0.5  # unbiased std of (1, 0, 0.5)
    a = [(s - 0.5) / (std + EPS) for s in scores]
    u = std / (std + EPS)
    # row 0: ebar = 1/4, credit 0.5 * u * (0.25 - e): frames +0.125, -0.375; the end tag keeps A_0
    c_ok, c_bad = 0.5 * u * 0.25, 0.5 * u * (0.25 - 1)
    expected = torch.tensor(
        [
            [a[0] + c_ok, a[0] + c_bad, a[0] + c_ok, a[0] + c_ok, a[0]],
            [a[1], a[1], a[1], 0, 0],  # all frames wrong: no credit
            [a[2], 0, 0, 0, 0],  # length 1: no credit
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-12)
    assert adv is returns or torch.equal(adv, returns)
    assert adv[0, 1] < adv[0, 0]  # within the best response the flagged frame is pushed up less
    # the response's total push is GRPO's
    torch.testing.assert_close(adv.sum(-1), grpo(rewards, mask, index).sum(-1), rtol=0, atol=1e-12)
    assert inputs.metrics == pytest.approx(
        {
            "maspo_credit/flagged_frame_fraction": 4 / 7,
            "maspo_credit/credit_abs_mean": (3 * c_ok - c_bad) / 7,
            "maspo_credit/unaligned_samples": 0.0,
        }
    )


def test_negative_advantage_and_graded_errors():
    # two groups; the worse response of group b has graded errors
    responses = torch.tensor([[S, S, S], [S, S, S], [S, S, S], [S, S, S]])
    mask = torch.ones(4, 3, dtype=torch.long)
    scores = [0.2, 0.8, 0.0, 3.0]
    signals = [encode_frame_errors(e) for e in ([0, 0.5, 1], [0, 0, 0], [1, 0, 0], [0.25, 0.25, 0.25])]
    inputs = credit_inputs_for(responses, mask, signals, _settings())
    index = np.array([0, 0, 1, 1])
    rewards = outcome_rewards(scores, mask)
    adv, _ = compute_maspo_credit_advantage(rewards, mask, index, config=algorithm(2.0), credit_inputs=inputs)
    std_a, std_b = math.sqrt(0.18), math.sqrt(4.5)
    a0 = (0.2 - 0.5) / (std_a + EPS)
    u_a = std_a / (std_a + EPS)
    expected_row0 = [a0 + 2.0 * u_a * (0.5 - e) for e in (0, 0.5, 1)]
    torch.testing.assert_close(adv[0], torch.tensor(expected_row0, dtype=torch.float64), rtol=0, atol=1e-12)
    a2 = (0.0 - 1.5) / (std_b + EPS)
    u_b = std_b / (std_b + EPS)
    expected_row2 = [a2 + 2.0 * u_b * (1 / 3 - e) for e in (1, 0, 0)]
    torch.testing.assert_close(adv[2], torch.tensor(expected_row2, dtype=torch.float64), rtol=0, atol=1e-12)
    # rows whose frames are all equally wrong (or right) keep GRPO's advantage bit for bit
    reference = grpo(rewards, mask, index)
    assert torch.equal(adv[1], reference[1]) and torch.equal(adv[3], reference[3])


def test_without_std_normalisation_credit_is_in_reward_units():
    responses = torch.tensor([[S, S], [S, S]])
    mask = torch.ones(2, 2, dtype=torch.long)
    inputs = credit_inputs_for(responses, mask, ["1,0", "0,0"], _settings())
    rewards = outcome_rewards([2.0, 0.0], mask)
    index = np.array([7, 7])
    config = algorithm(0.5, norm=False)
    adv, _ = compute_maspo_credit_advantage(rewards, mask, index, config=config, credit_inputs=inputs)
    std = math.sqrt(2.0)
    expected = [[1.0 + 0.5 * std * (0.5 - 1), 1.0 + 0.5 * std * 0.5], [-1.0, -1.0]]
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-12)


def test_group_reward_unit_singleton_and_flat_groups():
    scores = torch.tensor([0.3, 0.5, 0.5, 1.0, 3.0], dtype=torch.float64)
    index = np.array(["solo", "flat", "flat", "g", "g"], dtype=object)
    unit = group_reward_unit(scores, index, norm_adv_by_std_in_grpo=True, epsilon=EPS)
    std_g = math.sqrt(2.0)
    torch.testing.assert_close(
        unit, torch.tensor([1 / (1 + EPS), 0.0, 0.0, std_g / (std_g + EPS), std_g / (std_g + EPS)], dtype=torch.float64)
    )
    raw = group_reward_unit(scores, index, norm_adv_by_std_in_grpo=False)
    torch.testing.assert_close(raw, torch.tensor([1.0, 0.0, 0.0, std_g, std_g], dtype=torch.float64))


def random_case(seed, batch=12, width=9, group=3):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (batch,), generator=generator)
    mask = (torch.arange(width) < lengths.unsqueeze(-1)).long()
    codes = torch.randint(0, 65536, (batch, width), generator=generator) + S
    text = torch.randint(0, 128000, (batch, width), generator=generator)
    is_code = torch.rand(batch, width, generator=generator) < 0.8
    is_code[:, 0] = True  # every response has a frame
    responses = torch.where(is_code, codes, text) * mask
    scores = torch.rand(batch, generator=generator, dtype=torch.float64).tolist()
    index = np.repeat(np.arange(batch // group), group)
    frames = ((responses >= S) & mask.bool()).sum(-1).tolist()
    signals = [
        encode_frame_errors(torch.rand(n, generator=generator).round().tolist()) if i % 4 else ""
        for i, n in enumerate(frames)
    ]
    return responses, mask, outcome_rewards(scores, mask), index, signals


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lambda_zero_is_grpo_bit_for_bit(seed, norm):
    responses, mask, rewards, index, signals = random_case(seed)
    inputs = credit_inputs_for(responses, mask, signals, _settings())
    adv, returns = compute_maspo_credit_advantage(
        rewards, mask, index, config=algorithm(0.0, norm=norm), credit_inputs=inputs
    )
    reference = grpo(rewards, mask, index, norm=norm)
    assert adv.dtype == torch.float64
    assert torch.equal(adv, reference) and torch.equal(returns, reference)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_unaligned_samples_are_grpo_bit_for_bit_and_counted(seed):
    responses, mask, rewards, index, signals = random_case(seed)
    inputs = credit_inputs_for(responses, mask, signals, _settings())
    adv, _ = compute_maspo_credit_advantage(rewards, mask, index, config=algorithm(1.0), credit_inputs=inputs)
    reference = grpo(rewards, mask, index)
    unaligned = ~inputs.aligned
    assert unaligned.sum() == 3  # rows 0, 4, 8 sent "" (no alignment)
    assert torch.equal(adv[unaligned], reference[unaligned])
    assert inputs.metrics["maspo_credit/unaligned_samples"] == 3.0
    # with credit, the sum over each response is still GRPO's, and non-frame tokens keep A_i exactly
    torch.testing.assert_close(adv.sum(-1), reference.sum(-1), rtol=0, atol=1e-9)
    off_frames = ~inputs.frame_mask
    assert torch.equal(adv[off_frames], reference[off_frames])
    assert not torch.equal(adv, reference)


def test_no_inputs_at_all_is_grpo():
    _, mask, rewards, index, _ = random_case(3)
    adv, _ = compute_maspo_credit_advantage(rewards, mask, index, config=algorithm(1.0))
    assert torch.equal(adv, grpo(rewards, mask, index))


def test_inputs_provided_by_context_are_used():
    responses = torch.tensor([[S, S], [S, S]])
    mask = torch.ones(2, 2, dtype=torch.long)
    inputs = credit_inputs_for(responses, mask, ["1,0", "0,0"], _settings())
    rewards = outcome_rewards([1.0, 0.0], mask)
    with provide_credit_inputs(inputs):
        adv, _ = compute_maspo_credit_advantage(rewards, mask, np.array([0, 0]), config=algorithm(1.0))
    assert adv[0, 0] < adv[0, 1]


def test_scatter_places_frame_k_on_the_kth_codec_token():
    # row 0: text token between frames and the end tag; row 1: wrong frame count; row 2: malformed
    responses = torch.tensor([[S + 3, 42, S + 9, S + 1, END], [S, S, S, 0, 0], [S, S, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]])
    frame_mask = ((responses >= S) & mask.bool()).bool()
    errors, aligned = scatter_frame_errors(["0.25,1,0", "1,1", "1,x"], frame_mask, dtype=torch.float64)
    assert aligned.tolist() == [True, False, False]
    assert errors.tolist() == [[0.25, 0, 1, 0, 0], [0] * 5, [0] * 5]


def test_encode_decode_and_bad_values():
    assert encode_frame_errors([0, 1, 0.125]) == "0,1,0.125"
    assert encode_frame_errors(None) == ""
    for bad in ([1.5], [-0.1], [float("nan")], [float("inf")]):
        with pytest.raises(ValueError, match="frame errors must be finite numbers in \\[0, 1\\]"):
            encode_frame_errors(bad)


class _Settings:
    from maspo_verl.credit_config import CreditConfig

    value = CreditConfig.from_mapping({})


def _settings():
    return _Settings.value


def test_credit_inputs_dataclass_shapes():
    inputs = credit_inputs_for(torch.tensor([[S, END]]), torch.tensor([[1, 1]]), ["1"], _settings())
    assert isinstance(inputs, CreditInputs)
    assert inputs.frame_mask.tolist() == [[True, False]] and inputs.aligned.tolist() == [True]
