"""Trainer side: the reward's frame errors into ``adv_estimator=maspo``, and ``algorithm.maspo`` checked early.

In the process that computes advantages:

- veRL's ``compute_advantage`` (``verl.trainer.ppo.ray_trainer``, also bound in ``verl.trainer.ppo.v1.utils``) is
  wrapped: it reads each response's encoded frame errors (the reward extra ``algorithm.maspo.error_key``) and the
  response token ids, places frame k on the k-th codec token of the response (`scatter_frame_errors`) and provides
  them to the estimator (`maspo_verl.advantage_inputs`). The legacy trainer has both in the batch
  (``non_tensor_batch`` and ``responses``); the default (v1) trainer's ``PPOTrainer._compute_advantage`` reads only
  a few fields from its TransferQueue, so it is wrapped to fetch ``responses`` and ``extra_fields``
  (``reward_extra_info``) for the same keys. The KL penalty (``use_kl_in_reward``) changes only
  ``token_level_rewards``, never this channel.
- The estimator's metrics reach the step's log: through ``PPOTrainer._compute_advantage``'s ``metrics`` (v1) and
  through ``compute_data_metrics`` (legacy, `maspo_verl.verl_patches.metrics`).
- ``verl.utils.config.validate_config`` (run by ``main_ppo`` in the driver, before Ray) also checks
  ``algorithm.maspo``.
"""

from __future__ import annotations

import contextvars
import functools
import os
from typing import Any

import torch

from maspo_verl.advantage_inputs import CreditInputs, provide_credit_inputs
from maspo_verl.config import CREDIT_ESTIMATOR, credit_settings, normalize_policy_loss, validate_algorithm_config
from reward_fns.frame_errors import scatter_frame_errors

CREDIT_TRACE_ENV = "MASPO_VERL_CREDIT_TRACE"
"""If set, a file path: each maspo advantage call appends one JSON line per response (token ids, frame errors as
placed, advantages), to check the alignment (the end-to-end tests do)."""

_pending_credit_metrics: dict[str, float] = {}
_v1_credit_fields: contextvars.ContextVar[dict | None] = contextvars.ContextVar("maspo_v1_credit_fields", default=None)


def _is_credit_estimator(adv_estimator: Any) -> bool:
    return getattr(adv_estimator, "value", adv_estimator) == CREDIT_ESTIMATOR


def credit_inputs_for(responses: torch.Tensor, response_mask: torch.Tensor, signals: Any, settings: Any):
    """`CreditInputs` of a padded batch: frame tokens are the codec ids of the valid response tokens."""
    _, is_speech = settings.codec.speech_tokens.codec_ids(responses)
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

    @functools.wraps(compute_advantage)
    def compute_advantage_with_maspo_credit(data, adv_estimator, *args, **kwargs):
        if not _is_credit_estimator(adv_estimator):
            return compute_advantage(data, adv_estimator, *args, **kwargs)
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

    @functools.wraps(method)
    def compute_advantage_with_maspo_fields(self, batch, metrics):
        if not _is_credit_estimator(self.config.algorithm.adv_estimator):
            return method(self, batch, metrics)
        import transfer_queue as tq

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


def wrap_validate_config(validate_config):
    """``main_ppo``'s config check, run in the driver before Ray: first the policy loss's shorthand is expanded
    (`maspo_verl.config.normalize_policy_loss`; the workers receive the full block), then veRL's checks run, plus
    ``algorithm.maspo`` and the listening page's ``trainer.samples``."""

    @functools.wraps(validate_config)
    def validate_config_with_credit(config, *args, **kwargs):
        from maspo_verl.listening import sample_settings

        normalize_policy_loss(config)
        validate_algorithm_config(config)
        sample_settings(config)
        return validate_config(config, *args, **kwargs)

    return validate_config_with_credit


def wrap_dump_generations(method):
    """Wrap a trainer's ``_dump_generations(self, inputs, outputs, gts, scores, reward_extra_infos_dict,
    dump_path)`` (both trainers; validation and rollout dumps): after veRL's JSONL, the listening page's samples
    (`maspo_verl.listening`)."""

    @functools.wraps(method)
    def dump_generations_with_samples(self, inputs, outputs, gts, scores, reward_extra_infos_dict, dump_path):
        result = method(self, inputs, outputs, gts, scores, reward_extra_infos_dict, dump_path)
        from maspo_verl.listening import after_dump

        after_dump(self, inputs, outputs, gts, scores, reward_extra_infos_dict, dump_path)
        return result

    return dump_generations_with_samples
