"""Trainer side of the segment-level rollout correction (`maspo_verl.rollout_correction`), in the driver.

- ``compute_rollout_correction_and_add_to_batch`` (``verl.trainer.ppo.rollout_corr_helper``, where the legacy
  trainer looks it up at each step; bound by name in the v1 trainer) is wrapped: a block that asks for a segment
  level or option (``rollout_is=segment``, ``rollout_rs=seg_mean_k1``, ...) is computed here, over the segments of
  its segmentation (`maspo_verl.rollout_correction_config.segmentation_settings`), veRL's own modes beside them
  through veRL's function; the batch gains ``rollout_is_weights`` and the rejection's response mask as veRL's
  would, so any policy loss uses them. Other blocks go to veRL unchanged.
- The v1 trainer's ``_compute_advantage`` reads only a few fields from its TransferQueue; where the segmenter reads
  token ids (``fsq``, ``token_jump``), `fetched_responses` (entered by the trainer patch of that method) fetches
  ``responses`` for the correction.
- ``apply_bypass_mode`` (legacy trainer) sets the driver's ``policy_loss.loss_mode`` to ``bypass_mode`` at every
  step, after the workers were built with the real one; for ``maspo`` the driver's copy keeps saying ``maspo``, so
  that the driver's hooks that read it (the heard words, `maspo_verl.verl_patches.trainer`) still see MASPO.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator
from typing import Any

import torch

from maspo_base.typed_settings import to_plain
from maspo_verl.rollout_correction import compute_rollout_correction, correction_arguments, uses_segments
from maspo_verl.rollout_correction_config import segmentation_settings
from maspo_verl.verl_patches.actor import padded_response_fields

_RESPONSES: contextvars.ContextVar[torch.Tensor | None] = contextvars.ContextVar("maspo_rc_responses", default=None)


def _fitted(responses: torch.Tensor, width: int) -> torch.Tensor:
    """``responses`` cut or right-padded (with 0) to the response mask's width."""
    if responses.shape[-1] >= width:
        return responses[:, :width]
    return torch.nn.functional.pad(responses, (0, width - responses.shape[-1]))


def _response_ids(data: Any, width: int) -> torch.Tensor | None:
    responses = data["responses"] if "responses" in data.keys() else _RESPONSES.get()
    return None if responses is None else _fitted(responses, width)


def segment_correction(batch: Any, rollout_corr_config: Any) -> tuple[Any, dict[str, float]]:
    """veRL's ``compute_rollout_correction_and_add_to_batch`` for a block with segment modes: the segments of the
    block's segmentation (on the trainer's ``old_log_probs``, the mask and the token ids), the weights into
    ``rollout_is_weights``, the rejection into ``response_mask``, the metrics under ``rollout_corr/``."""
    from verl.protocol import DataProto

    settings = segmentation_settings(to_plain(rollout_corr_config))
    data = batch.batch
    response_mask = data["response_mask"]
    old_log_prob = data["old_log_probs"]
    response_ids = _response_ids(data, response_mask.shape[-1])
    layout = settings.segment_layout(old_log_prob, response_mask, response_ids)
    weights, new_mask, metrics = compute_rollout_correction(
        old_log_prob, data["rollout_log_probs"], response_mask, layout, **correction_arguments(rollout_corr_config)
    )
    data["response_mask"] = new_mask
    if weights is not None:
        batch = batch.union(DataProto.from_dict(tensors={"rollout_is_weights": weights}))
    return batch, metrics


def wrap_add_to_batch(compute_rollout_correction_and_add_to_batch):
    """Wrap veRL's ``compute_rollout_correction_and_add_to_batch(batch, rollout_corr_config)``: segment modes here,
    everything else in veRL."""

    @functools.wraps(compute_rollout_correction_and_add_to_batch)
    def rollout_correction_with_segments(batch, rollout_corr_config):
        if not uses_segments(rollout_corr_config):
            return compute_rollout_correction_and_add_to_batch(batch, rollout_corr_config)
        return segment_correction(batch, rollout_corr_config)

    return rollout_correction_with_segments


def _reads_token_ids(block: Any) -> bool:
    from maspo_verl.segmentation import get_segmenter

    settings = segmentation_settings(to_plain(block))
    return get_segmenter(settings.segmenter.name).needs_response_ids


def fetch_responses(batch: Any) -> torch.Tensor:
    """The padded ``(B, T)`` ``responses`` of a v1 trainer batch (its keys), from the TransferQueue."""
    import transfer_queue as tq

    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["responses"])
    return padded_response_fields(data, ("responses",))["responses"]


@contextlib.contextmanager
def fetched_responses(trainer: Any, batch: Any) -> Iterator[torch.Tensor | None]:
    """Within the v1 trainer's ``_compute_advantage(batch, ...)``: the batch's ``responses`` for the correction,
    where its segmenter reads token ids (decoupled mode only: bypass mode corrects in the loss); yields them (None
    where none were needed), so that the credit's hook need not fetch them again."""
    block = trainer.config.algorithm.get("rollout_correction", None)
    if not uses_segments(block) or block.get("bypass_mode", False) or not _reads_token_ids(block):
        yield None
        return
    responses = fetch_responses(batch)
    token = _RESPONSES.set(responses)
    try:
        yield responses
    finally:
        _RESPONSES.reset(token)


def wrap_apply_bypass_mode(apply_bypass_mode):
    """Wrap veRL's ``apply_bypass_mode(batch, rollout_corr_config, policy_loss_config)``: the driver's
    ``policy_loss.loss_mode`` stays ``maspo`` (see the module docstring)."""

    @functools.wraps(apply_bypass_mode)
    def bypass_keeping_maspo(batch, rollout_corr_config=None, policy_loss_config=None):
        loss_mode = policy_loss_config.get("loss_mode", None) if policy_loss_config is not None else None
        result = apply_bypass_mode(
            batch, rollout_corr_config=rollout_corr_config, policy_loss_config=policy_loss_config
        )
        if loss_mode == "maspo":
            from omegaconf import open_dict

            with open_dict(policy_loss_config):
                policy_loss_config["loss_mode"] = loss_mode
        return result

    return bypass_keeping_maspo
