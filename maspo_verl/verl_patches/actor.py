"""Actor side: what the MASPO loss needs beyond veRL's policy-loss call, provided inside veRL's actor worker.

- ``ppo_loss`` (``verl.workers.utils.losses``, bound by name in ``verl.workers.engine_workers``): before veRL
  narrows the micro-batch, the wrapper pads its ``responses`` (nested in the v1 trainer, padded in the legacy one)
  to the response-mask width and provides them to the policy loss (`maspo_verl.loss_inputs`), with the heard words
  (`HEARD_WORDS_FIELD`) where the trainer hook put them in the batch (`maspo_verl.verl_patches.trainer`).
- ``ActorRolloutRefWorker.actor_worker_cls`` (veRL's own extension point) becomes a subclass of veRL's
  ``TrainingWorker`` that, for ``seg-mean``, counts the segments of each whole mini-batch (all-reduced over
  data-parallel ranks) before veRL splits it into micro-batches, and after the update reports the loss's metrics of
  the whole mini-batch from the sums each micro-batch's loss call recorded (`maspo_verl.loss_inputs.MetricSums`), so
  they do not depend on how veRL grouped the rows (fixed micro-batches or ``use_dynamic_bsz``).

Both are no-ops for other losses.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

MINIBATCH_SEGMENTS_KEY = "maspo_minibatch_num_segments"
HEARD_WORDS_FIELD = "maspo_heard_words"
"""The ``(B, T)`` batch field of the heard word on each response token (`maspo_base.frame_words`), written by the
trainer hook for a segmenter that needs heard words; the actor's micro-batches carry it as they carry
``responses``."""


def padded_response_fields(data: Any, names: tuple[str, ...], padding: int = 0) -> dict[str, torch.Tensor]:
    """``(B, T)`` padded tensors of ``names`` from a veRL micro- or mini-batch, in either layout (``padding`` pads)."""
    fields = {}
    for name in names:
        value = data[name]
        fields[name] = value.to_padded_tensor(padding) if value.is_nested else value
    return fields


def heard_words_of(data: Any) -> torch.Tensor | None:
    """The batch's heard words as a padded ``(B, T)`` tensor, or None where the trainer hook put none."""
    from maspo_base.frame_words import NOT_A_FRAME

    if HEARD_WORDS_FIELD not in data.keys():
        return None
    return padded_response_fields(data, (HEARD_WORDS_FIELD,), padding=NOT_A_FRAME)[HEARD_WORDS_FIELD]


def _actor_config(loss_fn: Any) -> Any:
    return getattr(loss_fn, "keywords", {}).get("config") if loss_fn is not None else None


def _uses_maspo(config: Any) -> bool:
    policy_loss = getattr(config, "policy_loss", None)
    return policy_loss is not None and policy_loss.get("loss_mode", "vanilla") == "maspo"


def wrap_ppo_loss(ppo_loss):
    """Wrap veRL's ``ppo_loss(config, model_output, data, dp_group)`` so MASPO sees the micro-batch's token ids."""
    from verl.utils import tensordict_utils as tu

    from maspo_verl.loss_inputs import provide_loss_inputs

    @functools.wraps(ppo_loss)
    def ppo_loss_with_maspo_inputs(config, model_output, data, dp_group=None):
        if not _uses_maspo(config) or "responses" not in data.keys():
            return ppo_loss(config, model_output, data, dp_group=dp_group)
        response_ids = padded_response_fields(data, ("responses",))["responses"]
        num_segments = tu.get_non_tensor_data(data=data, key=MINIBATCH_SEGMENTS_KEY, default=None)
        inputs = dict(response_ids=response_ids, minibatch_num_segments=num_segments, heard_words=heard_words_of(data))
        with provide_loss_inputs(**inputs):
            return ppo_loss(config, model_output, data, dp_group=dp_group)

    return ppo_loss_with_maspo_inputs


def count_minibatch_segments(config: Any, data: Any, dp_group: Any = None) -> int:
    """Segments in a mini-batch under the actor's MASPO settings, summed over the data-parallel group."""
    from maspo_verl.config import maspo_settings

    fields = padded_response_fields(data, ("responses", "response_mask", "old_log_probs"))
    layout = maspo_settings(config.policy_loss).segment_layout(
        fields["old_log_probs"], fields["response_mask"], fields["responses"], heard_words_of(data)
    )
    count = torch.tensor(layout.num_segments, dtype=torch.float64)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.SUM, group=dp_group)
    return int(count.item())


def minibatch_metrics(collected: Any, dp_group: Any = None) -> dict[str, float]:
    """The MASPO loss's metrics of a whole mini-batch: its calls' `METRIC_SUMS` summed over the micro-batches and
    the data-parallel group (every rank must call this, as it reduces)."""
    from maspo_verl.loss import METRIC_SUMS, metrics_from_sums

    totals = torch.tensor(collected.totals or [0.0] * len(METRIC_SUMS), dtype=torch.float64)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(totals, op=torch.distributed.ReduceOp.SUM, group=dp_group)
    return metrics_from_sums(totals.tolist())


def replace_step_metrics(metrics: dict, exact: dict[str, float]) -> None:
    """Put ``exact`` in place of the per-micro-batch values of a ``train_batch`` output's metrics (one value per
    data-parallel rank where veRL gathered them into a list, else one value)."""
    from verl.utils.metric import AggregationType, Metric

    for key, value in exact.items():
        if key not in metrics:
            continue
        if isinstance(metrics[key], list):
            metrics[key] = [Metric(AggregationType.MEAN, value) for _ in metrics[key]]
        else:
            metrics[key] = Metric(AggregationType.MEAN, value)


def segment_counting_worker_cls(base: type) -> type:
    """A subclass of veRL's ``TrainingWorker`` that, for the MASPO loss, attaches the mini-batch segment count for
    ``seg-mean`` before veRL cuts the mini-batch into micro-batches, and reports the loss's metrics of the whole
    mini-batch after it (veRL's mean over micro-batches would depend on how rows were grouped)."""
    from verl.utils import tensordict_utils as tu

    from maspo_verl.config import maspo_settings
    from maspo_verl.loss_inputs import collect_metric_sums

    class SegmentCountingTrainingWorker(base):
        def train_batch(self, data):
            config = _actor_config(self.loss_fn)
            if not _uses_maspo(config):
                return super().train_batch(data)
            dp_group = self.engine.get_data_parallel_group()
            if maspo_settings(config.policy_loss).loss_agg_mode == "seg-mean":
                tu.assign_non_tensor(data, **{MINIBATCH_SEGMENTS_KEY: count_minibatch_segments(config, data, dp_group)})
            with collect_metric_sums() as collected:
                output = super().train_batch(data)
            exact = minibatch_metrics(collected, dp_group)
            if output is not None:
                replace_step_metrics(tu.get(output, "metrics"), exact)
            return output

    return SegmentCountingTrainingWorker
