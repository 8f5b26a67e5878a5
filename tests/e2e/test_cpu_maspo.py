"""MASPO inside veRL's real trainer on CPU: segment statistics reach the logs from the worker, ratios go off-policy."""

from __future__ import annotations

import pytest
from shared_runs import WINDOW

pytestmark = pytest.mark.e2e


def _maspo_metrics(run) -> dict[str, list[float]]:
    keys = ("segments_per_response", "mean_segment_length", "clipfrac_high", "clipfrac_low", "segment_log_ratio_std")
    return {key: run.series(f"actor/maspo/{key}") for key in keys}


def test_maspo_fixed_window_segments_and_off_policy_ratios(shared_run):
    # the legacy trainer with windows of 4 (the run test_cpu_credit traces and test_cpu_maspo_seg_mean aggregates
    # by segments: neither changes the loss's segments or ratios)
    window = WINDOW
    run = shared_run("legacy_probe_seg_mean").run
    assert run.ok, run.log_tail()
    metrics = _maspo_metrics(run)
    assert all(len(values) == 2 for values in metrics.values()), metrics
    # responses are 16 tokens (the untrained model never stops early): 16 / 4 = 4 windows of exactly 4 tokens
    assert run.series("response_length/mean") == [16.0, 16.0]
    assert metrics["mean_segment_length"] == [float(window)] * 2
    assert metrics["segments_per_response"] == [16.0 / window] * 2
    # the logged ppo_kl averages the mini-batches; the first one is on-policy (exactly 0), so a non-zero
    # mean means later mini-batches saw ratios != 1
    assert all(abs(kl) > 0 for kl in run.series("actor/ppo_kl"))
    assert all(std > 0 for std in metrics["segment_log_ratio_std"])


def test_maspo_token_jump_segments_follow_token_ids_in_the_default_trainer(shared_run):
    # the default (v1) trainer: token ids reach the loss through its nested micro-batches (the run test_cpu_credit
    # traces with the probe reward, the synthetic score plus frame errors)
    run = shared_run("v1_probe_token_jump").run
    assert run.ok, run.log_tail()
    lengths = run.series("actor/maspo/mean_segment_length")
    assert len(lengths) == 2
    # random codec ids jump by more than 1000 almost everywhere, so segments are mostly single tokens, unlike
    # fixed windows; had the ids not reached the segmenter it could not produce this
    assert all(1.0 <= length < 2.0 for length in lengths), lengths
    assert all(abs(kl) > 0 for kl in run.series("actor/ppo_kl"))
    # the v1 trainer logs every numeric part of the synthetic score (maspo_verl.verl_patches.metrics)
    for step in run.steps:
        assert 0.0 <= step["reward/content/mean"] <= 1.0 and 0.0 <= step["reward/end/mean"] <= 1.0
        assert step["reward/unit_error_rate/mean"] >= 1.0 - step["reward/content/mean"] - 1e-9


def test_the_one_line_switch_trains_maspo_with_its_block_keys(shared_run):
    # `actor_rollout_ref.actor.policy_loss=maspo` plus `+...maspo.segmenter.*` (shared_runs.SHORTHAND_TOKEN_JUMP):
    # the workers ran MASPO (its metrics), with the block keys' segmenter: the defaults (fixed windows of 5) would
    # give segments of 5 tokens, token_jump at threshold 1000 gives segments of 1-2 tokens on random codec ids
    run = shared_run("v1_probe_token_jump").run
    assert run.ok, run.log_tail()
    for step in run.steps:
        assert {"actor/maspo/segments_per_response", "actor/maspo/clipfrac_high"} <= set(step)
    assert all(length < 2.0 for length in run.series("actor/maspo/mean_segment_length"))
