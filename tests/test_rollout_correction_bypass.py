"""Bypass mode with ``loss_mode=maspo``: ``old_log_prob`` is the rollout policy's, so the segment ratio is the
correction; the block's rejection drops segments of the current policy against the rollout one before the loss, as
veRL's ``bypass_mode`` loss does with ``loss_type=ppo_clip``, and the weights are logged, not applied.

The run through veRL's trainer: tests/e2e/test_cpu_rollout_correction.py."""

from __future__ import annotations

import pytest
import torch
from loss_helpers import loss_and_grad, random_batch
from verl.trainer.config import RolloutCorrectionConfig
from verl.workers.config import ActorConfig

from maspo_verl.config import MaspoConfig, MaspoPolicyLossConfig
from maspo_verl.rollout_correction import compute_rollout_correction

SEGMENTER = {"name": "fixed", "window": 3}


def actor(**correction) -> ActorConfig:
    rollout_correction = RolloutCorrectionConfig(**correction) if correction else RolloutCorrectionConfig()
    policy_loss = MaspoPolicyLossConfig(
        loss_mode="maspo", maspo={"segmenter": SEGMENTER}, rollout_correction=rollout_correction
    )
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, policy_loss=policy_loss)


def rejected_mask(rollout, current, mask, **settings):
    layout = MaspoConfig.from_mapping({"segmenter": SEGMENTER}).segment_layout(rollout, mask, None)
    return compute_rollout_correction(current.detach(), rollout, mask, layout, **settings)[1]


@pytest.mark.parametrize(
    "rejection",
    [
        {"rollout_rs": "seg_mean_k1", "rollout_rs_threshold": "0.8_1.25"},
        {"rollout_rs": "seg_sum_k3,token_k1", "rollout_rs_threshold": "0.3,0.3_3.0"},
    ],
)
def test_bypass_rejection_is_the_loss_on_the_kept_segments(rejection):
    rollout, current, advantages, mask = random_batch(batch=8, width=12, scale=0.4, seed=3)
    bypass = actor(bypass_mode=True, rollout_is=None, **rejection)
    loss, grad, metrics = loss_and_grad("maspo", bypass, rollout, current, advantages, mask)
    kept = rejected_mask(rollout, current, mask, **rejection)
    assert 0 < int((mask - kept).sum()) < int(mask.sum())  # the bounds drop some tokens, not all
    expected_loss, expected_grad, _ = loss_and_grad("maspo", actor(), rollout, current, advantages, kept)
    torch.testing.assert_close(loss, expected_loss, rtol=0, atol=0)
    torch.testing.assert_close(grad, expected_grad, rtol=0, atol=0)
    assert torch.all(grad[(mask - kept).bool()] == 0)
    fraction = metrics["rollout_corr/rollout_rs_masked_fraction"]
    assert fraction == pytest.approx(float((mask - kept).sum() / mask.sum()), abs=1e-7)


def test_bypass_weights_are_logged_not_applied():
    rollout, current, advantages, mask = random_batch(batch=6, width=12, scale=0.4, seed=4)
    loss, grad, metrics = loss_and_grad(
        "maspo", actor(bypass_mode=True, rollout_is="segment"), rollout, current, advantages, mask
    )
    plain_loss, plain_grad, plain_metrics = loss_and_grad("maspo", actor(), rollout, current, advantages, mask)
    torch.testing.assert_close(loss, plain_loss, rtol=0, atol=0)
    torch.testing.assert_close(grad, plain_grad, rtol=0, atol=0)
    assert metrics["rollout_corr/rollout_is_mean_segment_length"] == pytest.approx(
        plain_metrics["actor/maspo/mean_segment_length"]
    )
    assert 0 < metrics["rollout_corr/rollout_is_eff_sample_size"] <= 1
    assert not any(key.startswith("rollout_corr/") for key in plain_metrics)


def test_without_bypass_mode_the_block_is_not_read():
    # veRL's default block (rollout_is=sequence, bypass off) rides on every actor config; decoupled-mode weights
    # arrive as rollout_is_weights instead
    rollout, current, advantages, mask = random_batch(batch=4, width=8, scale=0.4, seed=5)
    decoupled = actor(bypass_mode=False, rollout_is="segment", rollout_rs="seg_mean_k1", rollout_rs_threshold=1.01)
    loss, _, metrics = loss_and_grad("maspo", decoupled, rollout, current, advantages, mask)
    plain_loss, _, _ = loss_and_grad("maspo", actor(), rollout, current, advantages, mask)
    torch.testing.assert_close(loss, plain_loss, rtol=0, atol=0)
    assert not any(key.startswith("rollout_corr/") for key in metrics)
