"""Shared builders for the MASPO loss tests: veRL actor configs and random padded batches."""

from __future__ import annotations

import os

import torch
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.workers.config import ActorConfig

import maspo_verl.loss  # noqa: F401 - registers loss_mode=maspo
from maspo_verl.config import MaspoPolicyLossConfig

# The loss tests run on the CPU; MASPO_TEST_DEVICE=cuda runs them on a GPU with the same (CPU-drawn) values.
TEST_DEVICE = os.environ.get("MASPO_TEST_DEVICE", "cpu")

VERL_AGG_MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def actor_config(loss_mode: str = "maspo", clip_ratio: float = 0.2, **maspo) -> ActorConfig:
    """A veRL ActorConfig whose policy_loss carries ``maspo`` settings (defaults elsewhere)."""
    policy_loss = MaspoPolicyLossConfig(loss_mode=loss_mode, maspo=maspo)
    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=clip_ratio,
        clip_ratio_low=clip_ratio,
        clip_ratio_high=clip_ratio,
        policy_loss=policy_loss,
    )


def random_batch(batch=6, width=12, dtype=torch.float64, scale=0.5, seed=0, lengths=None):
    """old/new log-probs, a per-response advantage, and a right-padded mask with varied lengths (one length-1 row)."""
    generator = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, width, generator=generator, dtype=dtype) * 3
    new = old + scale * torch.randn(batch, width, generator=generator, dtype=dtype)
    advantages = torch.randn(batch, 1, generator=generator, dtype=dtype).expand(batch, width).contiguous()
    if lengths is None:
        lengths = torch.randint(1, width + 1, (batch,), generator=generator)
        lengths[0], lengths[-1] = width, 1
    mask = (torch.arange(width).unsqueeze(0) < torch.as_tensor(lengths).unsqueeze(1)).to(dtype)
    old, new, advantages, mask = (t.to(TEST_DEVICE) for t in (old, new, advantages, mask))
    return old, new.requires_grad_(True), advantages, mask


def loss_and_grad(loss_mode, config, old, new, advantages, mask, agg="token-mean", weights=None):
    loss, metrics = get_policy_loss_fn(loss_mode)(
        old_log_prob=old,
        log_prob=new,
        advantages=advantages,
        response_mask=mask,
        loss_agg_mode=agg,
        config=config,
        rollout_is_weights=weights,
    )
    (grad,) = torch.autograd.grad(loss, new)
    return loss.detach(), grad, metrics
