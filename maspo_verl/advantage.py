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

With ``credit_mode=per_unit`` each unit the recogniser aligned to the target (the code ear's phonemes: frame t says
target unit ``j(t)``, the ``frame_words`` extra) is credited against the same unit in the other responses of the
group, as W3AR credits words::

    e_{i,j}  = mean_{t in F_i, j(t) = j} e_{i,t}                  the unit's error in response i (1 - its score)
    a_{i,j}  = (mean_g e_{.,j} - e_{i,j}) / (std_g e_{.,j} + eps)  over the responses of g that align unit j
               (without the std under norm_adv_by_std_in_grpo=False; 0 where fewer than two do)
    A_{i,t}  = A_i + lambda * a_{i,j(t)}                           for t in F_i aligned to a unit
    A_{i,t}  = A_i                                                 for the other tokens

so a phoneme said better than the group said it is pushed up whatever the utterance scored, and the noise of the
other phonemes' scores does not ride on it. With lambda = 0, for a response without alignment and for a group that
said every unit equally well, ``A_{i,t}`` is veRL's ``grpo``.

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
    "maspo_credit/credited_unit_fraction": "per_unit: frames whose unit at least one other response of the group "
    "aligned too / frames aligned to a unit",
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


def _groups(index: np.ndarray, device: torch.device) -> torch.Tensor:
    """Each response's group as an integer ``(B,)`` (responses of one prompt share an ``index``)."""
    _, inverse = np.unique(np.asarray(index), return_inverse=True)
    return torch.as_tensor(inverse.reshape(-1), dtype=torch.long, device=device)


def unit_credit(
    frame_errors: torch.Tensor,
    frame_units: torch.Tensor,
    frames: torch.Tensor,
    index: np.ndarray,
    credit_weight: float,
    norm_by_std: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``lambda * a_{i,j(t)}`` on the frames aligned to a unit (module docstring's ``per_unit``), zero elsewhere;
    and which frames had a unit to compare (``(B, T)`` bool: at least two responses of the group align it)."""
    batch = frame_errors.shape[0]
    has_unit = frames & (frame_units >= 0)
    units = int(frame_units[has_unit].max().item()) + 1 if bool(has_unit.any()) else 1
    rows = torch.arange(batch, device=frame_errors.device)[:, None].expand_as(frame_units)
    cell = (rows * units + frame_units.clamp(min=0))[has_unit]  # (response, unit)
    zeros = torch.zeros(batch * units, dtype=frame_errors.dtype, device=frame_errors.device)
    count = zeros.index_add(0, cell, torch.ones_like(cell, dtype=frame_errors.dtype))
    error = zeros.index_add(0, cell, frame_errors[has_unit]) / count.clamp(min=1)
    present = count > 0
    group = _groups(index, frame_errors.device)
    group_cell = (group[:, None] * units + torch.arange(units, device=group.device)).reshape(-1)
    n_groups = int(group.max().item()) + 1 if batch else 0
    g_zeros = torch.zeros(n_groups * units, dtype=frame_errors.dtype, device=frame_errors.device)
    seen = g_zeros.index_add(0, group_cell, present.to(frame_errors.dtype))
    mean = g_zeros.index_add(0, group_cell, torch.where(present, error, 0.0)) / seen.clamp(min=1)
    deviation = torch.where(present, error - mean[group_cell], 0.0)
    std = (g_zeros.index_add(0, group_cell, deviation**2) / (seen - 1).clamp(min=1)).sqrt()
    advantage = -deviation / (std[group_cell] + epsilon) if norm_by_std else -deviation
    compared = present & (seen[group_cell] > 1)
    advantage = torch.where(compared, advantage, 0.0)
    on_frames = torch.zeros_like(frame_errors)
    on_frames[has_unit] = credit_weight * advantage[cell]
    compared_frames = torch.zeros_like(has_unit)
    compared_frames[has_unit] = compared[cell]
    return on_frames, compared_frames


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
    errors = inputs.frame_errors.to(outcome.dtype)
    if settings.credit_mode == "per_unit":
        if inputs.frame_units is None:
            raise ValueError("algorithm.maspo.credit_mode=per_unit needs each frame's unit (the reward's frame_words)")
        credit, compared = unit_credit(
            errors, inputs.frame_units, frames, index, settings.credit_weight, norm_adv_by_std_in_grpo, epsilon
        )
        with_unit = (frames & (inputs.frame_units >= 0)).sum()
        inputs.metrics["maspo_credit/credited_unit_fraction"] = float(compared.sum() / with_unit) if with_unit else 0.0
    else:
        unit = group_reward_unit(token_level_rewards.sum(dim=-1), index, norm_adv_by_std_in_grpo, epsilon)
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
