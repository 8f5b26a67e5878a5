"""veRL's real trainer on CPU with the `hf` rollout: GSPO steps (veRL's own sequence-ratio loss, through the plugin's
wrapped worker loss) complete, go off-policy, and the rollout follows the trained weights. GRPO's vanilla loss runs in
the ablate grid (test_cpu_ablate.py), MASPO in the shared runs."""

from __future__ import annotations

import pytest

from maspo_verl.runs.synthetic_run import method_overrides, split_evaluations

pytestmark = pytest.mark.e2e


@pytest.mark.slow(110)
def test_gspo_legacy_trainer_goes_off_policy_and_syncs_weights_into_rollout(train):
    # a large learning rate moves the policy visibly in one update; a rollout left on the initial weights would
    # then disagree with the actor's recomputed log-probs on step 2 as much as the policy moved. Two mini-batches
    # per step: the second sees ratios != 1
    run = train(
        "trainer.use_v1=False", *method_overrides("gspo"), steps=3, lr=0.05, eval_samples=1, batch=4, mini_batches=2
    )
    assert run.ok, run.log_tail()
    steps, evaluations = split_evaluations(run.steps, samples=1)
    assert [s["step"] for s in steps] == [1, 2, 3]
    # the demo's evaluation: veRL's validation scored the training texts before step 1 and after step 3, with
    # every part of the synthetic score
    assert [e["step"] for e in evaluations] == [0, 3]
    for evaluation in evaluations:
        assert 0.0 <= evaluation["eval/content"] <= 1.0 and 0.0 <= evaluation["eval/end"] <= 1.0
        assert evaluation["eval/expected_frames"] > 0
    first, last = steps[0], steps[-1]
    # the reward loop scored every response with synthetic_tts.compute_score, in [0, 1]
    assert 0.0 <= last["critic/score/min"] <= last["critic/score/max"] <= 1.0
    assert last["response_length/mean"] > 0
    # the legacy trainer logs every numeric part of the synthetic score (maspo_verl.verl_patches.metrics)
    for step in steps:
        parts = {key: step[f"reward/{key}/mean"] for key in ("content", "duration", "end")}
        assert all(0.0 <= value <= 1.0 for value in parts.values()), parts
        assert step["reward/unit_error_rate/mean"] >= 1.0 - parts["content"] - 1e-9
    # gspo ran (no MASPO metrics) and went off-policy: the logged ppo_kl averages the mini-batches, the first one
    # on-policy (exactly 0)
    assert not any(key.startswith("actor/maspo/") for key in first)
    assert all(abs(kl) > 0 for kl in run.series("actor/ppo_kl"))
    # the update changed the policy ...
    assert abs(last["actor/entropy"] - first["actor/entropy"]) > 0.01
    # ... and the rollout sampled from the updated policy: its log-probs match the actor's (measured: about 0.004
    # with the weight sync, 0.06-0.08 on steps 2-3 with the rollout left on the initial weights)
    for step in steps:
        assert step["rollout_corr/log_ppl_abs_diff"] < 0.02, step["rollout_corr/log_ppl_abs_diff"]
