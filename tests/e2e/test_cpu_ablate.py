"""`maspo-verl ablate --task synthetic` through veRL's real trainer on a tiny grid, two runs at a time: files, table,
resume, pairing by seed; no learning asserted (the speech task's ablate is tested without the trainer, tests/commands/
test_ablate_speech.py)."""

from __future__ import annotations

import csv
import json

import pytest

from maspo_verl.cli import main as cli
from maspo_verl.commands.ablate import TIME_PARTS

pytestmark = pytest.mark.e2e


@pytest.mark.slow(180)
def test_tiny_grid_writes_results_and_resume_skips_finished_runs(tmp_path, capsys):
    out = tmp_path / "grid"
    argv = [
        "ablate",
        *("--task", "synthetic"),
        *("--method", "grpo", "--method", "maspo-fixed4"),
        *("--seeds", "0", "--steps", "1", "--batch", "2", "--n", "2", "--mini-batches", "2"),
        *("--regime", "stale", "--warm-start-steps", "0", "--eval-samples", "1", "--out", str(out)),
        *("--jobs", "2"),
    ]
    assert cli(argv) == 0
    printed = capsys.readouterr().out
    assert printed.count("[ablate] progress:") == 2
    assert "| stale | grpo | 1 |" in printed and "| stale | maspo-fixed4 | 1 |" in printed  # the table
    done = {
        m: json.loads((out / "runs" / "stale" / m / "seed0" / "done.json").read_text())
        for m in ("grpo", "maspo-fixed4")
    }
    for record in done.values():  # the regime's override reached each run, before the method's
        overrides = record["overrides"]
        assert overrides.index("actor_rollout_ref.actor.ppo_epochs=4") < len(overrides) - 1
    # --jobs 2: the two runs (two Ray instances, two rollout servers) were in flight at the same time: the second
    # started while the first ran
    assert sorted(r["runs_in_flight_at_start"] for r in done.values()) == [1, 2]
    assert all(r["jobs"] == 2 for r in done.values())

    records = _records(out)
    # step 0 is the evaluation before training; step 1 trains and evaluates again
    assert sorted((r["regime"], r["method"], r["seed"], r["step"]) for r in records) == [
        ("stale", "grpo", 0, 0),
        ("stale", "grpo", 0, 1),
        ("stale", "maspo-fixed4", 0, 0),
        ("stale", "maspo-fixed4", 0, 1),
    ]
    lines = [r for r in records if r["step"] == 1]
    for record in lines:  # the reward parts reached veRL's metrics in the real trainer
        assert 0.0 <= record["reward/content/mean"] <= 1.0
        assert "reward/unit_error_rate/mean" in record and "timing_s/step" in record
    assert any("actor/maspo/mean_segment_length" in r for r in lines if r["method"] == "maspo-fixed4")
    with open(out / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["regime"], r["method"]) for r in rows] == [("stale", "grpo"), ("stale", "maspo-fixed4")]
    assert float(rows[0]["s_per_step_vs_grpo"]) == 1.0
    assert rows[1]["paired_seeds"] == "1"  # both methods ran seed 0 in this regime
    for method in ("grpo", "maspo-fixed4"):  # where its time went: every part seen and in order
        parts = json.loads((out / "runs" / "stale" / method / "seed0" / "done.json").read_text())["time_s"]
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
    assert "| stale | grpo | 1 |" in printed

    # pairing by seed: the two methods ran at the same time from the same seed, and before any update a method
    # changes nothing, so both saw the same evaluation before step 1 and the same first rollout (what the grid's
    # paired gains rest on). The update's own figures (pg_loss, ppo_kl, entropy) may differ already at step 1.
    grpo, maspo = ([r for r in records if r["method"] == method] for method in ("grpo", "maspo-fixed4"))
    evaluation = [k for k in grpo[0] if k.startswith("val-")]
    assert evaluation and set(evaluation) == {k for k in maspo[0] if k.startswith("val-")}
    for name in evaluation:
        assert maspo[0][name] == grpo[0][name], name
    for name in FIRST_ROLLOUT_FIGURES:
        assert maspo[1][name] == grpo[1][name], name


FIRST_ROLLOUT_FIGURES = ("critic/score/mean", "reward/content/mean", "response_length/mean")


def _records(out):
    return [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
