"""The reward's per-frame signals as the driver reads them: each sample's reward extras in the v1 trainer's
TransferQueue (`v1_extra_fields`, `v1_signals`), and the heard words placed on the response tokens
(`heard_words_on_tokens`). Read by the trainer hooks (`maspo_verl.verl_patches.trainer`: frame errors for credit,
heard words for the loss), the rollout correction's (`maspo_verl.verl_patches.rollout_correction`: heard words for its
segments) and the reward metrics (`maspo_verl.verl_patches.metrics`).
"""

from __future__ import annotations

from typing import Any

import torch

from maspo_base.frame_words import NOT_A_FRAME, UNHEARD, scatter_frame_words

HEARD_METRIC_PREFIX = "maspo_heard/"


def heard_words_on_tokens(
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    signals: Any,
    layout: Any,
    counted: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The ``(B, T)`` heard words of a padded batch (`maspo_base.frame_words.scatter_frame_words`: frames are the
    codec tokens of ``layout`` among the valid response tokens) and their metrics over the rows ``counted`` (all by
    default; the v1 trainer's padding samples are not): responses without alignment, heard words per aligned
    response, the fraction of their frames no heard word covers."""
    _, is_speech = layout.codec_ids(responses)
    frame_mask = is_speech & response_mask.to(torch.bool)
    if signals is None:
        signals = [None] * responses.shape[0]
    words, aligned = scatter_frame_words(list(signals), frame_mask)
    counted = torch.ones_like(aligned) if counted is None else counted.to(aligned.device)
    rows = aligned & counted
    ordered = words.sort(dim=-1).values  # distinct word indices of a row: where its sorted values change
    previous = torch.nn.functional.pad(ordered[:, :-1], (1, 0), value=NOT_A_FRAME)
    distinct_words = (ordered >= 0) & (ordered != previous) & rows.unsqueeze(-1)
    frames = (frame_mask & rows.unsqueeze(-1)).sum()
    unheard = ((words == UNHEARD) & rows.unsqueeze(-1)).sum()
    metrics = {
        HEARD_METRIC_PREFIX + "unaligned_samples": float((~aligned & counted).sum()),
        HEARD_METRIC_PREFIX + "words_per_response": float(distinct_words.sum()) / max(int(rows.sum()), 1),
        HEARD_METRIC_PREFIX + "unheard_frame_fraction": float(unheard) / max(int(frames), 1),
    }
    return words, metrics


def _reward_extra(extra_fields: Any, key: str) -> Any:
    if isinstance(extra_fields, dict):
        return (extra_fields.get("reward_extra_info") or {}).get(key)
    return None


def v1_signals(batch: Any, key: str) -> list:
    """Each sample's reward extra ``key`` (an encoded per-frame signal: frame errors, frame words) from the
    TransferQueue: the agent loop stores the reward's extras in ``extra_fields["reward_extra_info"]``; a colocated
    reward model writes them as fields of their own."""
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
