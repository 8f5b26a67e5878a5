"""``algorithm.rollout_correction.rollout_is=segment`` in veRL's real trainer on CPU, with ``maspo``, ``vanilla`` (GRPO)
and ``gspo``, in decoupled mode (the driver computes the weights and the rejection) and in bypass mode with ``maspo``
(the loss takes its segment ratio against the rollout policy and rejects on its segments).

The CPU rollout returns its log-probs (veRL's ``rollout_log_probs``), so every step corrects; they differ from the
trainer's only by round-off, so the weights sit near 1: these runs check mechanics (which segments, which trainer
path, which metrics), the values are checked against veRL's own functions in tests/test_rollout_correction.py.
"""

from __future__ import annotations

import pytest

from maspo_lab.runs.synthetic_run import method_overrides

pytestmark = pytest.mark.e2e

RC = "algorithm.rollout_correction"
SEGMENT_REJECTION = (f"{RC}.rollout_rs=seg_mean_k1", f"{RC}.rollout_rs_threshold=0.5_2.0")
"""Bounds this wide keep every segment of a run whose rollout and trainer agree to round-off."""
TOKEN_JUMP = (f"+{RC}.segmenter.name=token_jump", f"+{RC}.segmenter.threshold=1000")
"""A segmentation of the correction's own, from token ids (the legacy trainer's batch holds them, the v1 trainer's
correction has them fetched): random codec ids jump by more than 1000 almost everywhere, segments of 1-2 tokens."""


def _every_step(run, key: str) -> list[float]:
    values = run.series(key)
    assert len(values) == 2, (key, run.steps)  # two training steps
    return values


def _weights_were_logged(run) -> None:
    for ess in _every_step(run, "rollout_corr/rollout_is_eff_sample_size"):
        assert 0 < ess <= 1 + 1e-6
    for mean in _every_step(run, "rollout_corr/rollout_is_mean"):
        assert 0.5 < mean < 2.0  # rollout and trainer agree to round-off
    _every_step(run, "rollout_corr/kl")  # veRL's own off-policy metrics beside them


@pytest.mark.slow(100)
def test_maspo_corrects_over_its_own_segments_in_the_default_trainer(train):
    run = train(
        "trainer.use_v1=True", *method_overrides("maspo-fixed4"), f"{RC}.rollout_is=segment", *SEGMENT_REJECTION
    )
    assert run.ok, run.log_tail()
    _weights_were_logged(run)
    # the correction took the loss's windows of 4 (responses are 16 tokens: the untrained model never stops early)
    assert _every_step(run, "rollout_corr/rollout_is_mean_segment_length") == [4.0, 4.0]
    assert _every_step(run, "rollout_corr/rollout_is_segments_per_response") == [4.0, 4.0]
    assert _every_step(run, "actor/maspo/mean_segment_length") == [4.0, 4.0]
    assert _every_step(run, "rollout_corr/rollout_rs_seg_mean_k1_seg_masked_fraction") == [0.0, 0.0]


@pytest.mark.slow(100)
def test_grpo_corrects_over_token_jumps_in_the_legacy_trainer(train):
    run = train("trainer.use_v1=False", *method_overrides("grpo"), f"{RC}.rollout_is=segment", *TOKEN_JUMP)
    assert run.ok, run.log_tail()
    _weights_were_logged(run)
    assert all(1.0 <= length < 2.0 for length in _every_step(run, "rollout_corr/rollout_is_mean_segment_length"))
    assert not any(key.startswith("actor/maspo/") for step in run.steps for key in step)


@pytest.mark.slow(100)
def test_gspo_corrects_over_token_jumps_in_the_default_trainer(train):
    run = train(
        "trainer.use_v1=True",
        *method_overrides("gspo"),
        f"{RC}.rollout_is=segment_geo",
        f"{RC}.rollout_rs=seg_sum_k1",
        f"{RC}.rollout_rs_threshold=0.5_2.0",
        *TOKEN_JUMP,
    )
    assert run.ok, run.log_tail()
    _weights_were_logged(run)
    # the token ids reached the driver's correction from the v1 trainer's TransferQueue: the default windows of 5
    # would give segments of 5 tokens (16 = 5 + 5 + 5 + 1: 4 segments per response)
    assert all(1.0 <= length < 2.0 for length in _every_step(run, "rollout_corr/rollout_is_mean_segment_length"))
    _every_step(run, "rollout_corr/rollout_rs_seg_sum_k1_seg_masked_fraction")


@pytest.mark.slow(100)
def test_maspo_in_bypass_mode_takes_its_ratio_against_the_rollout_and_rejects_on_its_segments(train):
    run = train(
        "trainer.use_v1=False",
        *method_overrides("maspo-fixed4"),
        f"{RC}.bypass_mode=true",
        f"{RC}.rollout_is=segment",
        *SEGMENT_REJECTION,
    )
    assert run.ok, run.log_tail()
    # bypass mode: no recomputation of old log-probs (old_log_probs = the rollout's), so no timing of it
    assert not any("timing_s/old_log_prob" in step for step in run.steps)
    # MASPO ran on the workers (veRL's driver switches its own copy of loss_mode to bypass_mode; the plugin keeps
    # the driver's maspo) and applied the block there: its metrics come from the loss, so veRL files them under
    # actor/ (as those of its own bypass_mode loss), and none from the driver
    assert _every_step(run, "actor/maspo/mean_segment_length") == [4.0, 4.0]
    assert _every_step(run, "actor/rollout_corr/rollout_is_mean_segment_length") == [4.0, 4.0]
    assert _every_step(run, "actor/rollout_corr/rollout_rs_seg_mean_k1_seg_masked_fraction") == [0.0, 0.0]
    assert not run.series("rollout_corr/rollout_is_mean")
