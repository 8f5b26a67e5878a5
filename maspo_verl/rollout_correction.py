"""Rollout correction at the segment level: veRL's ``algorithm.rollout_correction`` between its token and sequence
levels, over MASPO's segmenters.

The rollout engine (vLLM in bf16, its own kernels) and the trainer disagree on log-probs; veRL 0.9.1 weights each
token by ``pi_old / pi_rollout`` (``rollout_is``) and drops tokens or responses whose divergence is out of bounds
(``rollout_rs``). With ``r_t = log pi_old(y_t) - log pi_rollout(y_t)`` (the trainer's recomputed log-prob; in bypass
mode the current policy's) and segments ``seg_k`` from a segmenter (`maspo_verl.segmentation`):

    rollout_is=segment:      log w_k = sum_{t in seg_k} r_t       the sequence weight of the segment alone
    rollout_is=segment_geo:  log w_k = mean_{t in seg_k} r_t      its geometric mean (MASPO's and GSPO's form)
    w_t = w_{k(t)}, then veRL's ``rollout_is_threshold``: TIS ``min(w, upper)``, or IcePop (``"lower_upper"``)
    ``w if lower <= w <= upper else 0``

    rollout_rs=seg_sum_kN / seg_mean_kN:  D_k = sum / mean over seg_k of veRL's token statistic
        k1 = -r_t, kept where log lower <= D_k <= log upper;  k2 = r_t**2 / 2 and k3 = exp(r_t) - 1 - r_t, kept
        where D_k <= upper; every token of a dropped segment leaves the response mask.

One-token segments give veRL's ``token`` level and its ``token_kN`` rejection; one segment per response gives its
``sequence`` level and ``seq_sum_kN`` / ``seq_mean_kN`` (``seg_mean_k1`` is then veRL's geometric filter). Token
log-ratios are clamped to +-20 before the divergence statistics and segment log-weights before ``exp`` (veRL's
``SAFETY_BOUND``). veRL's own levels and options run beside these through veRL's functions:
`compute_rollout_correction` is veRL's ``compute_rollout_correction_and_rejection_mask`` plus the segment modes.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from maspo_verl.segmentation import SegmentLayout

SEGMENT_IS_LEVELS = ("segment", "segment_geo")
"""``rollout_is`` levels added beside veRL's ``token`` and ``sequence``."""
SEGMENT_RS_OPTIONS = tuple(f"seg_{how}_k{n}" for how in ("sum", "mean") for n in (1, 2, 3))
"""``rollout_rs`` options added beside veRL's ``token_kN``, ``seq_sum_kN``, ``seq_mean_kN``, ``seq_max_kN``."""
METRIC_PREFIX = "rollout_corr/"
"""veRL's prefix of every rollout-correction metric."""


def _verl_rc():
    """veRL's rollout-correction helpers (``verl.trainer.ppo.rollout_corr_helper``), imported at first use: importing
    veRL loads its plugins, whose MASPO loss imports this module, so an import here at the top would leave this
    module half-imported for the plugin whenever it is imported before veRL."""
    from verl.trainer.ppo import rollout_corr_helper

    return rollout_corr_helper


def _safety_bound() -> float:
    """veRL's ``SAFETY_BOUND``: the largest |log weight| exponentiated."""
    return _verl_rc().SAFETY_BOUND


def real_segments(layout: SegmentLayout) -> torch.Tensor:
    """``(num_slots,)`` bool: the slots of real segments (not the padding slot, not a static layout's empty ones)."""
    real = layout.lengths > 0
    real[0] = False
    return real


def segment_log_weights(
    log_ratio: torch.Tensor, response_mask: torch.Tensor, layout: SegmentLayout, geometric: bool
) -> torch.Tensor:
    """``(num_slots,)``: ``sum_{t in seg_k} r_t`` per segment, or its mean (``geometric``); 0 in the padding slot.
    Padding never enters a sum (it is zeroed first, so a ``nan`` there stays out)."""
    values = torch.where(response_mask, log_ratio, log_ratio.new_zeros(()))
    sums = layout.sum(values)
    if geometric:
        sums = sums / layout.lengths.to(sums.dtype).clamp(min=1)
    sums[:1] = 0.0
    return sums


def segment_is_weights(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    layout: SegmentLayout,
    level: str = "segment",
    threshold: Any = 2.0,
    batch_normalize: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token weights ``w_{k(t)}`` (0 on padding) and their metrics (veRL's names, without the prefix).

    TIS truncates at ``upper``; IcePop (``"lower_upper"``) zeroes a segment whose weight is outside the bounds.
    ``batch_normalize`` divides by the mean weight over the batch's segments (each segment once: veRL's token level
    averages tokens, its sequence level responses). Metrics: veRL's (``compute_is_metrics``'s token-weighted mean,
    std, effective sample size and per-response ones), with max, min and the fractions above and below the bounds
    over segments (as veRL's sequence level does over responses), and the segmentation's size."""
    if level not in SEGMENT_IS_LEVELS:
        raise ValueError(f"rollout_is={level!r} is not a segment level; valid: {list(SEGMENT_IS_LEVELS)}")
    upper, lower = _verl_rc()._parse_rollout_is_threshold(threshold)
    mask = response_mask.bool()
    log_weight = segment_log_weights(log_ratio, mask, layout, geometric=level == "segment_geo")
    raw_segment = torch.exp(log_weight.clamp(-_safety_bound(), _safety_bound()))
    if lower is None:
        applied_segment = raw_segment.clamp(max=upper)
    else:
        applied_segment = torch.where((raw_segment >= lower) & (raw_segment <= upper), raw_segment, 0.0)
    token_mask = mask.to(log_ratio.dtype)
    raw = layout.broadcast(raw_segment) * token_mask
    weights = layout.broadcast(applied_segment) * token_mask
    metrics = _verl_rc().compute_is_metrics(weights, raw, log_ratio, token_mask, "token", upper, lower)
    metrics.update(_segment_is_metrics(log_weight, layout, upper, lower))
    if lower is not None:
        outside = (raw < lower) | (raw > upper)
        metrics["rollout_is_oob_ratio"] = _masked_mean(outside.to(log_ratio.dtype), token_mask)
    if batch_normalize:
        mean = float(applied_segment[real_segments(layout)].mean()) if layout.num_slots > 1 else 0.0
        factor = mean if mean > 1e-8 else 1.0
        weights = weights / factor
        metrics["rollout_is_batch_norm_factor"] = factor
    return weights.detach(), metrics


def _segment_is_metrics(
    log_weight: torch.Tensor, layout: SegmentLayout, upper: float, lower: float | None
) -> dict[str, float]:
    """Max and min of the untruncated segment weights (in log space, as veRL's sequence level), the fractions of
    segments above ``upper`` and below ``lower`` (``1 / upper`` for TIS), segments per response and their length."""
    real = real_segments(layout)
    segment_log = log_weight[real]
    count = segment_log.numel()
    if count == 0:
        return {}
    lower = 1.0 / upper if lower is None else lower
    responses = max(int(torch.count_nonzero(layout.segments_per_row)), 1)
    return {
        "rollout_is_max": math.exp(min(float(segment_log.max()), _safety_bound())),
        "rollout_is_min": math.exp(float(segment_log.min())),
        "rollout_is_ratio_fraction_high": float((segment_log > math.log(upper)).sum()) / count,
        "rollout_is_ratio_fraction_low": float((segment_log < math.log(lower)).sum()) / count,
        "rollout_is_segments_per_response": count / responses,
        "rollout_is_mean_segment_length": float(layout.lengths[real].sum()) / count,
    }


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float((values * mask).sum() / (mask.sum() + 1e-8))


def _token_statistic(safe_log_ratio: torch.Tensor, kind: str) -> torch.Tensor:
    """veRL's per-token divergence: k1 ``-r``, k2 ``r**2 / 2``, k3 ``exp(r) - 1 - r`` (veRL's own expressions, so
    that one-token segments round as its ``token_kN`` do)."""
    if kind == "k1":
        return -safe_log_ratio
    if kind == "k2":
        return 0.5 * safe_log_ratio**2
    return torch.exp(safe_log_ratio) - 1.0 - safe_log_ratio


def segment_rejection_mask(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    layout: SegmentLayout,
    options: list[str],
    thresholds: dict[str, dict[str, float | None]],
) -> tuple[torch.Tensor, dict[str, float]]:
    """``(B, T)`` keep mask (1 on kept tokens and padding, 0 on every token of a dropped segment) and the metrics.

    ``options``: segment options (`SEGMENT_RS_OPTIONS`); ``thresholds``: veRL's parsed bounds per option
    (``_parse_rollout_rs_thresholds``). Each option's metrics are veRL's (``compute_rs_metrics`` at token level on
    the segment statistic given to every token of the segment), plus the fractions of segments above and below the
    bounds and dropped (``seg_*``); all options must pass for a segment to stay."""
    mask = response_mask.bool()
    token_mask = mask.to(log_ratio.dtype)
    safe = log_ratio.clamp(-_safety_bound(), _safety_bound())
    real = real_segments(layout)
    seq_valid = mask.any(dim=-1)
    keep = torch.ones_like(token_mask)
    metrics: dict[str, float] = {}
    for option in options:
        bounds = thresholds[option]
        is_k1 = option.endswith("k1")
        geometric = option.startswith("seg_mean")
        statistic = segment_log_weights(_token_statistic(safe, option[-2:]), mask, layout, geometric)
        upper = math.log(bounds["upper"]) if is_k1 else bounds["upper"]
        lower = math.log(bounds["lower"]) if is_k1 else None
        high = statistic > upper
        low = statistic < lower if lower is not None else torch.zeros_like(high)
        keep_segment = ~(high | low) | ~real
        keep = keep * layout.broadcast(keep_segment).to(keep.dtype)
        per_token = layout.broadcast(statistic)
        metrics.update(
            _verl_rc().compute_rs_metrics(
                option_name=option,
                rs_statistic=per_token,
                response_mask=token_mask,
                seq_valid_mask=seq_valid,
                level="token",
                per_sequence_values=None,
                rollout_rs_threshold=upper,
                rollout_rs_threshold_lower=lower if lower is not None else 0.0,
                apply_lower_threshold=is_k1,
            )
        )
        metrics.update(_rejection_fractions(f"rollout_rs_{option}", keep_segment, high, low, real, layout, mask))
    return keep, metrics


def _rejection_fractions(
    prefix: str,
    keep_segment: torch.Tensor,
    high: torch.Tensor,
    low: torch.Tensor,
    real: torch.Tensor,
    layout: SegmentLayout,
    mask: torch.Tensor,
) -> dict[str, float]:
    """One option's dropped fractions: of tokens and of responses (veRL's keys), of segments, and of segments above
    and below its bounds."""
    count = max(int(real.sum()), 1)
    dropped_tokens = ~layout.broadcast(keep_segment) & mask
    valid_rows = mask.any(dim=-1)
    return {
        f"{prefix}_masked_fraction": float(dropped_tokens.sum()) / max(int(mask.sum()), 1),
        f"{prefix}_seq_masked_fraction": float((dropped_tokens.any(dim=-1) & valid_rows).sum())
        / max(int(valid_rows.sum()), 1),
        f"{prefix}_seg_masked_fraction": float((~keep_segment & real).sum()) / count,
        f"{prefix}_seg_fraction_high": float((high & real).sum()) / count,
        f"{prefix}_seg_fraction_low": float((low & real).sum()) / count,
    }


def split_rejection_options(
    rollout_rs: str | None, rollout_rs_threshold: Any
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``rollout_rs`` and its thresholds as ``(option, threshold)`` pairs, veRL's options apart from the segment ones.

    As veRL: options are comma separated (a repeat is dropped), with one threshold for all or one per option."""
    if rollout_rs is None:
        return [], []
    options = [option.strip() for option in str(rollout_rs).split(",") if option.strip()]
    if isinstance(rollout_rs_threshold, bool) or rollout_rs_threshold is None:
        raise ValueError("rollout_rs_threshold must be provided for rejection sampling.")
    specs = [part.strip() for part in str(rollout_rs_threshold).split(",") if part.strip()]
    if len(specs) not in (1, len(options)):
        raise ValueError(
            f"rollout_rs_threshold expects either one threshold shared by all options or exactly {len(options)} "
            "thresholds to match the provided rollout_rs options."
        )
    specs = specs * len(options) if len(specs) == 1 else specs
    pairs: dict[str, str] = {}
    for option, spec in zip(options, specs, strict=True):
        pairs.setdefault(option, spec)
    verl = [(option, spec) for option, spec in pairs.items() if option not in SEGMENT_RS_OPTIONS]
    segment = [(option, spec) for option, spec in pairs.items() if option in SEGMENT_RS_OPTIONS]
    return verl, segment


def _joined(pairs: list[tuple[str, str]]) -> tuple[str | None, str | None]:
    if not pairs:
        return None, None
    return ",".join(option for option, _ in pairs), ",".join(spec for _, spec in pairs)


CORRECTION_DEFAULTS = {
    "rollout_is": None,
    "rollout_is_threshold": 2.0,
    "rollout_is_batch_normalize": False,
    "rollout_rs": None,
    "rollout_rs_threshold": None,
}
"""The arguments of `compute_rollout_correction` a ``rollout_correction`` block sets, with veRL's defaults."""


def correction_arguments(block: Any) -> dict[str, Any]:
    """`CORRECTION_DEFAULTS` as a ``rollout_correction`` block (a mapping or veRL's config) sets them."""
    return {key: block.get(key, default) for key, default in CORRECTION_DEFAULTS.items()}


def uses_segments(block: Any) -> bool:
    """Whether a ``rollout_correction`` block asks for a segment level or a segment rejection option."""
    if block is None:
        return False
    if block.get("rollout_is", None) in SEGMENT_IS_LEVELS:
        return True
    rollout_rs = block.get("rollout_rs", None)
    return rollout_rs is not None and any(o.strip() in SEGMENT_RS_OPTIONS for o in str(rollout_rs).split(","))


def compute_rollout_correction(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    layout: SegmentLayout | None = None,
    rollout_is: str | None = None,
    rollout_is_threshold: Any = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold: Any = None,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """veRL's ``compute_rollout_correction_and_rejection_mask`` with the segment levels and options.

    ``layout``: the segments of the batch (needed where a segment level or option is asked for). veRL's own level
    and options run through veRL's function (with its off-policy metrics: KL, perplexities, chi-squared); a segment
    level replaces its weights, segment options drop segments from the mask it returns. Returns the ``(B, T)``
    weights (None without ``rollout_is``), the response mask with every rejection applied (its dtype) and the
    metrics under ``rollout_corr/``. Segment weights are computed in float32 (float64 stays float64)."""
    verl_pairs, segment_pairs = split_rejection_options(rollout_rs, rollout_rs_threshold)
    segment_level = rollout_is in SEGMENT_IS_LEVELS
    if (segment_level or segment_pairs) and layout is None:
        raise ValueError(f"rollout_is={rollout_is!r}, rollout_rs={rollout_rs!r}: segment modes need the segments")
    verl_rs, verl_threshold = _joined(verl_pairs)
    proto, new_mask, metrics = _verl_rc().compute_rollout_correction_and_rejection_mask(
        old_log_prob=old_log_prob,
        rollout_log_prob=rollout_log_prob,
        response_mask=response_mask,
        rollout_is=None if segment_level else rollout_is,
        rollout_is_threshold=rollout_is_threshold,
        rollout_is_batch_normalize=rollout_is_batch_normalize,
        rollout_rs=verl_rs,
        rollout_rs_threshold=verl_threshold,
    )
    weights = proto.batch["rollout_is_weights"] if proto is not None else None
    if not (segment_level or segment_pairs):
        return weights, new_mask, metrics
    dtype = torch.float64 if old_log_prob.dtype == torch.float64 else torch.float32
    log_ratio = old_log_prob.detach().to(dtype) - rollout_log_prob.detach().to(dtype)
    found: dict[str, float] = {}
    if segment_level:
        weights, found = segment_is_weights(
            log_ratio, response_mask, layout, rollout_is, rollout_is_threshold, rollout_is_batch_normalize
        )
    if segment_pairs:
        options = [option for option, _ in segment_pairs]
        bounds = _verl_rc()._parse_rollout_rs_thresholds(options, ",".join(spec for _, spec in segment_pairs))
        keep, rejection = segment_rejection_mask(log_ratio, response_mask, layout, options, bounds)
        new_mask = (new_mask * keep).to(response_mask.dtype)
        found.update(rejection)
        found.update(_overall_rejection(new_mask, response_mask))
    metrics.update({METRIC_PREFIX + key: value for key, value in found.items()})
    return weights, new_mask, metrics


def _overall_rejection(final_mask: torch.Tensor, response_mask: torch.Tensor) -> dict[str, float]:
    """veRL's fractions over every option together: of tokens dropped, and of responses (all rows) with one."""
    valid = response_mask.bool()
    dropped = valid & ~final_mask.bool()
    return {
        "rollout_rs_masked_fraction": float(dropped.sum()) / (float(valid.sum()) + 1e-8),
        "rollout_rs_seq_masked_fraction": float(dropped.any(dim=-1).float().mean()),
    }


def bypass_correction(policy_loss: Any) -> Any:
    """The ``rollout_correction`` block the driver copied into the actor's ``policy_loss`` for bypass mode
    (`maspo_verl.rollout_correction_config.prepare_rollout_correction`), or None: not in bypass mode, or nothing
    asked for."""
    block = policy_loss.get("rollout_correction", None) if policy_loss is not None else None
    if block is None or not block.get("bypass_mode", False):
        return None
    if block.get("rollout_is", None) is None and block.get("rollout_rs", None) is None:
        return None
    return block


def correct_in_bypass(
    block: Any,
    segmentation: Any,
    log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    response_ids: torch.Tensor | None = None,
    heard_words: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Bypass mode inside a policy loss whose ratio is taken against the rollout policy (``old_log_prob`` is
    ``pi_rollout``): veRL's ``bypass_mode`` loss with ``loss_type=ppo_clip`` computes the weights of the current
    policy against the rollout one for its metrics only (the ratio is the correction) and applies the rejection;
    so does this, on the segments of ``segmentation`` (the loss's own settings, `MaspoConfig.segment_layout`).
    Returns the response mask with the rejection applied and the ``rollout_corr/`` metrics."""
    layout = None
    if uses_segments(block):
        layout = segmentation.segment_layout(rollout_log_prob, response_mask, response_ids, heard_words)
    with torch.no_grad():
        _, mask, metrics = compute_rollout_correction(
            log_prob.detach(), rollout_log_prob, response_mask, layout, **correction_arguments(block)
        )
    return mask, metrics
