"""The MASPO loss on small cases computed by hand: values, gradients, clips, gate, length exponents, edge cases."""

import math

import pytest
import torch
from loss_helpers import actor_config, loss_and_grad, random_batch

from maspo_verl.loss_inputs import provide_loss_inputs
from maspo_verl.segmentation import MissingResponseIdsError

# One response of 4 tokens, two windows of 2. Token log-ratios d = [0.2, 0.0, -0.1, -0.3]
# -> segment log-ratios l = [0.1, -0.2], ratios s = [e^0.1, e^-0.2] = [1.10517, 0.81873].
D = [0.2, 0.0, -0.1, -0.3]
S0, S1 = math.exp(0.1), math.exp(-0.2)


def _one_response(advantage, d=D):
    old = torch.tensor([[-1.0, -2.0, -0.5, -1.5]], dtype=torch.float64)
    new = (old + torch.tensor([d], dtype=torch.float64)).requires_grad_(True)
    advantages = torch.full_like(old, advantage)
    return old, new, advantages, torch.ones_like(old)


def _config(**overrides):
    settings = dict(
        segmenter={"name": "fixed", "window": 2},
        clip_ratio_low=0.1,
        clip_ratio_high=0.05,
        clip_length_exponent=0.0,
        clip_ratio_c=None,
    )
    settings.update(overrides)
    return actor_config(**settings)


def test_positive_advantage_clips_the_high_segment_only():
    # A = +1: segment 0 (1.105 > 1 + 0.05) is clipped -> loss -1.05, no gradient;
    # segment 1 (0.819 < 1 - 0.1) keeps min(sA, clip(s)A) = sA -> loss -s1, gradient -s1 * dlogp / 4.
    loss, grad, metrics = loss_and_grad("maspo", _config(), *_one_response(1.0))
    assert loss.item() == pytest.approx(-(1.05 + 1.05 + S1 + S1) / 4, abs=1e-12)
    torch.testing.assert_close(grad, torch.tensor([[0.0, 0.0, -S1 / 4, -S1 / 4]], dtype=torch.float64))
    assert metrics["actor/maspo/clipfrac_high"] == 0.5
    assert metrics["actor/maspo/clipfrac_low"] == 0.0
    assert metrics["actor/pg_clipfrac"] == 0.5
    assert metrics["actor/maspo/segments_per_response"] == 2.0
    assert metrics["actor/maspo/segment_log_ratio_std"] == pytest.approx(0.15)


def test_negative_advantage_clips_the_low_segment_only():
    # A = -1: loss max(s, clip(s)): segment 0 unclipped (1.105 > 1.05) -> s0 with gradient s0/4;
    # segment 1 clipped at 0.9 -> no gradient.
    loss, grad, metrics = loss_and_grad("maspo", _config(), *_one_response(-1.0))
    assert loss.item() == pytest.approx((S0 + S0 + 0.9 + 0.9) / 4, abs=1e-12)
    torch.testing.assert_close(grad, torch.tensor([[S0 / 4, S0 / 4, 0.0, 0.0]], dtype=torch.float64))
    assert metrics["actor/maspo/clipfrac_low"] == 0.5
    assert metrics["actor/maspo/clipfrac_high"] == 0.0


def test_length_scaled_clip_range():
    # gamma = 0.5, length 2: eps_high = 0.3 / sqrt(2) = 0.2121 -> s0 = 1.105 is inside; eps = 0.1 would clip it.
    loss, grad, _ = loss_and_grad("maspo", _config(clip_ratio_high=0.3, clip_length_exponent=0.5), *_one_response(1.0))
    assert loss.item() == pytest.approx(-(2 * S0 + 2 * S1) / 4, abs=1e-12)
    assert grad[0, 0].item() == pytest.approx(-S0 / 4)
    loss, grad, _ = loss_and_grad("maspo", _config(clip_ratio_high=0.1, clip_length_exponent=0.5), *_one_response(1.0))
    assert loss.item() == pytest.approx(-(2 * (1 + 0.1 / math.sqrt(2)) + 2 * S1) / 4, abs=1e-12)
    assert grad[0, 0].item() == 0.0


def test_dual_clip_caps_negative_advantage_loss():
    # l = [1.5, 1.5] -> s = 4.48 > c = 3: loss -A * c = 3 per token, no gradient; without dual clip loss = s.
    d = [1.5, 1.5, 1.5, 1.5]
    loss, grad, metrics = loss_and_grad("maspo", _config(clip_ratio_c=3.0), *_one_response(-1.0, d))
    assert loss.item() == pytest.approx(3.0)
    assert torch.count_nonzero(grad) == 0
    assert metrics["actor/pg_clipfrac_lower"] == 1.0
    loss, grad, _ = loss_and_grad("maspo", _config(clip_ratio_c=None), *_one_response(-1.0, d))
    assert loss.item() == pytest.approx(math.exp(1.5))


def test_ratio_length_exponent_zero_uses_product_of_ratios():
    # alpha = 0: l_k = sum of d over the segment -> s = [e^0.2, e^-0.4]; wide clip so nothing is clipped. The loss
    # -(s_0 + s_0 + s_1 + s_1) / 4 with d s_k / d log pi(y_t) = s_k for both tokens of segment k: each token's
    # gradient is -2 s_k / 4 (the slope |seg_k|**(1 - alpha) s_k), where GSPO-token's form would give -s_k / 4.
    config = _config(ratio_length_exponent=0.0, clip_ratio_low=0.9, clip_ratio_high=9.0)
    loss, grad, _ = loss_and_grad("maspo", config, *_one_response(1.0))
    s = [math.exp(0.2), math.exp(-0.4)]
    assert loss.item() == pytest.approx(-(2 * s[0] + 2 * s[1]) / 4, abs=1e-12)
    torch.testing.assert_close(
        grad, -2 * torch.tensor([[s[0], s[0], s[1], s[1]]], dtype=torch.float64) / 4, rtol=1e-12, atol=0
    )


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_one_segment_at_exponent_zero_is_the_sequence_ratio(advantage):
    # One window over the response, alpha = 0: s = exp(0.2 + 0 - 0.1 - 0.3) = e^-0.2 = pi_theta(y) / pi_old(y).
    # seq-mean-token-mean: the loss is -A s and d(-A s) / d log pi(y_t) = -A s on every token (to 1e-8: veRL's
    # seq-mean divides by the token count plus 1e-8).
    config = _config(segmenter={"name": "fixed", "window": 1000}, ratio_length_exponent=0.0, clip_ratio_low=0.9)
    loss, grad, metrics = loss_and_grad("maspo", config, *_one_response(advantage), agg="seq-mean-token-mean")
    assert loss.item() == pytest.approx(-advantage * S1, rel=1e-8)
    torch.testing.assert_close(grad, torch.full((1, 4), -advantage * S1, dtype=torch.float64), rtol=1e-8, atol=0)
    assert metrics["actor/maspo/segments_per_response"] == 1.0
    # d = 0.15 each: s = e^0.6 = 1.82 is above 1 + 0.05 for A > 0 (held at 1.05, no gradient), kept for A < 0
    loss, grad, _ = loss_and_grad("maspo", config, *_one_response(advantage, [0.15] * 4), agg="seq-mean-token-mean")
    assert loss.item() == pytest.approx(-1.05 if advantage > 0 else math.exp(0.6), rel=1e-8)
    assert torch.count_nonzero(grad) == (0 if advantage > 0 else 4)


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_sapo_gate_on_segment_ratio(advantage):
    # f(s) = sigmoid(tau (s - 1)) * 4 / tau per segment; d loss / d logp_t = -A f'(s_k) s_k / N.
    config = _config(gate="sapo")
    tau = config.tau_pos if advantage > 0 else config.tau_neg
    loss, grad, metrics = loss_and_grad("maspo", config, *_one_response(advantage))

    def gate(s):
        return 1 / (1 + math.exp(-tau * (s - 1))) * 4 / tau

    def gate_slope(s):
        sig = 1 / (1 + math.exp(-tau * (s - 1)))
        return 4 * sig * (1 - sig)

    expected = -advantage * (2 * gate(S0) + 2 * gate(S1)) / 4
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    g0, g1 = (-advantage * gate_slope(s) * s / 4 for s in (S0, S1))
    torch.testing.assert_close(grad, torch.tensor([[g0, g0, g1, g1]], dtype=torch.float64))
    assert metrics["actor/pg_clipfrac"] == 0.0


def test_rollout_is_weights_scale_each_token():
    old, new, advantages, mask = _one_response(1.0)
    weights = torch.tensor([[1.0, 0.5, 2.0, 0.0]], dtype=torch.float64)
    loss, _, _ = loss_and_grad("maspo", _config(), old, new, advantages, mask, weights=weights)
    assert loss.item() == pytest.approx(-(1.05 * 1.0 + 1.05 * 0.5 + S1 * 2.0) / 4, abs=1e-12)


def test_padding_never_enters_a_segment_even_when_nan():
    old, new, advantages, mask = random_batch(seed=4)
    config = _config(segmenter={"name": "fixed", "window": 3})
    reference = loss_and_grad("maspo", config, old, new, advantages, mask)
    poisoned_old = torch.where(mask.bool(), old, torch.full_like(old, float("nan")))
    poisoned_new = torch.where(mask.bool(), new.detach(), torch.full_like(old, 1e30)).requires_grad_(True)
    loss, grad, _ = loss_and_grad("maspo", config, poisoned_old, poisoned_new, advantages, mask)
    torch.testing.assert_close(loss, reference[0])
    torch.testing.assert_close(grad, reference[1])
    assert torch.count_nonzero(grad[~mask.bool()]) == 0


def test_length_one_and_all_masked_rows():
    old, new, advantages, mask = random_batch(batch=4, width=5, seed=5, lengths=[5, 1, 0, 0])
    config = _config(segmenter={"name": "fixed", "window": 2}, clip_ratio_low=0.99, clip_ratio_high=100.0)
    for agg in ("token-mean", "seq-mean-token-mean", "seg-mean", "seq-mean-seg-mean"):
        loss, grad, metrics = loss_and_grad("maspo", config, old, new, advantages, mask, agg)
        assert torch.isfinite(loss) and torch.isfinite(grad).all(), agg
        assert torch.count_nonzero(grad[2:]) == 0
        assert grad[1, 0] != 0  # the single token of the length-1 response is trained
        assert metrics["actor/maspo/segments_per_response"] == pytest.approx((3 + 1) / 2)

    empty = random_batch(batch=2, width=4, seed=6, lengths=[0, 0])
    loss, grad, _ = loss_and_grad("maspo", config, *empty, agg="seq-mean-seg-mean")
    assert torch.isfinite(loss) and torch.count_nonzero(grad) == 0


@pytest.mark.parametrize("sign", [50.0, -50.0])
@pytest.mark.parametrize("gate", ["clip", "sapo"])
def test_extreme_log_ratios_stay_finite(sign, gate):
    old, new, advantages, mask = random_batch(seed=7)
    extreme = (old + sign).requires_grad_(True)
    for advantage_sign in (1.0, -1.0):
        loss, grad, metrics = loss_and_grad(
            "maspo", _config(gate=gate, clip_ratio_c=None), old, extreme, advantage_sign * advantages.abs(), mask
        )
        assert torch.isfinite(loss) and torch.isfinite(grad).all()
        assert all(math.isfinite(v) for v in metrics.values())


def test_bf16_inputs_match_fp32_closely():
    old, new, advantages, mask = random_batch(dtype=torch.float32, scale=0.2, seed=8)
    config = _config(segmenter={"name": "fixed", "window": 4}, clip_ratio_high=0.28, clip_ratio_low=0.2)
    loss32, grad32, _ = loss_and_grad("maspo", config, old, new, advantages, mask)
    new16 = new.detach().bfloat16().requires_grad_(True)
    loss16, grad16, _ = loss_and_grad("maspo", config, old.bfloat16(), new16, advantages.bfloat16(), mask.bfloat16())
    assert grad16.dtype == torch.bfloat16 and torch.isfinite(grad16.float()).all()
    assert loss16.item() == pytest.approx(loss32.item(), abs=0.05)
    torch.testing.assert_close(grad16.float(), grad32, atol=0.02, rtol=0.05)


def test_token_based_segmenter_without_token_ids_raises():
    old, new, advantages, mask = random_batch(seed=9)
    with pytest.raises(MissingResponseIdsError, match="needs the response token ids"):
        loss_and_grad("maspo", _config(segmenter={"name": "fsq"}), old, new, advantages, mask)
    ids = torch.full(mask.shape, 128264 + 43690, dtype=torch.long, device=mask.device)
    with provide_loss_inputs(response_ids=ids):
        loss, _, metrics = loss_and_grad("maspo", _config(segmenter={"name": "fsq"}), old, new, advantages, mask)
    # all codes identical: one segment per response
    assert metrics["actor/maspo/segments_per_response"] == 1.0
