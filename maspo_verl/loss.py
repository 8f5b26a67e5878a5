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
from verl.trainer.ppo.core_algos import agg_loss, register_policy_loss

from maspo_verl.config import SEGMENT_AGG_MODES, maspo_settings
from maspo_verl.loss_inputs import current_loss_inputs
from maspo_verl.segmentation import SegmentLayout

logger = logging.getLogger(__name__)

METRIC_PREFIX = "actor/maspo/"
METRIC_NAMES = (
    "segments_per_response",
    "mean_segment_length",
    "clipfrac_high",
    "clipfrac_low",
    "segment_log_ratio_std",
)


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

    layout = settings.segment_layout(old_log_prob, mask, context.response_ids)

    # Segment log-ratio: l_k = sum_{t in seg_k} d_t / |seg_k|**alpha (per-segment arrays carry a padding slot last).
    log_ratio = log_prob.detach() - old_log_prob
    segment_log_ratio_sum = layout.sum(log_ratio)
    lengths = layout.lengths.to(compute_dtype).clamp(min=1)
    if settings.ratio_length_exponent == 1.0:
        segment_log_ratio = segment_log_ratio_sum / lengths
    else:
        segment_log_ratio = segment_log_ratio_sum / lengths.pow(settings.ratio_length_exponent)
    segment_log_ratio[-1] = 0.0  # the padding slot

    # Clip range per segment: [1 - eps_low * L**-gamma, 1 + eps_high * L**-gamma], gathered with l_k in one pass.
    if settings.clip_length_exponent == 0.0:
        segment_lower = 1.0 - settings.clip_ratio_low
        segment_upper = 1.0 + settings.clip_ratio_high
        token_segment_log_ratio = layout.broadcast(segment_log_ratio)
        lower = torch.tensor(segment_lower, dtype=compute_dtype, device=log_prob.device)
        upper = torch.tensor(segment_upper, dtype=compute_dtype, device=log_prob.device)
    else:
        length_scale = lengths.pow(-settings.clip_length_exponent)
        segment_lower = 1.0 - settings.clip_ratio_low * length_scale
        segment_upper = 1.0 + settings.clip_ratio_high * length_scale
        per_token = layout.broadcast(torch.stack([segment_log_ratio, segment_lower, segment_upper], dim=-1))
        token_segment_log_ratio, lower, upper = per_token.unbind(dim=-1)

    # GSPO-token form: log s_t = log pi - sg(log pi) + sg(l_k); value s_k, gradient s_k * grad log pi(y_t).
    log_segment_ratio = log_prob - log_prob.detach() + token_segment_log_ratio
    log_segment_ratio = torch.clamp(log_segment_ratio, -settings.log_ratio_clamp, settings.log_ratio_clamp)
    segment_ratio = torch.exp(log_segment_ratio)

    negative = advantages < 0
    clipped_high = clipped_low = dual_clipped = None
    if settings.gate == "sapo":
        tau = torch.where(
            advantages > 0,
            torch.as_tensor(config.tau_pos, dtype=compute_dtype, device=advantages.device),
            torch.as_tensor(config.tau_neg, dtype=compute_dtype, device=advantages.device),
        )
        # SAPO's soft gate on the segment ratio: f(s) = sigmoid(tau (s - 1)) * 4 / tau, f'(1) = 1.
        pg_losses = -advantages * torch.sigmoid(tau * (segment_ratio - 1.0)) * (4.0 / tau)
    else:
        # PPO's max(-A s, -A clip(s)) is -A min(s, hi) for A > 0 and -A max(s, lo) for A < 0; the dual clip caps the
        # latter at -A c. Both fit in one clamp with per-token bounds: -A clamp(s, [lo if A < 0], [c if A < 0 else hi]).
        cap = float("inf") if settings.clip_ratio_c is None else settings.clip_ratio_c
        zero = torch.zeros((), dtype=compute_dtype, device=advantages.device)
        lower = torch.where(negative, lower, zero)
        upper = torch.where(negative, torch.as_tensor(cap, dtype=compute_dtype, device=advantages.device), upper)
        clipped_ratio = torch.clamp(segment_ratio, lower, upper)
        pg_losses = -advantages * clipped_ratio
        ratio_value = segment_ratio.detach()
        lowered = clipped_ratio.detach() < ratio_value  # clipped at hi (A > 0) or capped at c (A < 0)
        clipped_high = lowered & ~negative
        clipped_low = clipped_ratio.detach() > ratio_value
        dual_clipped = lowered & negative

    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights.to(compute_dtype)

    mode = settings.loss_agg_mode or loss_agg_mode
    global_batch_info = dict(getattr(config, "global_batch_info", None) or {})
    if mode in SEGMENT_AGG_MODES:
        pg_loss = aggregate_over_segments(
            pg_losses, layout, mask, mode, context.minibatch_num_segments, **global_batch_info
        )
    else:
        # the mask exactly as veRL passed it, so that one-token or one-per-response segments reproduce its losses
        pg_loss = agg_loss(loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=mode, **global_batch_info)

    metrics = _metrics(layout, mask, segment_log_ratio_sum, segment_log_ratio, clipped_high, clipped_low, dual_clipped)
    if context.minibatch_num_segments is not None:
        metrics[METRIC_PREFIX + "minibatch_segments"] = float(context.minibatch_num_segments)
    return pg_loss, metrics


def aggregate_over_segments(
    loss_mat: torch.Tensor,
    layout: SegmentLayout,
    loss_mask: torch.Tensor,
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
    token_weight = 1.0 / layout.broadcast(layout.lengths.to(loss_mat.dtype).clamp(min=1))
    per_token = torch.where(loss_mask.bool(), loss_mat * token_weight, loss_mat.new_zeros(()))
    if loss_agg_mode == "seg-mean":
        if minibatch_num_segments is None:
            if dp_size > 1:
                raise ValueError("seg-mean needs the mini-batch segment count when dp_size > 1")
            minibatch_num_segments = max(layout.num_segments, 1)
        return per_token.sum() / minibatch_num_segments * dp_size
    if loss_agg_mode == "seq-mean-seg-mean":
        rows = per_token.sum(dim=-1) / layout.segments_per_row.clamp(min=1).to(loss_mat.dtype)
        if global_batch_size is None:
            if dp_size > 1:
                raise ValueError("seq-mean-seg-mean needs global_batch_size when dp_size > 1")
            global_batch_size = (layout.segments_per_row > 0).sum().clamp(min=1)
        return rows.sum() / global_batch_size * dp_size
    raise ValueError(f"invalid segment aggregation mode {loss_agg_mode!r}; valid: {list(SEGMENT_AGG_MODES)}")


def _metrics(
    layout: SegmentLayout,
    mask: torch.Tensor,
    segment_log_ratio_sum: torch.Tensor,
    segment_log_ratio: torch.Tensor,
    clipped_high: torch.Tensor | None,
    clipped_low: torch.Tensor | None,
    dual_clipped: torch.Tensor | None,
) -> dict[str, float]:
    """MASPO's per-segment statistics (each segment counts once) and veRL's token-level ones.

    ``clipped_high``/``clipped_low``: ``(B, T)`` tokens clipped above (A > 0, ratio over the upper bound) and below
    (A < 0, ratio under the lower bound); ``dual_clipped``: capped by the dual clip. A segment's clip state is read
    at its first token: with one advantage per response (GRPO) it is the state of every token of the segment.
    """
    num_segments = layout.num_segments
    real = slice(0, num_segments)
    num_tokens = float(layout.lengths[real].sum()) or 1.0
    segment_log_ratio = segment_log_ratio[real]
    zero = segment_log_ratio.new_zeros(())
    if clipped_high is None:
        clipfrac_high = clipfrac_low = pg_clipfrac = pg_clipfrac_lower = zero
    else:
        clipfrac_high = torch.count_nonzero(clipped_high & layout.starts) / max(num_segments, 1)
        clipfrac_low = torch.count_nonzero(clipped_low & layout.starts) / max(num_segments, 1)
        pg_clipfrac = torch.count_nonzero((clipped_high | clipped_low) & mask) / num_tokens
        pg_clipfrac_lower = torch.count_nonzero(dual_clipped & mask) / num_tokens
    spread = segment_log_ratio.std(unbiased=False) if num_segments > 0 else zero
    rows_with_tokens = max(int(torch.count_nonzero(layout.segments_per_row)), 1)
    values = torch.stack(
        [
            torch.as_tensor(value, dtype=zero.dtype)
            for value in (
                num_segments / rows_with_tokens,
                num_tokens / max(num_segments, 1),
                clipfrac_high,
                clipfrac_low,
                spread,
                pg_clipfrac,
                -segment_log_ratio_sum[real].sum() / num_tokens,
                pg_clipfrac_lower,
            )
        ]
    ).tolist()
    names = [METRIC_PREFIX + n for n in METRIC_NAMES] + ["actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"]
    return dict(zip(names, values))
