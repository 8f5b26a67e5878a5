"""``adv_estimator=maspo``: GRPO's outcome advantage, redistributed inside each response by where errors were heard.

For response i of group g (same prompt), with score ``r_i`` (sum of its token-level rewards) and frame errors
``e_{i,t}`` in [0, 1] on its codec-frame tokens ``F_i`` (`maspo_base.frame_errors`)::

    A_i      = (r_i - mean_g r) / (std_g r + eps)         veRL's `grpo` (or r_i - mean_g r without the std)
    u_g      = std_g r / (std_g r + eps)                  one group standard deviation of reward, in A's units
               (std_g r without norm_adv_by_std_in_grpo; 1, as veRL's grpo, for a group of one)
    ebar_i   = mean_{t in F_i} e_{i,t}
    A_{i,t}  = A_i + lambda * u_g * (ebar_i - e_{i,t})    for t in F_i
    A_{i,t}  = A_i                                        for the other tokens (end tag, non-speech tokens)

The credit term sums to zero over each response, so the utterance-level push (the sum of a response's token
advantages) is GRPO's: only its allocation moves, towards the frames heard correctly and away from the errors.
It is measured in the group's reward spread: lambda = 0.5 moves a frame by at most half a group standard
deviation, whatever the reward's scale; a group whose rewards are all equal gets neither an outcome push nor credit.
With lambda = 0, for a response without alignment, and for one whose frames are all right or all wrong, ``A_{i,t}``
is veRL's ``grpo`` bit for bit (the outcome part is veRL's own function).

This module imports no veRL workers and no Ray; `maspo_verl.verl_patches.trainer` feeds it in veRL's trainers.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, register_adv_est

from maspo_verl.advantage_inputs import CreditInputs, current_credit_inputs
from maspo_verl.credit_config import CREDIT_ESTIMATOR, credit_settings

CREDIT_METRICS = {
    "maspo_credit/flagged_frame_fraction": "frames with error > 0 / frames, over responses with alignment",
    "maspo_credit/credit_abs_mean": "mean |lambda * u_g * (ebar_i - e_{i,t})| over those frames",
    "maspo_credit/unaligned_samples": "responses without alignment (they keep the outcome advantage)",
}
"""Metrics the estimator reports each step (logged by the trainer hooks)."""


def group_reward_unit(
    scores: torch.Tensor, index: np.ndarray, norm_adv_by_std_in_grpo: bool, epsilon: float = 1e-6
) -> torch.Tensor:
    """``u_g`` of each response's group, ``(B,)``: the group's reward std (unbiased, as veRL's grpo) in A's units."""
    _, inverse = np.unique(np.asarray(index), return_inverse=True)
    group = torch.as_tensor(inverse.reshape(-1), dtype=torch.long, device=scores.device)
    num_groups = int(group.max().item()) + 1 if group.numel() else 0
    count = torch.zeros(num_groups, dtype=scores.dtype, device=scores.device).index_add_(
        0, group, torch.ones_like(scores)
    )
    mean = torch.zeros_like(count).index_add_(0, group, scores) / count
    squares = torch.zeros_like(count).index_add_(0, group, (scores - mean[group]) ** 2)
    std = torch.where(count > 1, (squares / (count - 1).clamp(min=1)).sqrt(), torch.ones_like(count))
    unit = std / (std + epsilon) if norm_adv_by_std_in_grpo else std
    return unit[group]


def segment_credit(
    frame_errors: torch.Tensor, frames: torch.Tensor, unit: torch.Tensor, credit_weight: float
) -> torch.Tensor:
    """``lambda * u_g * (ebar_i - e_{i,t})`` on ``frames`` (``(B, T)`` bool), zero elsewhere."""
    weights = frames.to(frame_errors.dtype)
    errors = frame_errors * weights
    mean_error = errors.sum(dim=-1) / weights.sum(dim=-1).clamp(min=1)
    return credit_weight * unit.unsqueeze(-1) * (mean_error.unsqueeze(-1) - errors) * weights


@register_adv_est(CREDIT_ESTIMATOR)
def compute_maspo_credit_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    config: Any = None,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    credit_inputs: CreditInputs | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MASPO segment credit (module docstring). Returns ``(advantages, returns)``, both ``(B, T)``, as veRL's grpo.

    ``config`` is veRL's ``algorithm`` config (``algorithm.maspo`` holds the settings, `CreditConfig`);
    ``norm_adv_by_std_in_grpo`` defaults to the config's value (veRL does not pass it to registered estimators).
    ``credit_inputs`` defaults to what `maspo_verl.advantage_inputs.provide_credit_inputs` provides; without
    any, every response is unaligned and the result is veRL's grpo.
    """
    settings = credit_settings(config)
    if norm_adv_by_std_in_grpo is None:
        norm_adv_by_std_in_grpo = bool(config.get("norm_adv_by_std_in_grpo", True)) if config is not None else True
    outcome, _ = compute_grpo_outcome_advantage(
        token_level_rewards=token_level_rewards,
        response_mask=response_mask,
        index=index,
        epsilon=epsilon,
        norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
    )
    inputs = credit_inputs if credit_inputs is not None else current_credit_inputs()
    if inputs is None:
        return outcome, outcome
    aligned = inputs.aligned.to(torch.bool)
    frames = inputs.frame_mask.to(torch.bool) & response_mask.to(torch.bool) & aligned.unsqueeze(-1)
    unit = group_reward_unit(token_level_rewards.sum(dim=-1), index, norm_adv_by_std_in_grpo, epsilon)
    errors = inputs.frame_errors.to(outcome.dtype)
    credit = segment_credit(errors, frames, unit.to(outcome.dtype), settings.credit_weight)
    advantages = torch.where(frames, outcome + credit, outcome) if settings.credit_weight > 0 else outcome
    num_frames = frames.sum()
    inputs.metrics.update(
        {
            "maspo_credit/flagged_frame_fraction": float(((inputs.frame_errors > 0) & frames).sum() / num_frames)
            if num_frames
            else 0.0,
            "maspo_credit/credit_abs_mean": float(credit.abs().sum() / num_frames) if num_frames else 0.0,
            "maspo_credit/unaligned_samples": float((~aligned).sum()),
        }
    )
    return advantages, advantages
