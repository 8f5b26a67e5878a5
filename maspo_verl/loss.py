"""MASPO: segment-level importance sampling as a veRL policy loss (``loss_mode=maspo``).

For response i with token log-ratios ``d_t = log pi_theta(y_t) - log pi_old(y_t)`` and segments ``seg_k`` from a
segmenter, every token of a segment shares the segment's ratio:

    l_k = (1 / |seg_k|**alpha) * sum_{t in seg_k} d_t            (alpha = 1: log of the geometric mean)
    log s_t = log pi_theta(y_t) - sg[log pi_theta(y_t)] + sg[l_k]   (value s_k, gradient s_k * grad log pi_theta(y_t))
    L_t = -min(s_t A_t, clip(s_t, 1 - eps_low_k, 1 + eps_high_k) A_t),   eps_k = eps * |seg_k|**(-gamma)

with veRL's dual clip for A < 0 (``L_t <= -c A_t``), or SAPO's soft gate ``L_t = -A_t sigmoid(tau (s_t - 1)) 4 / tau``
in place of the clip. One-token segments give veRL's ``vanilla`` (GRPO); one segment per response gives ``gspo``.

Aggregation is veRL's ``agg_loss`` for its modes, plus ``seg-mean`` (every segment of the mini-batch weighs the same)
and ``seq-mean-seg-mean`` (segment mean within a response, then response mean). Both divide by global counts, so a
mini-batch gives the same total loss whole or in micro-batches.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import verl.utils.torch_functional as verl_F
from verl.trainer.ppo.core_algos import agg_loss, register_policy_loss

from maspo_verl.config import SEGMENT_AGG_MODES, MaspoConfig, maspo_settings
from maspo_verl.loss_inputs import current_loss_inputs
from maspo_verl.segmenters import SegmentationInput, segment_responses
from maspo_verl.segments import segment_sum

logger = logging.getLogger(__name__)

METRIC_PREFIX = "actor/maspo/"


def compute_segment_ids(
    settings: MaspoConfig,
    old_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    response_ids: torch.Tensor | None,
) -> torch.Tensor:
    """Canonical segment ids ``(B, T)`` of a micro-batch under ``settings.segmenter``."""
    segmenter = settings.segmenter
    inputs = SegmentationInput(
        old_log_prob=old_log_prob,
        response_mask=response_mask.bool(),
        response_ids=response_ids,
        codec=settings.codec.vocabulary,
    )
    return segment_responses(inputs, segmenter.name, segmenter.params, segmenter.min_len, segmenter.max_len)


@register_policy_loss("maspo")  # type: ignore[arg-type]
def compute_policy_loss_maspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Compute the MASPO policy objective and its metrics (see the module docstring for the formulas).

    Args:
        old_log_prob: log-probs under the rollout-time policy, ``(B, T)``.
        log_prob: log-probs under the current policy, ``(B, T)``, differentiable.
        advantages: ``(B, T)``.
        response_mask: ``(B, T)``, 1 on response tokens.
        loss_agg_mode: the actor's ``loss_agg_mode``; ``maspo.loss_agg_mode`` overrides it when set.
        config: veRL's ``ActorConfig``; MASPO settings come from ``config.policy_loss.maspo``, clip temperatures for
            the SAPO gate from ``config.tau_pos`` / ``config.tau_neg``.
        rollout_is_weights: optional per-token rollout-correction weights, ``(B, T)``.
    """
    assert config is not None, "the MASPO loss needs veRL's actor config"
    settings = maspo_settings(config.policy_loss)
    context = current_loss_inputs()
    mask = response_mask.bool()

    # bf16/fp16 log-probs are summed over segments in fp32; fp64 stays fp64 (equivalence tests).
    compute_dtype = torch.float64 if log_prob.dtype == torch.float64 else torch.float32
    log_prob = log_prob.to(compute_dtype)
    old_log_prob = old_log_prob.to(compute_dtype)
    advantages = advantages.to(compute_dtype)

    segment_ids = compute_segment_ids(settings, old_log_prob, mask, context.response_ids)
    valid = segment_ids >= 0

    # Segment log-ratio: l_k = sum_{t in seg_k} d_t / |seg_k|**alpha, broadcast back onto the segment's tokens.
    zero = torch.zeros_like(log_prob)
    log_ratio = torch.where(valid, log_prob.detach() - old_log_prob, zero)
    ratio_sums, index = segment_sum(log_ratio, segment_ids)
    lengths, _ = segment_sum(valid.to(compute_dtype), segment_ids)
    segment_log_ratio = ratio_sums / lengths.clamp(min=1).pow(settings.ratio_length_exponent)
    token_segment_log_ratio = segment_log_ratio[index]
    token_segment_length = lengths[index].clamp(min=1)

    # GSPO-token form: log s_t = log pi - sg(log pi) + sg(l_k); value s_k, gradient s_k * grad log pi(y_t).
    log_segment_ratio = log_prob - log_prob.detach() + token_segment_log_ratio
    log_segment_ratio = torch.clamp(log_segment_ratio, -settings.log_ratio_clamp, settings.log_ratio_clamp)
    log_segment_ratio = torch.where(valid, log_segment_ratio, zero)
    segment_ratio = torch.exp(log_segment_ratio)

    length_scale = token_segment_length.pow(-settings.clip_length_exponent)
    clip_low = settings.clip_ratio_low * length_scale
    clip_high = settings.clip_ratio_high * length_scale

    if settings.gate == "sapo":
        tau = torch.where(
            advantages > 0,
            torch.as_tensor(config.tau_pos, dtype=compute_dtype, device=advantages.device),
            torch.as_tensor(config.tau_neg, dtype=compute_dtype, device=advantages.device),
        )
        # SAPO's soft gate on the segment ratio: f(s) = sigmoid(tau (s - 1)) * 4 / tau, f'(1) = 1.
        pg_losses = -advantages * torch.sigmoid(tau * (segment_ratio - 1.0)) * (4.0 / tau)
        clipped_token = torch.zeros_like(mask)
        dual_clipped_token = torch.zeros_like(mask)
    else:
        pg_losses1 = -advantages * segment_ratio
        pg_losses2 = -advantages * torch.clamp(segment_ratio, 1.0 - clip_low, 1.0 + clip_high)
        clip_pg_losses = torch.maximum(pg_losses1, pg_losses2)
        clipped_token = pg_losses2 > pg_losses1
        if settings.clip_ratio_c is not None:
            # dual clip (A < 0): the loss of a segment with a huge ratio is capped at -A * c
            pg_losses3 = -advantages * settings.clip_ratio_c
            dual_clipped_token = (clip_pg_losses > pg_losses3) & (advantages < 0)
            pg_losses = torch.where(advantages < 0, torch.minimum(pg_losses3, clip_pg_losses), clip_pg_losses)
        else:
            dual_clipped_token = torch.zeros_like(mask)
            pg_losses = clip_pg_losses

    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights.to(compute_dtype)

    mode = settings.loss_agg_mode or loss_agg_mode
    global_batch_info = dict(getattr(config, "global_batch_info", None) or {})
    if mode in SEGMENT_AGG_MODES:
        pg_loss = aggregate_over_segments(
            pg_losses, segment_ids, token_segment_length, mode, context.minibatch_num_segments, **global_batch_info
        )
    else:
        pg_loss = agg_loss(
            loss_mat=pg_losses, loss_mask=mask.to(compute_dtype), loss_agg_mode=mode, **global_batch_info
        )

    metrics = _segment_metrics(
        segment_ids=segment_ids,
        lengths=lengths,
        segment_log_ratio=segment_log_ratio,
        advantages=advantages,
        settings=settings,
        gate_is_clip=settings.gate == "clip",
    )
    metrics["actor/pg_clipfrac"] = verl_F.masked_mean(clipped_token.to(compute_dtype), mask).item()
    metrics["actor/ppo_kl"] = verl_F.masked_mean(-log_ratio, mask).item()
    metrics["actor/pg_clipfrac_lower"] = verl_F.masked_mean(dual_clipped_token.to(compute_dtype), mask).item()
    return pg_loss, metrics


def aggregate_over_segments(
    loss_mat: torch.Tensor,
    segment_ids: torch.Tensor,
    token_segment_length: torch.Tensor,
    loss_agg_mode: str,
    minibatch_num_segments: int | None = None,
    dp_size: int = 1,
    batch_num_tokens: int | None = None,
    global_batch_size: int | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Aggregate a ``(B, T)`` loss over segments, normalised by global counts as veRL's ``agg_loss`` does.

    - ``seg-mean``: ``sum_k mean_{t in seg_k} L_t / N_seg`` with ``N_seg`` the segments of the whole mini-batch.
    - ``seq-mean-seg-mean``: ``sum_i (1/K_i) sum_{k in i} mean_{t in seg_k} L_t / N_seq``.

    Multiplying by ``dp_size`` undoes data-parallel gradient averaging, as in ``agg_loss``.
    """
    valid = segment_ids >= 0
    per_token = torch.where(valid, loss_mat / token_segment_length, torch.zeros_like(loss_mat))
    segments_per_row = (segment_ids.max(dim=-1).values + 1).clamp(min=0)
    if loss_agg_mode == "seg-mean":
        if minibatch_num_segments is None:
            if dp_size > 1:
                raise ValueError("seg-mean needs the mini-batch segment count when dp_size > 1")
            minibatch_num_segments = segments_per_row.sum().clamp(min=1)
        return per_token.sum() / minibatch_num_segments * dp_size
    if loss_agg_mode == "seq-mean-seg-mean":
        rows = per_token.sum(dim=-1) / segments_per_row.clamp(min=1).to(loss_mat.dtype)
        if global_batch_size is None:
            if dp_size > 1:
                raise ValueError("seq-mean-seg-mean needs global_batch_size when dp_size > 1")
            global_batch_size = (segments_per_row > 0).sum().clamp(min=1)
        return rows.sum() / global_batch_size * dp_size
    raise ValueError(f"invalid segment aggregation mode {loss_agg_mode!r}; valid: {list(SEGMENT_AGG_MODES)}")


def _segment_metrics(
    segment_ids: torch.Tensor,
    lengths: torch.Tensor,
    segment_log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    settings: MaspoConfig,
    gate_is_clip: bool,
) -> dict[str, float]:
    """Per-segment statistics (every segment counts once, whatever its length)."""
    used = lengths > 0
    num_segments = used.sum().clamp(min=1)
    rows_with_tokens = ((segment_ids >= 0).any(dim=-1)).sum().clamp(min=1)
    advantage_sums, _ = segment_sum(advantages.detach(), segment_ids)
    segment_advantage = advantage_sums / lengths.clamp(min=1)
    ratio = torch.exp(segment_log_ratio.clamp(-settings.log_ratio_clamp, settings.log_ratio_clamp))
    scale = lengths.clamp(min=1).pow(-settings.clip_length_exponent)
    if gate_is_clip:
        clipped_high = used & (segment_advantage > 0) & (ratio > 1.0 + settings.clip_ratio_high * scale)
        clipped_low = used & (segment_advantage < 0) & (ratio < 1.0 - settings.clip_ratio_low * scale)
    else:
        clipped_high = clipped_low = torch.zeros_like(used)
    used_log_ratio = segment_log_ratio[used]
    spread = used_log_ratio.std(unbiased=False) if used_log_ratio.numel() > 0 else used_log_ratio.new_zeros(())
    return {
        METRIC_PREFIX + "segments_per_response": (used.sum() / rows_with_tokens).item(),
        METRIC_PREFIX + "mean_segment_length": (lengths[used].sum() / num_segments).item(),
        METRIC_PREFIX + "clipfrac_high": (clipped_high.sum() / num_segments).item(),
        METRIC_PREFIX + "clipfrac_low": (clipped_low.sum() / num_segments).item(),
        METRIC_PREFIX + "segment_log_ratio_std": spread.item(),
    }
