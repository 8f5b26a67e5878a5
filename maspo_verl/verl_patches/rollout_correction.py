"""Trainer side of the segment-level rollout correction (`maspo_verl.rollout_correction`), in the driver.

- ``compute_rollout_correction_and_add_to_batch`` (``verl.trainer.ppo.rollout_corr_helper``, where the legacy
  trainer looks it up at each step; bound by name in the v1 trainer) is wrapped: a block that asks for a segment
  level or option (``rollout_is=segment``, ``rollout_rs=seg_mean_k1``, ...) is computed here, over the segments of
  its segmentation (`maspo_verl.rollout_correction_config.segmentation_settings`), veRL's own modes beside them
  through veRL's function; the batch gains ``rollout_is_weights`` and the rejection's response mask as veRL's
  would, so any policy loss uses them. Other blocks go to veRL unchanged.
- A segmenter of heard words (``heard_words``) cuts at what the reward heard: the reward runs with the rollout, so
  its ``frame_words`` are there when the correction runs (legacy trainer: the batch's ``non_tensor_batch``; v1
  trainer: each sample's ``extra_fields`` in the TransferQueue), and are placed on the response tokens as for the
  loss (`maspo_verl.verl_patches.reward_signals.heard_words_on_tokens`); a response without them (unscored, no
  timestamps, no ``frame_words`` reported) is cut by the segmenter's ``fallback``, as in the loss.
- The v1 trainer's ``_compute_advantage`` reads only a few fields from its TransferQueue; where the segmenter reads
  token ids (``fsq``, ``token_jump``) or heard words, `fetched_responses` (entered by the trainer patch of that
  method) fetches ``responses`` (and the frame words) for the correction.
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

from maspo_base.frame_words import FRAME_WORDS_KEY
from maspo_base.typed_settings import to_plain
from maspo_verl.rollout_correction import compute_rollout_correction, correction_arguments, uses_segments
from maspo_verl.rollout_correction_config import ROLLOUT_CORRECTION_KEY, correction_segmenter, segmentation_settings
from maspo_verl.verl_patches.actor import padded_response_fields
from maspo_verl.verl_patches.reward_signals import HEARD_METRIC_PREFIX, heard_words_on_tokens, v1_signals

_RESPONSES: contextvars.ContextVar[torch.Tensor | None] = contextvars.ContextVar("maspo_rc_responses", default=None)
_FRAME_WORDS: contextvars.ContextVar[tuple[list, torch.Tensor] | None] = contextvars.ContextVar(
    "maspo_rc_frame_words", default=None
)
"""The v1 trainer's frame words for the correction: each sample's signal, and which samples are counted (not the
trainer's padding samples)."""
HEARD_UNALIGNED_METRIC = "rollout_corr/heard_unaligned_samples"
"""Responses the correction's heard-words segmenter found without alignment (cut by its ``fallback``)."""


def _fitted(responses: torch.Tensor, width: int) -> torch.Tensor:
    """``responses`` cut or right-padded (with 0) to the response mask's width."""
    if responses.shape[-1] >= width:
        return responses[:, :width]
    return torch.nn.functional.pad(responses, (0, width - responses.shape[-1]))


def _response_ids(data: Any, width: int) -> torch.Tensor | None:
    responses = data["responses"] if "responses" in data.keys() else _RESPONSES.get()
    return None if responses is None else _fitted(responses, width)


def heard_words_for_correction(
    batch: Any, settings: Any, response_ids: torch.Tensor | None, response_mask: torch.Tensor
) -> tuple[torch.Tensor, dict[str, float]]:
    """The ``(B, T)`` heard words of the batch for the correction's segmenter (the reward's ``frame_words`` on the
    codec tokens of ``settings.codec``, as the trainer hook places them for the loss) and the count of responses
    without alignment. ``frame_words`` come from the legacy batch's ``non_tensor_batch``, else from the v1 trainer's
    TransferQueue (`fetched_responses`); where neither holds them every response is unaligned."""
    if response_ids is None:
        raise RuntimeError(
            f"{ROLLOUT_CORRECTION_KEY}.segmenter.name={settings.segmenter.name!r}: the batch holds no `responses` "
            "to place the reward's frame_words on"
        )
    signals, counted = batch.non_tensor_batch.get(FRAME_WORDS_KEY), None
    if signals is None and _FRAME_WORDS.get() is not None:
        signals, counted = _FRAME_WORDS.get()
    words, heard = heard_words_on_tokens(response_ids, response_mask, signals, settings.codec.speech_tokens, counted)
    return words, {HEARD_UNALIGNED_METRIC: heard[HEARD_METRIC_PREFIX + "unaligned_samples"]}


def segment_correction(batch: Any, rollout_corr_config: Any) -> tuple[Any, dict[str, float]]:
    """veRL's ``compute_rollout_correction_and_add_to_batch`` for a block with segment modes: the segments of the
    block's segmentation (on the trainer's ``old_log_probs``, the mask, the token ids and, for a segmenter of heard
    words, `heard_words_for_correction`), the weights into ``rollout_is_weights``, the rejection into
    ``response_mask``, the metrics under ``rollout_corr/``."""
    from verl.protocol import DataProto

    settings = segmentation_settings(to_plain(rollout_corr_config))
    data = batch.batch
    response_mask = data["response_mask"]
    old_log_prob = data["old_log_probs"]
    response_ids = _response_ids(data, response_mask.shape[-1])
    heard_words, heard_metrics = None, {}
    if correction_segmenter(rollout_corr_config).needs_heard_words:
        heard_words, heard_metrics = heard_words_for_correction(batch, settings, response_ids, response_mask)
    layout = settings.segment_layout(old_log_prob, response_mask, response_ids, heard_words)
    weights, new_mask, metrics = compute_rollout_correction(
        old_log_prob, data["rollout_log_probs"], response_mask, layout, **correction_arguments(rollout_corr_config)
    )
    metrics.update(heard_metrics)
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


def fetch_responses(batch: Any) -> torch.Tensor:
    """The padded ``(B, T)`` ``responses`` of a v1 trainer batch (its keys), from the TransferQueue."""
    import transfer_queue as tq

    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["responses"])
    return padded_response_fields(data, ("responses",))["responses"]


@contextlib.contextmanager
def fetched_responses(trainer: Any, batch: Any) -> Iterator[torch.Tensor | None]:
    """Within the v1 trainer's ``_compute_advantage(batch, ...)``: the batch's ``responses`` for the correction,
    where its segmenter reads token ids or heard words (decoupled mode only: bypass mode corrects in the loss), and
    for heard words each sample's ``frame_words`` (`maspo_verl.verl_patches.reward_signals.v1_signals`); yields the
    responses (None where none were needed), so that the credit's hook need not fetch them again."""
    block = trainer.config.algorithm.get("rollout_correction", None)
    if not uses_segments(block) or block.get("bypass_mode", False):
        yield None
        return
    segmenter = correction_segmenter(block)  # heard words are placed on the codec tokens among the ids
    if not (segmenter.needs_response_ids or segmenter.needs_heard_words):
        yield None
        return
    responses = fetch_responses(batch)
    token = _RESPONSES.set(responses)
    words_token = None
    if segmenter.needs_heard_words:
        counted = torch.tensor([not tag.get("is_padding", False) for tag in batch.tags], dtype=torch.bool)
        words_token = _FRAME_WORDS.set((v1_signals(batch, FRAME_WORDS_KEY), counted))
    try:
        yield responses
    finally:
        if words_token is not None:
            _FRAME_WORDS.reset(words_token)
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
