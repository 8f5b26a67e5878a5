"""Metrics: every numeric part of a custom reward's dict as ``reward/<key>/mean``, and the credit metrics, each step.

A ``reward.custom_reward_function`` may return ``{"score": s, "content": c, ...}``; veRL 0.9.1's reward loop keeps
the extra keys per sample (``reward_extra_info``) but logs them only in validation. Both trainers, without forking
them:

- legacy trainer (``trainer.use_v1=False``): the batch carries the parts in ``non_tensor_batch`` under the keys
  ``meta_info["reward_extra_keys"]``; ``compute_data_metrics`` (``verl.trainer.ppo.metric_utils``, bound by name in
  both trainers) is wrapped, once, to add their means and the last ``adv_estimator=maspo`` call's metrics.
- v1 trainer: the parts travel in each sample's ``extra_fields["reward_extra_info"]`` in the TransferQueue;
  ``PPOTrainer._compute_metrics`` is wrapped to read them and add their means (its credit metrics are logged by the
  ``_compute_advantage`` patch, `maspo_verl.verl_patches.trainer`).

Keys whose values are not all finite numbers (strings, ``None``, NaN) are skipped; ``score`` is skipped
(``critic/score/mean`` is the same number).
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any

from maspo_verl.verl_patches.reward_signals import v1_extra_fields
from maspo_verl.verl_patches.trainer import pop_credit_metrics

PREFIX = "reward/"
SKIPPED = frozenset({"score"})


def part_means(parts: Mapping[str, Iterable[Any]]) -> dict[str, float]:
    """``{"reward/<key>/mean": mean}`` for every key whose values are all finite real numbers (bools count)."""
    metrics = {}
    for key, values in parts.items():
        if key in SKIPPED:
            continue
        values = list(values)
        if not values or not all(isinstance(v, numbers.Real) for v in values):
            continue
        floats = [float(v) for v in values]
        if all(math.isfinite(v) for v in floats):
            metrics[f"{PREFIX}{key}/mean"] = sum(floats) / len(floats)
    return metrics


def _as_python(values: Any) -> list[Any]:
    return values.tolist() if hasattr(values, "tolist") else list(values)


def legacy_batch_parts(batch: Any) -> dict[str, list[Any]]:
    """Reward parts of a legacy-trainer ``DataProto`` batch (see the module docstring)."""
    keys = batch.meta_info.get("reward_extra_keys", []) or []
    return {key: _as_python(batch.non_tensor_batch[key]) for key in keys if key in batch.non_tensor_batch}


def wrap_compute_data_metrics(compute_data_metrics):
    """``compute_data_metrics(batch, use_critic)`` plus the reward parts' means and the credit metrics."""

    @functools.wraps(compute_data_metrics)
    def compute_data_metrics_with_maspo(batch, *args, **kwargs):
        metrics = compute_data_metrics(batch, *args, **kwargs)
        if hasattr(batch, "meta_info") and hasattr(batch, "non_tensor_batch"):
            metrics.update(part_means(legacy_batch_parts(batch)))
        metrics.update(pop_credit_metrics())
        return metrics

    return compute_data_metrics_with_maspo


def extra_fields_parts(extra_fields: Iterable[Any]) -> dict[str, list[Any]]:
    """Reward parts from v1 per-sample ``extra_fields`` dicts; a key missing in some sample is left out."""
    infos = [f.get("reward_extra_info", {}) if isinstance(f, Mapping) else {} for f in extra_fields]
    if not infos:
        return {}
    common = set(infos[0]).intersection(*infos[1:])
    return {key: [info[key] for info in infos] for key in sorted(common)}


def wrap_v1_compute_metrics(compute_metrics):
    """v1 ``PPOTrainer._compute_metrics(self, batch, metrics, ...)`` plus the reward parts' means."""

    @functools.wraps(compute_metrics)
    def compute_metrics_with_reward_parts(self, batch, metrics, *args, **kwargs):
        result = compute_metrics(self, batch, metrics, *args, **kwargs)
        keep = [i for i, tag in enumerate(batch.tags) if not tag.get("is_padding", False)]
        extra_fields = v1_extra_fields(batch)
        metrics.update(part_means(extra_fields_parts([extra_fields[i] for i in keep])))
        return result

    return compute_metrics_with_reward_parts
