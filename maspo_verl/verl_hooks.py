"""Hooks into veRL 0.9.1's actor worker that feed `maspo_verl.loss_inputs`, without forking veRL.

- ``ppo_loss`` (``verl.workers.utils.losses``, bound by name in ``verl.workers.engine_workers``) is wrapped: before
  veRL narrows the micro-batch, the wrapper pads its ``responses`` (nested in the v1 trainer, padded in the legacy
  one) to the response-mask width and provides them to the policy loss.
- ``ActorRolloutRefWorker.actor_worker_cls`` (veRL's own extension point) becomes a subclass of veRL's
  ``TrainingWorker`` that, for the segment aggregation modes, counts the segments of each whole mini-batch
  (all-reduced over data-parallel ranks) before veRL splits it into micro-batches.

Both are installed by `install` on plugin import, in every veRL process, and are no-ops for other losses.

For ``adv_estimator=maspo`` (`maspo_verl.advantage`), in the process that computes advantages:

- veRL's ``compute_advantage`` (``verl.trainer.ppo.ray_trainer``, also bound in ``verl.trainer.ppo.v1.utils``) is
  wrapped: it reads each response's encoded frame errors (the reward extra ``algorithm.maspo.error_key``) and the
  response token ids, places frame k on the k-th codec token of the response (`scatter_frame_errors`) and provides
  them to the estimator (`maspo_verl.advantage_inputs`). The legacy trainer has both in the batch
  (``non_tensor_batch`` and ``responses``); the default (v1) trainer's ``PPOTrainer._compute_advantage`` reads only
  a few fields from its TransferQueue, so it is wrapped to fetch ``responses`` and ``extra_fields``
  (``reward_extra_info``) for the same keys. The KL penalty (``use_kl_in_reward``) changes only
  ``token_level_rewards``, never this channel.
- The estimator's metrics reach the step's log: through ``PPOTrainer._compute_advantage``'s ``metrics`` (v1) and
  through ``compute_data_metrics`` (legacy).
- ``verl.utils.config.validate_config`` (run by ``main_ppo`` in the driver, before Ray) also checks
  ``algorithm.maspo`` and ``trainer.samples``.

The listening page (`maspo_verl.listening`): both trainers' ``_dump_generations`` (validation and rollout dumps)
are wrapped to write decoded samples and ``samples.html`` after veRL's JSONL.

These modules are heavy to import, so they are patched when (and only where) they are imported.
"""

from __future__ import annotations

import contextvars
import functools
import importlib.abc
import os
import sys
from typing import Any

import torch

MINIBATCH_SEGMENTS_KEY = "maspo_minibatch_num_segments"


def padded_response_fields(data: Any, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """``(B, T)`` padded tensors of ``names`` from a veRL micro- or mini-batch, in either layout (zeros pad)."""
    fields = {}
    for name in names:
        value = data[name]
        fields[name] = value.to_padded_tensor(0) if value.is_nested else value
    return fields


def _actor_config(loss_fn: Any) -> Any:
    return getattr(loss_fn, "keywords", {}).get("config") if loss_fn is not None else None


def _uses_maspo(config: Any) -> bool:
    policy_loss = getattr(config, "policy_loss", None)
    return policy_loss is not None and policy_loss.get("loss_mode", "vanilla") == "maspo"


def wrap_ppo_loss(ppo_loss):
    """Wrap veRL's ``ppo_loss(config, model_output, data, dp_group)`` so MASPO sees the micro-batch's token ids."""
    if getattr(ppo_loss, "__maspo_wrapped__", False):
        return ppo_loss

    from verl.utils import tensordict_utils as tu

    from maspo_verl.loss_inputs import provide_loss_inputs

    @functools.wraps(ppo_loss)
    def ppo_loss_with_maspo_inputs(config, model_output, data, dp_group=None):
        if not _uses_maspo(config) or "responses" not in data.keys():
            return ppo_loss(config, model_output, data, dp_group=dp_group)
        response_ids = padded_response_fields(data, ("responses",))["responses"]
        num_segments = tu.get_non_tensor_data(data=data, key=MINIBATCH_SEGMENTS_KEY, default=None)
        with provide_loss_inputs(response_ids=response_ids, minibatch_num_segments=num_segments):
            return ppo_loss(config, model_output, data, dp_group=dp_group)

    ppo_loss_with_maspo_inputs.__maspo_wrapped__ = True
    return ppo_loss_with_maspo_inputs


def count_minibatch_segments(config: Any, data: Any, dp_group: Any = None) -> int:
    """Segments in a mini-batch under the actor's MASPO settings, summed over the data-parallel group."""
    from maspo_verl.config import maspo_settings

    fields = padded_response_fields(data, ("responses", "response_mask", "old_log_probs"))
    layout = maspo_settings(config.policy_loss).segment_layout(
        fields["old_log_probs"], fields["response_mask"], fields["responses"]
    )
    count = torch.tensor(layout.num_segments, dtype=torch.float64)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.SUM, group=dp_group)
    return int(count.item())


def segment_counting_worker_cls(base: type) -> type:
    """A subclass of veRL's ``TrainingWorker`` that attaches the mini-batch segment count for ``seg-mean``."""
    if getattr(base, "__maspo_wrapped__", False):
        return base

    from verl.utils import tensordict_utils as tu

    from maspo_verl.config import maspo_settings

    class SegmentCountingTrainingWorker(base):
        __maspo_wrapped__ = True

        def train_batch(self, data):
            config = _actor_config(self.loss_fn)
            if _uses_maspo(config) and maspo_settings(config.policy_loss).loss_agg_mode == "seg-mean":
                dp_group = self.engine.get_data_parallel_group()
                tu.assign_non_tensor(data, **{MINIBATCH_SEGMENTS_KEY: count_minibatch_segments(config, data, dp_group)})
            return super().train_batch(data)

    return SegmentCountingTrainingWorker


def install() -> None:
    """Install the loss hooks now and the advantage hooks when their modules are imported (idempotent)."""
    import verl.workers.engine_workers as engine_workers
    import verl.workers.utils.losses as losses

    wrapped = wrap_ppo_loss(losses.ppo_loss)
    losses.ppo_loss = wrapped
    engine_workers.ppo_loss = wrapped
    worker = engine_workers.ActorRolloutRefWorker
    worker.actor_worker_cls = segment_counting_worker_cls(worker.actor_worker_cls)
    install_credit_hooks()


# ----------------------------------------------------------------------------------------------------------------
# adv_estimator=maspo: the reward's frame errors into the estimator, its metrics into the log

CREDIT_TRACE_ENV = "MASPO_VERL_CREDIT_TRACE"
"""If set, a file path: each maspo advantage call appends one JSON line per response (token ids, frame errors as
placed, advantages), to check the alignment (the end-to-end tests do)."""

_pending_credit_metrics: dict[str, float] = {}
_v1_credit_fields: contextvars.ContextVar[dict | None] = contextvars.ContextVar("maspo_v1_credit_fields", default=None)


def _is_credit_estimator(adv_estimator: Any) -> bool:
    from maspo_verl.advantage import CREDIT_ESTIMATOR

    return getattr(adv_estimator, "value", adv_estimator) == CREDIT_ESTIMATOR


def credit_inputs_for(responses: torch.Tensor, response_mask: torch.Tensor, signals: Any, settings: Any):
    """`CreditInputs` of a padded batch: frame tokens are the codec ids of the valid response tokens."""
    from maspo_verl.advantage_inputs import CreditInputs
    from maspo_verl.frame_errors import scatter_frame_errors

    _, is_speech = settings.codec.vocabulary.codec_ids(responses)
    frame_mask = is_speech & response_mask.to(torch.bool)
    if signals is None:
        signals = [None] * responses.shape[0]
    errors, aligned = scatter_frame_errors(list(signals), frame_mask)
    return CreditInputs(frame_errors=errors, frame_mask=frame_mask, aligned=aligned)


def _write_credit_trace(path: str, data: Any, responses: torch.Tensor, inputs: Any) -> None:
    import json

    response_mask = data.batch["response_mask"]
    scores = data.batch["token_level_rewards"].sum(dim=-1)
    rows = []
    for i in range(responses.shape[0]):
        valid = response_mask[i].to(torch.bool)
        rows.append(
            {
                "uid": str(data.non_tensor_batch["uid"][i]),
                "score": float(scores[i]),
                "responses": responses[i, : valid.shape[0]][valid].tolist(),
                "frame_mask": inputs.frame_mask[i][valid].tolist(),
                "frame_errors": inputs.frame_errors[i][valid].tolist(),
                "aligned": bool(inputs.aligned[i]),
                "advantages": data.batch["advantages"][i][valid].tolist(),
            }
        )
    with open(path, "a") as handle:
        handle.write(json.dumps({"rows": rows, "metrics": inputs.metrics}) + "\n")


def wrap_compute_advantage(compute_advantage):
    """Wrap veRL's ``compute_advantage(data, adv_estimator, ...)`` to provide MASPO's credit inputs."""
    if getattr(compute_advantage, "__maspo_wrapped__", False):
        return compute_advantage

    @functools.wraps(compute_advantage)
    def compute_advantage_with_maspo_credit(data, adv_estimator, *args, **kwargs):
        if not _is_credit_estimator(adv_estimator):
            return compute_advantage(data, adv_estimator, *args, **kwargs)
        from maspo_verl.advantage_inputs import provide_credit_inputs
        from maspo_verl.config import credit_settings

        settings = credit_settings(kwargs.get("config"))
        v1_fields = _v1_credit_fields.get() or {}
        if "responses" in data.batch.keys():
            responses = data.batch["responses"]
            signals = data.non_tensor_batch.get(settings.error_key)
        else:
            responses = v1_fields.get("responses")
            signals = v1_fields.get("signals")
        if "response_mask" not in data.batch.keys():
            from verl.trainer.ppo.ray_trainer import compute_response_mask

            data.batch["response_mask"] = compute_response_mask(data)
        response_mask = data.batch["response_mask"]
        if responses is None:
            raise RuntimeError("adv_estimator=maspo: the batch holds no `responses` to place frame errors on")
        inputs = credit_inputs_for(responses[:, : response_mask.shape[1]], response_mask, signals, settings)
        with provide_credit_inputs(inputs):
            data = compute_advantage(data, adv_estimator, *args, **kwargs)
        _pending_credit_metrics.update(inputs.metrics)
        trace = os.environ.get(CREDIT_TRACE_ENV)
        if trace:
            _write_credit_trace(trace, data, responses, inputs)
        return data

    compute_advantage_with_maspo_credit.__maspo_wrapped__ = True
    return compute_advantage_with_maspo_credit


def pop_credit_metrics() -> dict[str, float]:
    """The metrics of the last maspo advantage call (once)."""
    metrics = dict(_pending_credit_metrics)
    _pending_credit_metrics.clear()
    return metrics


def _reward_extra(extra_fields: Any, key: str) -> Any:
    if isinstance(extra_fields, dict):
        return (extra_fields.get("reward_extra_info") or {}).get(key)
    return None


def wrap_v1_compute_advantage(method):
    """Wrap v1 ``PPOTrainer._compute_advantage(self, batch, metrics)``: fetch responses and frame errors for the
    batch's keys from the TransferQueue, and log the estimator's metrics."""
    if getattr(method, "__maspo_wrapped__", False):
        return method

    @functools.wraps(method)
    def compute_advantage_with_maspo_fields(self, batch, metrics):
        if not _is_credit_estimator(self.config.algorithm.adv_estimator):
            return method(self, batch, metrics)
        import transfer_queue as tq

        from maspo_verl.config import credit_settings

        key = credit_settings(self.config.algorithm).error_key
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["responses"])
        responses = data["responses"]
        responses = responses.to_padded_tensor(0) if responses.is_nested else responses
        signals = _v1_signals(batch, key)
        token = _v1_credit_fields.set({"responses": responses, "signals": signals})
        try:
            result = method(self, batch, metrics)
        finally:
            _v1_credit_fields.reset(token)
        metrics.update(pop_credit_metrics())
        return result

    compute_advantage_with_maspo_fields.__maspo_wrapped__ = True
    return compute_advantage_with_maspo_fields


def _v1_signals(batch: Any, key: str) -> list:
    """Each sample's encoded frame errors from the TransferQueue: the agent loop stores the reward's extras in
    ``extra_fields["reward_extra_info"]``; a colocated reward model writes them as fields of their own."""
    import transfer_queue as tq

    signals = [_reward_extra(extra, key) for extra in v1_extra_fields(batch)]
    if any(signal is not None for signal in signals):
        return signals
    try:
        own = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=[key])
        return _as_list(own[key])
    except Exception:  # noqa: BLE001 - no such field: every sample is reported as unaligned
        return signals


def v1_extra_fields(batch: Any) -> list:
    """Each sample's ``extra_fields`` (a dict per sample, padding samples included) of a v1 trainer batch, fetched
    from its TransferQueue; the queue hands them back as a stack or a list of wrapped values, unwrapped here."""
    import transfer_queue as tq

    fields = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"])
    return _as_list(fields["extra_fields"])


def _as_list(values: Any) -> list:
    if hasattr(values, "tolist") and not isinstance(values, list):
        values = values.tolist()
    return [getattr(v, "data", v) for v in list(values)]


def wrap_compute_data_metrics(compute_data_metrics):
    """Legacy trainer: add the estimator's metrics to the step's data metrics."""
    if getattr(compute_data_metrics, "__maspo_credit_metrics__", False):
        return compute_data_metrics

    @functools.wraps(compute_data_metrics)
    def compute_data_metrics_with_credit(*args, **kwargs):
        return {**compute_data_metrics(*args, **kwargs), **pop_credit_metrics()}

    compute_data_metrics_with_credit.__maspo_credit_metrics__ = True
    return compute_data_metrics_with_credit


def wrap_validate_config(validate_config):
    """``main_ppo``'s config check, run in the driver before Ray, plus ``algorithm.maspo``."""
    if getattr(validate_config, "__maspo_wrapped__", False):
        return validate_config

    @functools.wraps(validate_config)
    def validate_config_with_credit(config, *args, **kwargs):
        from maspo_verl.config import validate_algorithm_config
        from maspo_verl.listening import sample_settings

        validate_algorithm_config(config)
        sample_settings(config)
        return validate_config(config, *args, **kwargs)

    validate_config_with_credit.__maspo_wrapped__ = True
    return validate_config_with_credit


def wrap_dump_generations(method):
    """Wrap a trainer's ``_dump_generations(self, inputs, outputs, gts, scores, reward_extra_infos_dict,
    dump_path)`` (both trainers; validation and rollout dumps): after veRL's JSONL, the listening page's samples
    (`maspo_verl.listening`)."""
    if getattr(method, "__maspo_wrapped__", False):
        return method

    @functools.wraps(method)
    def dump_generations_with_samples(self, inputs, outputs, gts, scores, reward_extra_infos_dict, dump_path):
        result = method(self, inputs, outputs, gts, scores, reward_extra_infos_dict, dump_path)
        from maspo_verl.listening import after_dump

        after_dump(self, inputs, outputs, gts, scores, reward_extra_infos_dict, dump_path)
        return result

    dump_generations_with_samples.__maspo_wrapped__ = True
    return dump_generations_with_samples


def _patch_ray_trainer(module) -> None:
    module.compute_advantage = wrap_compute_advantage(module.compute_advantage)
    module.compute_data_metrics = wrap_compute_data_metrics(module.compute_data_metrics)
    module.RayPPOTrainer._dump_generations = wrap_dump_generations(module.RayPPOTrainer._dump_generations)


def _patch_v1_utils(module) -> None:
    module.compute_advantage = wrap_compute_advantage(module.compute_advantage)


def _patch_v1_trainer_base(module) -> None:
    module.PPOTrainer._compute_advantage = wrap_v1_compute_advantage(module.PPOTrainer._compute_advantage)
    module.PPOTrainer._dump_generations = wrap_dump_generations(module.PPOTrainer._dump_generations)


def _patch_config(module) -> None:
    module.validate_config = wrap_validate_config(module.validate_config)


CREDIT_PATCHES = {
    "verl.utils.config": _patch_config,
    "verl.trainer.ppo.ray_trainer": _patch_ray_trainer,
    "verl.trainer.ppo.v1.utils": _patch_v1_utils,
    "verl.trainer.ppo.v1.trainer_base": _patch_v1_trainer_base,
}


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Runs ``CREDIT_PATCHES[name]`` on a module right after it is executed, wherever it is imported."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in CREDIT_PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader, CREDIT_PATCHES[fullname])
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader, patch):
        self._loader, self._patch = loader, patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._patch(module)


def install_credit_hooks() -> None:
    """Patch the advantage modules now if imported, else right after their import (idempotent)."""
    for name, patch in CREDIT_PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name])
    if not any(isinstance(finder, _PatchAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterImport())
