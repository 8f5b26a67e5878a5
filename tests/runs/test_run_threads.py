"""A run's share of the cores: OpenMP/torch threads for the actor and the reward, one for the rollout server."""

from __future__ import annotations

import pytest

from maspo_lab.runs import cpu_overrides
from maspo_lab.runs.launch import run_trainer
from maspo_verl.cpu.hf_rollout import ROLLOUT_THREADS_ENV


def test_a_run_gets_its_threads_and_the_rollout_one(tmp_path):
    echo = ["bash", "-c", f'echo "omp=$OMP_NUM_THREADS rollout=${ROLLOUT_THREADS_ENV} cpu=$MASPO_VERL_CPU"', "x"]
    assert (
        "omp=2 rollout=1 cpu=1" in run_trainer([], tmp_path, timeout=60, launcher=echo, threads=2).log_path.read_text()
    )
    assert "omp=1 rollout=1" in run_trainer([], tmp_path / "b", timeout=60, launcher=echo).log_path.read_text()


def test_runs_side_by_side_split_the_cores(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert [cpu_overrides.threads_per_run(j) for j in (1, 2, 3, 8, 16)] == [8, 4, 2, 1, 1]
    with pytest.raises(ValueError, match="threads=0 must be >= 1"):
        cpu_overrides.cpu_environment(0)


def test_a_resumed_run_keeps_what_its_earlier_attempt_logged(tmp_path):
    """veRL's file logger starts its file anew; a run resumed from its checkpoint (step 2 here) logs the
    checkpoint's validation again and the steps after it: every step is kept, the later attempt's values winning."""
    import json

    def logger(records, says="Training from scratch"):  # logs ``records`` as veRL's file logger would
        source = tmp_path / f"records{len(list(tmp_path.glob('records*')))}.jsonl"
        source.write_text("".join(json.dumps({"step": s, "data": d}) + "\n" for s, d in records))
        return ["bash", "-c", f"echo '{says}'; cp {source} $VERL_FILE_LOGGER_PATH", "x"]

    first = [(0, {"val": 0.5}), (1, {"loss": 1.0}), (2, {"loss": 0.9}), (3, {"loss": 0.8})]
    work = tmp_path / "run"
    run_trainer([], work, timeout=60, launcher=logger(first), resume=True)
    again = [(2, {"val": 0.4}), (3, {"loss": 0.7}), (4, {"loss": 0.6})]
    loaded = "(TaskRunner pid=7) Load from checkpoint folder: /runs/x/checkpoints/speech/global_step_2"
    run = run_trainer([], work, timeout=60, launcher=logger(again, says=loaded), resume=True)
    assert run.resumed_from_step == 2 and "workers_ready" in run.milestones  # its time is that of steps 3 and 4
    assert run.steps == [
        {"step": 0, "val": 0.5},
        {"step": 1, "loss": 1.0},
        {"step": 2, "loss": 0.9, "val": 0.4},
        {"step": 3, "loss": 0.7},
        {"step": 4, "loss": 0.6},
    ]
    assert (work / "metrics.attempt0.jsonl").exists()
    fresh = run_trainer([], tmp_path / "fresh", timeout=60, launcher=logger(again))  # not resumed: its own lines
    assert [s["step"] for s in fresh.steps] == [2, 3, 4] and fresh.resumed_from_step == 0
