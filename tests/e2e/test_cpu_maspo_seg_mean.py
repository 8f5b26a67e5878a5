"""`seg-mean` in veRL's real trainer: the worker hook counts each whole mini-batch's segments before the split."""

from __future__ import annotations

import pytest

from maspo_verl.cpu.synthetic_run import loss_overrides

pytestmark = pytest.mark.e2e

KEY = "actor_rollout_ref.actor.policy_loss.maspo"


def test_seg_mean_divides_by_the_whole_mini_batch_segment_count(train):
    window = 4
    run = train(
        "trainer.use_v1=False",
        f"+{KEY}.loss_agg_mode=seg-mean",
        *loss_overrides("maspo", "fixed", {"window": window}),
        steps=1,
        batch=4,
        n=2,
        mini_batches=2,
        micro_batch=1,
        lr=1e-2,
        response_length=16,
    )
    assert run.ok, run.log_tail()
    # a mini-batch holds 4 * 2 / 2 = 4 responses of 16 tokens -> 4 * 16 / 4 = 16 segments, counted before veRL
    # cut it into micro-batches of one response (4 segments each)
    assert run.series("response_length/mean") == [16.0]
    assert run.series("actor/maspo/minibatch_segments") == [16.0]
    assert run.series("actor/maspo/segments_per_response") == [16.0 / window]
