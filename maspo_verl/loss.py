"""MASPO: segment-level importance sampling as a veRL policy loss (``loss_mode=maspo``).

For response i with token log-ratios ``d_t = log pi_theta(y_t) - log pi_old(y_t)`` and segments ``seg_k`` from a
segmenter, every token of a segment shares the segment's ratio:

    l_k = (1 / |seg_k|**alpha) * sum_{t in seg_k} d_t            (alpha = 1: log of the geometric mean)
    log s_t = |seg_k|**(1 - alpha) (log pi_theta(y_t) - sg[log pi_theta(y_t)]) + sg[l_k]
              (value s_k, gradient |seg_k|**(1 - alpha) s_k grad log pi_theta(y_t))
    L_t = -min(s_t A_t, clip(s_t, 1 - eps_low_k, 1 + eps_high_k) A_t),   eps_k = eps * |seg_k|**(-gamma)

with veRL's dual clip for A < 0 (``L_t <= -c A_t``), or SAPO's soft gate ``L_t = -A_t sigmoid(tau (s_t - 1)) 4 / tau``
in place of the clip. One-token segments give veRL's ``vanilla`` (GRPO); one segment per response gives ``gspo``.

At alpha = 1 the gradient is GSPO-token's, ``s_k grad log pi_theta(y_t)``. The factor ``|seg_k|**(1 - alpha)`` is
``|seg_k|`` times ``d s_k / d log pi_theta(y_t) = s_k / |seg_k|**alpha``: summed over a segment whose tokens share one
weight (one advantage, as in GRPO), the tokens' gradients are exactly those of the segment's loss as written, for any
alpha. One segment per response with ``alpha = p`` is then P-GSPO's sequence objective, ``s = exp(sum_t d_t / L**p)``
(p = 0: the sequence ratio ``pi_theta(y) / pi_old(y)``), whose update grows with the length as ``L**(1 - p)``.

Aggregation is veRL's ``agg_loss`` for its modes, plus ``seg-mean`` (every segment of the mini-batch weighs the same)
and ``seq-mean-seg-mean`` (segment mean within a response, then response mean). Both divide by global counts, so a
mini-batch gives the same total loss whole or in micro-batches.
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass
from typing import Any

import torch
from verl.trainer.ppo.core_algos import agg_loss, register_policy_loss

from maspo_verl.config import SEGMENT_AGG_MODES, maspo_settings
from maspo_verl.loss_inputs import current_loss_inputs, record_metric_sums
from maspo_verl.rollout_correction import bypass_correction, correct_in_bypass
from maspo_verl.segmentation import SegmentLayout
from maspo_verl.segmentation.segment_ids import count_per_slot

logger = logging.getLogger(__name__)

METRIC_PREFIX = "actor/maspo/"


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

    In veRL's bypass mode (``algorithm.rollout_correction.bypass_mode=true``) ``old_log_prob`` is the rollout
    policy's, so the segment ratio is the correction; the block's rejection (``rollout_rs``) drops tokens from
    ``response_mask`` first and its metrics join the loss's (`maspo_verl.rollout_correction.correct_in_bypass`).
    """
    assert config is not None, "the MASPO loss needs veRL's actor config"
    settings = maspo_settings(config.policy_loss)
    context = current_loss_inputs()
    correction_metrics: dict[str, float] = {}
    bypass = bypass_correction(config.policy_loss)
    if bypass is not None:  # rollout correction in bypass mode: old_log_prob is pi_rollout, the rejection applies here
        response_mask, correction_metrics = correct_in_bypass(
            bypass, settings, log_prob, old_log_prob, response_mask, context.response_ids, context.heard_words
        )
    mask = response_mask.bool()

    # bf16/fp16 log-probs are summed over segments in fp32; fp64 stays fp64 (equivalence tests).
    compute_dtype = torch.float64 if log_prob.dtype == torch.float64 else torch.float32
    log_prob = log_prob.to(compute_dtype)
    old_log_prob = old_log_prob.to(compute_dtype)
    advantages = advantages.to(compute_dtype)

    taus = (config.tau_pos, config.tau_neg) if settings.gate == "sapo" else None
    tables = _segment_tables_function(settings, log_prob.device)(
        settings, taus, log_prob.detach(), old_log_prob, advantages, mask, context.response_ids, context.heard_words
    )
    layout = tables.layout
    weight = advantages if rollout_is_weights is None else advantages * rollout_is_weights.to(compute_dtype)
    pg_losses = _SegmentRatioObjective.apply(log_prob, weight, tables.value, tables.slope)
    mode = settings.loss_agg_mode or loss_agg_mode
    global_batch_info = dict(getattr(config, "global_batch_info", None) or {})
    if mode in SEGMENT_AGG_MODES:
        pg_loss = aggregate_over_segments(
            pg_losses, layout, mask, mode, context.minibatch_num_segments, **global_batch_info
        )
    else:
        # the mask exactly as veRL passed it, so that one-token or one-per-response segments reproduce its losses
        pg_loss = agg_loss(loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=mode, **global_batch_info)

    sums = _metric_sums(tables.metric_sums)
    record_metric_sums(sums)
    metrics = metrics_from_sums(sums)
    if context.minibatch_num_segments is not None:
        metrics[METRIC_PREFIX + "minibatch_segments"] = float(context.minibatch_num_segments)
    metrics.update(correction_metrics)
    return pg_loss, metrics


@dataclass(frozen=True)
class _SegmentTables:
    """What the loss computes between its inputs and the per-token objective (`_segment_tables`)."""

    layout: SegmentLayout
    value: torch.Tensor
    """``(B, T)``: ``-v_t``, the (clipped or gated) segment ratio of each token's segment, negated."""
    slope: torch.Tensor
    """``(B, T)``: ``-g_t``, its derivative with respect to the token's log-prob, negated."""
    metric_sums: torch.Tensor
    """`_metric_sum_tensor` of the call, read back once by `_metric_sums`."""


def _segment_tables(
    settings,
    taus: tuple[float, float] | None,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    response_ids: torch.Tensor | None,
    heard_words: torch.Tensor | None,
) -> _SegmentTables:
    """The segments, their log-ratios ``l_k``, and each token's value and slope (``log_prob`` detached).

    Everything below the segment ratio is a function of (segment, sign of A_t): the value of the (clipped) ratio v
    and its derivative with respect to log pi_theta(y_t), g = d s_t / d log pi(y_t) = s_k where unclipped. Both are
    tabulated per segment and sign, then gathered once per token. With ``maspo.compile`` on a GPU this whole
    function is one compiled graph (`_segment_tables_function`).
    """
    layout = settings.segment_layout(old_log_prob, mask, response_ids, heard_words)

    # Segment log-ratio: l_k = sum_{t in seg_k} d_t / |seg_k|**alpha (per-segment arrays carry a padding slot first).
    segment_log_ratio_sum = layout.sum(log_prob - old_log_prob)
    lengths = layout.lengths.to(log_prob.dtype).clamp(min=1)
    if settings.ratio_length_exponent == 1.0:
        segment_log_ratio = segment_log_ratio_sum / lengths
    else:
        segment_log_ratio = segment_log_ratio_sum / lengths.pow(settings.ratio_length_exponent)
    segment_log_ratio[:1].zero_()  # the padding slot

    terms = _segment_terms(settings, taus, segment_log_ratio, lengths)
    negative = advantages < 0
    row = torch.add(layout.index, negative, alpha=layout.num_slots).view(-1)  # k + num_slots [A_t < 0]
    value = terms.values.index_select(0, row).view(advantages.shape)
    slope = terms.slopes.index_select(0, row).view(advantages.shape)
    sums = _metric_sum_tensor(layout, row, negative, terms, segment_log_ratio_sum, segment_log_ratio)
    return _SegmentTables(layout, value, slope, sums)


COMPILE_BACKENDS = {"cuda": "inductor"}
"""``maspo.compile``: the ``torch.compile`` backend per device type; a device type not listed (the CPU: inductor's
CPU code generation fails on the segmentation's bool casts in torch 2.13) runs `_segment_tables` eagerly. The tests
add ``"cpu": "aot_eager"`` to check the compiled graph against the eager path in float64."""


@functools.cache
def _compiled_segment_tables(backend: str):
    return torch.compile(_segment_tables, backend=backend, dynamic=True)


def _segment_tables_function(settings, device: torch.device):
    """`_segment_tables`, compiled where ``maspo.compile`` asks for it and the device type has a backend."""
    backend = COMPILE_BACKENDS.get(device.type) if settings.compile else None
    if not backend:
        return _segment_tables
    settings.codec.speech_tokens  # noqa: B018 - resolved eagerly: a cached_property locks (Python 3.11), dynamo breaks
    return _compiled_segment_tables(backend)


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
            minibatch_num_segments = layout.segment_count.clamp(min=1)  # a tensor: no wait for the device
        return per_token.sum() / minibatch_num_segments * dp_size
    if loss_agg_mode == "seq-mean-seg-mean":
        rows = per_token.sum(dim=-1) / layout.segments_per_row.clamp(min=1).to(loss_mat.dtype)
        if global_batch_size is None:
            if dp_size > 1:
                raise ValueError("seq-mean-seg-mean needs global_batch_size when dp_size > 1")
            global_batch_size = (layout.segments_per_row > 0).sum().clamp(min=1)
        return rows.sum() / global_batch_size * dp_size
    raise ValueError(f"invalid segment aggregation mode {loss_agg_mode!r}; valid: {list(SEGMENT_AGG_MODES)}")


class _SegmentRatioObjective(torch.autograd.Function):
    """``L_t = w_t * v_t`` in the forward pass, ``dL_t / d log pi_theta(y_t) = w_t * g_t`` in the backward pass.

    With ``w_t = A_t`` (times the rollout weight), ``v_t`` minus the clipped (or gated) segment ratio and ``g_t``
    minus its derivative with respect to the token's log-prob, this is exactly the GSPO-token form
    ``-A_t clip(sg[s_k] * pi(y_t) / sg[pi(y_t)])``: same value, same gradient, one pass each way (at
    ``ratio_length_exponent`` alpha != 1, ``g_t`` carries the factor ``|seg_k|**(1 - alpha)``: module docstring).
    """

    @staticmethod
    def forward(ctx, log_prob, weight, value, slope):  # log_prob is an input only to receive the gradient
        ctx.save_for_backward(weight, slope)
        return weight * value

    @staticmethod
    def backward(ctx, grad_output):
        weight, slope = ctx.saved_tensors
        return grad_output * weight * slope, None, None, None


@dataclass(frozen=True)
class _SegmentTerms:
    """Per segment k and sign of the advantage: the ratio's value and slope, and which bound (if any) held it."""

    values: torch.Tensor
    """``(2 S,)`` with ``S`` the layout's ``num_slots``: entry ``k + S [A < 0]`` holds ``-v`` (slot 0, padding, and
    any empty slot, that of a ratio of 1)."""
    slopes: torch.Tensor
    """``(2 S,)``: the same for ``-g``. Two flat tables, A >= 0 half first, each half contiguous: two
    one-column gathers per token cost less than one two-column gather, and no column is interleaved."""
    clip_flags: torch.Tensor | None
    """``(3, S)`` bool (clip gate only): ``s_k`` above the upper bound (where A >= 0 tokens are clipped), below
    the lower bound (A < 0), above the dual clip ``c`` (A < 0)."""


def _segment_terms(
    settings, taus: tuple[float, float] | None, segment_log_ratio: torch.Tensor, lengths: torch.Tensor
) -> _SegmentTerms:
    """Value and slope of the per-token objective for each (segment, sign of A); see `_SegmentRatioObjective`.

    Clip gate, A > 0: ``v = min(s, hi)``; A < 0: ``v = clamp(s, lo, c)`` (PPO clip plus veRL's dual clip); ``g = s``
    where the ratio passes unclipped, else 0. SAPO gate: ``v = f(s) = sigmoid(tau (s - 1)) 4 / tau`` and
    ``g = f'(s) s``, with tau = ``tau_pos`` for A > 0 and ``tau_neg`` otherwise (``taus``, the actor's). Beyond the
    log-ratio clamp the ratio is constant, so ``g = 0``. With ``ratio_length_exponent`` alpha != 1 every slope is
    multiplied by ``|seg_k|**(1 - alpha)``: ``g = |seg_k| d v / d log pi(y_t)`` (module docstring).
    """
    clamp = settings.log_ratio_clamp
    ratio = torch.exp(segment_log_ratio.clamp(-clamp, clamp))
    passes = ratio * (segment_log_ratio.abs() <= clamp)  # the slope where no bound holds the ratio
    alpha = settings.ratio_length_exponent
    if alpha != 1.0:  # |seg_k| * d l_k / d log pi(y_t) = |seg_k|**(1 - alpha); 1 at alpha = 1 (left out: bit for bit)
        passes = passes * lengths.pow(1.0 - alpha)
    clip_flags = None
    if settings.gate == "sapo":
        values, slopes = [], []
        for tau in taus:
            gate = torch.sigmoid(tau * (ratio - 1.0))
            values.append(gate * (4.0 / tau))
            slopes.append(4.0 * gate * (1.0 - gate) * passes)
    else:
        gamma = settings.clip_length_exponent
        length_scale = lengths.pow(-gamma) if gamma != 0.0 else 1.0
        lower = 1.0 - settings.clip_ratio_low * length_scale
        upper = 1.0 + settings.clip_ratio_high * length_scale
        cap = float("inf") if settings.clip_ratio_c is None else settings.clip_ratio_c
        high, low, dual = ratio > upper, ratio < lower, ratio > cap
        clip_flags = torch.stack([high, low, dual])
        values = [
            torch.minimum(ratio, upper) if gamma != 0.0 else ratio.clamp(max=upper),
            ratio.clamp(max=cap).clamp(min=lower) if gamma == 0.0 else torch.maximum(ratio.clamp(max=cap), lower),
        ]
        slopes = [passes.masked_fill(high, 0.0), passes.masked_fill(low | dual, 0.0)]
    # L_t = -A_t v: the tables hold -v and -g, the A >= 0 half first. The padding slot holds the terms of a ratio of 1
    # (its log-ratio is set to 0): finite, and every aggregation masks padding out of the loss and its gradient.
    return _SegmentTerms(torch.cat(values).neg_(), torch.cat(slopes).neg_(), clip_flags)


METRIC_SUMS = (
    "segments",
    "segment_log_ratio",
    "segment_log_ratio_square",
    "token_log_ratio",
    "tokens",
    "responses",
    "segments_clipped_high",
    "segments_clipped_low",
    "tokens_clipped",
    "tokens_dual_clipped",
)
"""The sums behind the loss's metrics, in the order `_metric_sums` returns them: segments K, sum of l_k and of
l_k**2, sum of the token log-ratios d_t, tokens, responses with a token, segments held at the upper bound (with a
token A >= 0) and at the lower bound (with a token A < 0), tokens clipped (veRL's ``pg_clipfrac``), tokens held by
the dual clip. Summed over micro-batches (and ranks) they give the mini-batch's metrics."""


def _metric_sum_tensor(
    layout: SegmentLayout,
    row: torch.Tensor,
    negative: torch.Tensor,
    terms: _SegmentTerms,
    segment_log_ratio_sum: torch.Tensor,
    segment_log_ratio: torch.Tensor,
) -> torch.Tensor:
    """The sums behind `METRIC_SUMS` of one call, on the device (`_metric_sums` reads them back and orders them):
    MASPO's per-segment counts (each segment counts once) and veRL's token-level ones.

    Token counts per (segment, sign of A) come from one count of the table rows, so veRL's token-level
    ``pg_clipfrac`` (clipped above for A >= 0 or below for A < 0) and ``pg_clipfrac_lower`` (dual clip) are exact.
    A segment counts in ``clipfrac_high`` when it is above its upper bound and holds a token with A >= 0, in
    ``clipfrac_low`` when it is below its lower bound and holds a token with A < 0 (with one advantage per response,
    as in GRPO, that is the state of all its tokens).
    """
    real = slice(1, None)  # segments 1 .. K, then the empty slots of a static-size layout (length 0, sum 0)
    # read back in float64; padding and empty slots hold l = 0
    segment_log_ratio = segment_log_ratio.double()
    sums = [
        layout.segment_count.double(),
        segment_log_ratio.sum(),
        segment_log_ratio.dot(segment_log_ratio),
        segment_log_ratio_sum[real].sum(dtype=torch.float64),
        layout.lengths[real].sum(dtype=torch.float64),
        torch.count_nonzero(layout.segments_per_row).double(),
    ]
    parts = [torch.stack(sums)]
    if terms.clip_flags is not None:
        # counts[sign, k]: tokens with A >= 0 (sign 0) or A < 0 (sign 1) in segment k; flags[bound, k]: s_k above the
        # upper bound, below the lower bound, above c. tokens[sign, bound]: tokens of that sign in segments held at
        # that bound; segments[sign, bound]: the same, counting segments.
        if layout.scatter_mask is not None:  # count by the layout's scatter index (see `SegmentLayout`)
            row = torch.add(layout.scatter_index, negative.view(-1), alpha=layout.num_slots)
        counts = count_per_slot(row, 2 * layout.num_slots, torch.float64, layout.scatter_mask)
        counts = counts.view(2, -1)[:, real]
        flags = terms.clip_flags[:, real].double().T
        parts += [(counts @ flags).view(-1), (counts.clamp_(max=1) @ flags).view(-1)]
    return torch.cat(parts)


def _metric_sums(metric_sums: torch.Tensor) -> list[float]:
    """`METRIC_SUMS` from `_metric_sum_tensor`'s: 6 sums, then (clip gate) tokens and segments per [sign, bound]."""
    scalars = metric_sums.tolist()  # the one read-back of the loss
    tokens, segments = scalars[6:12] or [0.0] * 6, scalars[12:] or [0.0] * 6  # row-major [sign, bound]
    return scalars[:6] + [segments[0], segments[4], tokens[0] + tokens[4], tokens[5]]


def metrics_from_sums(sums: list[float]) -> dict[str, float]:
    """The loss's metrics from `METRIC_SUMS`: of one call, or summed over the micro-batches of a mini-batch.

    The spread of the segment log-ratios is ``sqrt(sum l_k**2 / K - (sum l_k / K)**2)``.
    """
    values = dict(zip(METRIC_SUMS, sums, strict=True))
    per_segment = max(values["segments"], 1.0)
    mean = values["segment_log_ratio"] / per_segment
    spread = math.sqrt(max(values["segment_log_ratio_square"] / per_segment - mean * mean, 0.0))
    num_tokens, responses = values["tokens"] or 1.0, max(values["responses"], 1.0)
    return {
        METRIC_PREFIX + "segments_per_response": values["segments"] / responses,
        METRIC_PREFIX + "mean_segment_length": num_tokens / per_segment,
        METRIC_PREFIX + "clipfrac_high": values["segments_clipped_high"] / per_segment,
        METRIC_PREFIX + "clipfrac_low": values["segments_clipped_low"] / per_segment,
        METRIC_PREFIX + "segment_log_ratio_std": spread,
        "actor/pg_clipfrac": values["tokens_clipped"] / num_tokens,
        "actor/ppo_kl": -values["token_log_ratio"] / num_tokens,
        "actor/pg_clipfrac_lower": values["tokens_dual_clipped"] / num_tokens,
    }
