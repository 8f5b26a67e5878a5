"""Every numeric part of a custom reward's dict, logged as a veRL metric each training step: ``reward/<key>/mean``.

A ``reward.custom_reward_function`` may return ``{"score": s, "content": c, ...}``; veRL 0.9.1's reward loop keeps
the extra keys per sample (``reward_extra_info``) but logs them only in validation. This module closes that gap in
both trainers without forking them:

- legacy trainer (``trainer.use_v1=False``): the batch carries the parts in ``non_tensor_batch`` under the keys
  ``meta_info["reward_extra_keys"]``; ``compute_data_metrics`` (``verl.trainer.ppo.metric_utils``, bound by name
  in ``ray_trainer``) is wrapped to add their means.
- v1 trainer: the parts travel in each sample's ``extra_fields["reward_extra_info"]`` in the transfer queue;
  ``PPOTrainer._compute_metrics`` is wrapped to read them and add their means.

Keys whose values are not all finite numbers (strings, ``None``, NaN) are skipped; ``score`` is skipped
(``critic/score/mean`` is the same number). Installed on plugin import (`maspo_verl.verl_plugin`).
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any

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
    if getattr(compute_data_metrics, "__maspo_reward_parts__", False):
        return compute_data_metrics

    @functools.wraps(compute_data_metrics)
    def compute_data_metrics_with_reward_parts(batch, *args, **kwargs):
        metrics = compute_data_metrics(batch, *args, **kwargs)
        if hasattr(batch, "meta_info") and hasattr(batch, "non_tensor_batch"):
            metrics.update(part_means(legacy_batch_parts(batch)))
        return metrics

    compute_data_metrics_with_reward_parts.__maspo_reward_parts__ = True
    return compute_data_metrics_with_reward_parts


def extra_fields_parts(extra_fields: Iterable[Any]) -> dict[str, list[Any]]:
    """Reward parts from v1 per-sample ``extra_fields`` dicts; a key missing in some sample is left out."""
    infos = [f.get("reward_extra_info", {}) if isinstance(f, Mapping) else {} for f in extra_fields]
    if not infos:
        return {}
    common = set(infos[0]).intersection(*infos[1:])
    return {key: [info[key] for info in infos] for key in sorted(common)}


def wrap_v1_compute_metrics(compute_metrics):
    if getattr(compute_metrics, "__maspo_reward_parts__", False):
        return compute_metrics

    @functools.wraps(compute_metrics)
    def compute_metrics_with_reward_parts(self, batch, metrics, *args, **kwargs):
        result = compute_metrics(self, batch, metrics, *args, **kwargs)
        from maspo_verl.verl_hooks import v1_extra_fields

        keep = [i for i, tag in enumerate(batch.tags) if not tag.get("is_padding", False)]
        extra_fields = v1_extra_fields(batch)
        metrics.update(part_means(extra_fields_parts([extra_fields[i] for i in keep])))
        return result

    compute_metrics_with_reward_parts.__maspo_reward_parts__ = True
    return compute_metrics_with_reward_parts


class _PatchAfterImport:
    """A ``sys.meta_path`` finder that runs ``patch(module)`` right after ``name`` is first imported.

    The trainers' modules are heavy (the v1 trainer takes tens of seconds to import on a small CPU): they are
    patched when the trainer process imports them, and never imported by the plugin itself."""

    def __init__(self, name: str, patch) -> None:
        self.name, self.patch = name, patch

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        import importlib.util
        import sys

        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module, patch = spec.loader.exec_module, self.patch

        def exec_and_patch(module):
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_and_patch
        sys.meta_path.remove(self)
        return spec


def _after_import(name: str, patch) -> None:
    import sys

    if name in sys.modules:
        patch(sys.modules[name])
    else:
        sys.meta_path.insert(0, _PatchAfterImport(name, patch))


def _patch_metric_utils(module) -> None:
    module.compute_data_metrics = wrap_compute_data_metrics(module.compute_data_metrics)
    import sys

    for name in ("verl.trainer.ppo.ray_trainer", "verl.trainer.ppo.v1.trainer_base"):
        user = sys.modules.get(name)
        if user is not None and hasattr(user, "compute_data_metrics"):  # imported before the plugin
            user.compute_data_metrics = module.compute_data_metrics


def _patch_v1_trainer(module) -> None:
    module.PPOTrainer._compute_metrics = wrap_v1_compute_metrics(module.PPOTrainer._compute_metrics)


def install() -> None:
    """Wrap both trainers' metric collection when (and if) the trainer process imports them (idempotent)."""
    _after_import("verl.trainer.ppo.metric_utils", _patch_metric_utils)
    _after_import("verl.trainer.ppo.v1.trainer_base", _patch_v1_trainer)
