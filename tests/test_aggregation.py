"""Every aggregation mode gives the same total loss and gradients whether a mini-batch is processed whole or split
into micro-batches (each trimmed to its own longest response, as veRL's nested layout does)."""

import pytest
import torch
from loss_helpers import VERL_AGG_MODES, actor_config, random_batch

from maspo_verl.config import maspo_settings
from maspo_verl.loss import aggregate_over_segments, compute_policy_loss_maspo
from maspo_verl.loss_inputs import provide_loss_inputs
from maspo_verl.segmentation.segment_ids import SegmentLayout, starts_from_ids

MODES = VERL_AGG_MODES + ["seg-mean", "seq-mean-seg-mean"]


def _total(config, old, new, advantages, mask, response_ids, rows_per_micro_batch, num_segments):
    total = 0.0
    for start in range(0, old.shape[0], rows_per_micro_batch):
        rows = slice(start, start + rows_per_micro_batch)
        width = max(int(mask[rows].sum(-1).max()), 1)
        with provide_loss_inputs(response_ids=response_ids[rows, :width], minibatch_num_segments=num_segments):
            loss, _ = compute_policy_loss_maspo(
                old_log_prob=old[rows, :width],
                log_prob=new[rows, :width],
                advantages=advantages[rows, :width],
                response_mask=mask[rows, :width],
                loss_agg_mode="token-mean",
                config=config,
            )
        total = total + loss
    return total


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("segmenter", [{"name": "fixed", "window": 3}, {"name": "token_jump", "threshold": 2}])
def test_micro_batch_split_gives_the_same_loss_and_gradient(mode, segmenter):
    old, new, advantages, mask = random_batch(batch=8, width=10, scale=0.4, seed=11)
    response_ids = 128264 + torch.randint(0, 6, mask.shape, generator=torch.Generator().manual_seed(3))
    response_ids = response_ids.to(mask.device)
    config = actor_config(segmenter=segmenter, loss_agg_mode=mode, clip_ratio_low=0.1, clip_ratio_high=0.1)
    num_segments = maspo_settings(config.policy_loss).segment_layout(old, mask, response_ids).num_segments
    config.global_batch_info.update(
        dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=8, loss_scale_factor=10
    )

    whole = _total(config, old, new, advantages, mask, response_ids, 8, num_segments)
    (whole_grad,) = torch.autograd.grad(whole, new)
    for rows in (1, 3):
        split = _total(config, old, new, advantages, mask, response_ids, rows, num_segments)
        (split_grad,) = torch.autograd.grad(split, new)
        torch.testing.assert_close(split, whole, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(split_grad, whole_grad, rtol=1e-12, atol=1e-14)


def test_seg_mean_weighs_every_segment_equally():
    # Two responses: one segment of 4 tokens with loss 1 per token, four one-token segments with loss 3 each.
    # seg-mean = (1 + 3 + 3 + 3 + 3) / 5; seq-mean-seg-mean = (1 + 3) / 2; token-mean would be (4 + 12) / 8.
    mask = torch.ones(2, 4, dtype=torch.bool)
    layout = SegmentLayout.from_starts(starts_from_ids(torch.tensor([[0, 0, 0, 0], [0, 1, 2, 3]]), mask), mask)
    loss = torch.tensor([[1.0, 1.0, 1.0, 1.0], [3.0, 3.0, 3.0, 3.0]], dtype=torch.float64)
    assert aggregate_over_segments(loss, layout, mask, "seg-mean").item() == pytest.approx(13 / 5)
    assert aggregate_over_segments(loss, layout, mask, "seq-mean-seg-mean").item() == pytest.approx(2.0)
    # global counts from the mini-batch and dp scaling, as agg_loss applies them
    assert aggregate_over_segments(loss, layout, mask, "seg-mean", 10, dp_size=2).item() == pytest.approx(13 / 10 * 2)
    with pytest.raises(ValueError, match="mini-batch segment count"):
        aggregate_over_segments(loss, layout, mask, "seg-mean", dp_size=2)
