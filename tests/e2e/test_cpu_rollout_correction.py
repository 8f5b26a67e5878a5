"""``algorithm.rollout_correction.rollout_is=segment`` in veRL's real trainer on CPU, without a trainer run of its own
(the suite's budget): in decoupled mode with ``maspo`` here, on the shared v1 run (`shared_runs.SEGMENT_CORRECTION`);
with ``vanilla`` (GRPO) and ``gspo`` in the ablate grid's two runs (tests/e2e/test_cpu_ablate.py, its regime); in
bypass mode with ``maspo`` in the recipe's smoke run (tests/e2e/test_recipe_llasa_1b_cpu.py, `BYPASS_CORRECTION`).

The CPU rollout returns its log-probs (veRL's ``rollout_log_probs``), so every step corrects; they differ from the
trainer's by round-off, so the weights sit near 1: these runs check the plumbing (which segments, which trainer path,
which metrics); the values are checked against veRL's own functions in tests/test_rollout_correction.py.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.e2e


def test_maspo_corrects_over_its_own_token_jump_segments_in_the_default_trainer(shared_run):
    # the v1 trainer, MASPO with token_jump (the one-line switch plus block keys), segment credit: the correction
    # took the loss's segmentation (no segmenter of its own), and its token ids came from the TransferQueue (one
    # fetch, shared with the credit's)
    run = shared_run("v1_probe_token_jump").run
    assert run.ok, run.log_tail()
    lengths = run.series("rollout_corr/rollout_is_mean_segment_length")
    assert len(lengths) == 2
    # random codec ids jump by more than 1000 almost everywhere: segments of 1-2 tokens, as the loss's; MASPO's
    # default windows of 5 (a correction without the loss's segmenter, or without the ids) would give 5, 5, 5, 1
    assert all(1.0 <= length < 2.0 for length in lengths), lengths
    assert all(1.0 <= length < 2.0 for length in run.series("actor/maspo/mean_segment_length"))
    for step in run.steps:
        assert 0.0 < step["rollout_corr/rollout_is_eff_sample_size"] <= 1.0 + 1e-6
        assert 0.5 < step["rollout_corr/rollout_is_mean"] < 2.0  # rollout and trainer agree to round-off
        assert step["rollout_corr/rollout_rs_seg_mean_k1_seg_masked_fraction"] == 0.0
        assert "rollout_corr/kl" in step  # veRL's own off-policy metrics beside them
