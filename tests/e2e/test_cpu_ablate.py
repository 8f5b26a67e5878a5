"""`maspo-verl ablate --task synthetic` through veRL's real trainer on a tiny grid, two runs at a time: files, table,
resume, pairing by seed, a user regime; no learning asserted (the speech task's ablate is tested without the trainer,
tests/commands/test_ablate_speech.py). The grid's two runs are also where veRL's own losses run in the trainer on CPU:
GRPO (``vanilla``) with the rollout following the trained weights, and GSPO going off-policy, both with the rollout
correction at the segment level (``rollout_is=segment``); MASPO runs in the shared runs (shared_runs.py)."""

from __future__ import annotations

import csv
import json

import pytest

from maspo_lab.analysis.ablation import TIME_PARTS
from maspo_lab.cli import main as cli

pytestmark = pytest.mark.e2e

REGIME = "sync"
LR = "actor_rollout_ref.actor.optim.lr=0.05"
"""A user regime: a learning rate that moves the tiny policy visibly in one update, so that a rollout left on the
initial weights would disagree with the actor's recomputed log-probs on step 2 as much as the policy moved."""
SEGMENT_CORRECTION = (
    "algorithm.rollout_correction.rollout_is=segment",
    "+algorithm.rollout_correction.segmenter.name=token_jump",
    "+algorithm.rollout_correction.segmenter.threshold=1000",
)
"""The regime also corrects the rollout at the segment level (docs/rollout-correction.md): veRL's own losses with a
segmentation of the correction's own, from the legacy trainer's token ids (tests/e2e/test_cpu_rollout_correction.py
says where the other runs are)."""


@pytest.mark.slow(200)
def test_tiny_grid_writes_results_and_resume_skips_finished_runs(tmp_path, capsys):
    out = tmp_path / "grid"
    argv = [
        "ablate",
        *("--task", "synthetic"),
        *("--method", "grpo", "--method", "gspo"),
        *("--seeds", "0", "--steps", "2", "--batch", "2", "--n", "2", "--mini-batches", "2"),
        *("--regime", f"{REGIME}:{','.join([LR, *SEGMENT_CORRECTION])}", "--warm-start-steps", "0"),
        *("--eval-samples", "1", "--out", str(out)),
        *("--jobs", "2"),
    ]
    assert cli(argv) == 0
    printed = capsys.readouterr().out
    assert printed.count("[ablate] progress:") == 2
    assert f"| {REGIME} | grpo | 1 |" in printed and f"| {REGIME} | gspo | 1 |" in printed  # the table
    done = {m: json.loads((out / "runs" / REGIME / m / "seed0" / "done.json").read_text()) for m in ("grpo", "gspo")}
    for record in done.values():  # the regime's override reached each run, after the run's own, before the method's
        overrides = record["overrides"]
        assert overrides.index(LR) < len(overrides) - 1
        assert overrides.index(LR) > max(
            i for i, o in enumerate(overrides) if o.startswith("actor_rollout_ref.actor.optim.lr=") and o != LR
        )
    # --jobs 2: the two runs (two Ray instances, two rollout servers) were in flight at the same time: the second
    # started while the first ran
    assert sorted(r["runs_in_flight_at_start"] for r in done.values()) == [1, 2]
    assert all(r["jobs"] == 2 for r in done.values())

    records = _records(out)
    # step 0 is the evaluation before training; steps 1 and 2 train, and the last evaluates again
    assert sorted((r["regime"], r["method"], r["seed"], r["step"]) for r in records) == [
        (REGIME, method, 0, step) for method in ("grpo", "gspo") for step in (0, 1, 2)
    ]
    for record in records:
        if record["step"] == 0:
            continue
        # the reward parts reached veRL's metrics in the real trainer (maspo_verl.verl_patches.metrics), in [0, 1]
        parts = {key: record[f"reward/{key}/mean"] for key in ("content", "duration", "end")}
        assert all(0.0 <= value <= 1.0 for value in parts.values()), parts
        assert record["reward/unit_error_rate/mean"] >= 1.0 - parts["content"] - 1e-9
        assert 0.0 <= record["critic/score/min"] <= record["critic/score/max"] <= 1.0
        assert "timing_s/step" in record and not any(key.startswith("actor/maspo/") for key in record)
        # the rollout sampled from the updated policy: its log-probs match the actor's (measured: about 0.004 with
        # the weight sync, 0.06-0.08 on later steps with the rollout left on the initial weights)
        assert record["rollout_corr/log_ppl_abs_diff"] < 0.02, record["rollout_corr/log_ppl_abs_diff"]
        # rollout_is=segment with veRL's own losses: weights over token_jump's segments (random codec ids jump by
        # more than 1000 almost everywhere: 1-2 tokens; MASPO's default windows would give 5), near 1
        assert 1.0 <= record["rollout_corr/rollout_is_mean_segment_length"] < 2.0
        assert 0.0 < record["rollout_corr/rollout_is_eff_sample_size"] <= 1.0 + 1e-6
    for method in ("grpo", "gspo"):
        first, last = (r for r in records if r["method"] == method and r["step"] in (1, 2))
        if method == "grpo":  # the update moved the policy visibly (gspo's sequence clip, 4e-4, keeps it closer)
            assert abs(last["actor/entropy"] - first["actor/entropy"]) > 0.01
        # off-policy: the logged ppo_kl averages the two mini-batches, the first one on-policy (exactly 0)
        assert abs(first["actor/ppo_kl"]) > 0 and abs(last["actor/ppo_kl"]) > 0, method
        # veRL's validation scored the training texts before step 1 and after step 2
        assert any(k.startswith("val-") for k in _step(records, method, 0))
        assert any(k.startswith("val-") for k in last)
    with open(out / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["regime"], r["method"]) for r in rows] == [(REGIME, "grpo"), (REGIME, "gspo")]
    assert float(rows[0]["s_per_step_vs_grpo"]) == 1.0
    assert rows[1]["paired_seeds"] == "1"  # both methods ran seed 0 in this regime
    for method in ("grpo", "gspo"):  # where its time went: every part seen and in order
        parts = done[method]["time_s"]
        assert all(parts[p] >= 0 for p, _ in TIME_PARTS if p != "between_steps") and parts["workers"] > 0
        assert parts["between_steps"] > -1.0  # a remainder of two processes' clocks: may be a hair below 0
        assert parts["steps"] > 0
    assert "Where a run's time goes" in printed
    for row in rows:  # the evaluation's content on the training texts, before and after, reached the table
        assert 0.0 <= float(row["eval_content_after_mean"]) <= 1.0
        assert -1.0 <= float(row["eval_content_gain_mean"]) <= 1.0
    assert (out / "ablation.png").stat().st_size > 0

    logs = {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("trainer.log")}
    assert len(logs) == 2
    assert cli(argv) == 0  # again: both runs are finished, nothing is run
    printed = capsys.readouterr().out
    assert "resuming: 2/2 runs already finished" in printed and "[ablate] progress:" not in printed
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("trainer.log")} == logs
    assert f"| {REGIME} | grpo | 1 |" in printed

    # pairing by seed: the two methods ran at the same time from the same seed, and before any update a method
    # changes nothing, so both saw the same evaluation before step 1 and the same first rollout (what the grid's
    # paired gains rest on). The update's own figures (pg_loss, ppo_kl, entropy) may differ already at step 1.
    grpo, gspo = ({r["step"]: r for r in records if r["method"] == method} for method in ("grpo", "gspo"))
    evaluation = [k for k in grpo[0] if k.startswith("val-")]
    assert evaluation and set(evaluation) == {k for k in gspo[0] if k.startswith("val-")}
    for name in evaluation:
        assert gspo[0][name] == grpo[0][name], name
    for name in FIRST_ROLLOUT_FIGURES:
        assert gspo[1][name] == grpo[1][name], name


FIRST_ROLLOUT_FIGURES = ("critic/score/mean", "reward/content/mean", "response_length/mean")


def _records(out):
    return [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]


def _step(records, method, step):
    [record] = [r for r in records if r["method"] == method and r["step"] == step]
    return record
