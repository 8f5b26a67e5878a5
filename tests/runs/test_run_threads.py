"""A run's share of the cores: OpenMP/torch threads for the actor and the reward, one for the rollout server."""

from __future__ import annotations

import pytest

from maspo_lab.runs import cpu_overrides
from maspo_lab.runs.cpu_overrides import RAY_GCS_WAIT_ENV
from maspo_lab.runs.launch import checkpointed_step, run_trainer
from maspo_verl.cpu.hf_rollout import ROLLOUT_THREADS_ENV


def test_a_run_gets_its_threads_and_the_rollout_one(tmp_path, monkeypatch):
    monkeypatch.delenv(RAY_GCS_WAIT_ENV, raising=False)  # conftest sets it for the tests' own ray.init
    says = f"omp=$OMP_NUM_THREADS rollout=${ROLLOUT_THREADS_ENV} cpu=$MASPO_VERL_CPU gcs=${RAY_GCS_WAIT_ENV}"
    echo = ["bash", "-c", f'echo "{says}"', "x"]
    log = run_trainer([], tmp_path, timeout=60, launcher=echo, threads=2).log_path.read_text()
    assert "omp=2 rollout=1 cpu=1 gcs=120" in log  # Ray's patience for its GCS server on loaded cores
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


def test_a_run_whose_checkpoint_is_at_its_last_step_is_not_launched_again(tmp_path):
    """An attempt that ended before its grid recorded it: veRL would resume its last checkpoint and train a step past
    the end, so the launcher returns what the run left instead; with steps left it launches as usual."""
    import json

    work = tmp_path / "run"
    folder = work / "checkpoints" / "p" / "e"
    folder.mkdir(parents=True)
    logged = [{"step": s, "data": {"loss": 1.0 / (s + 1)}} for s in range(5)]
    (work / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in logged))
    overrides = ["trainer.project_name=p", "trainer.experiment_name=e", "trainer.total_training_steps=4"]
    launched = ["bash", "-c", f"touch {tmp_path / 'launched'}", "x"]

    (folder / "latest_checkpointed_iteration.txt").write_text("4")
    run = run_trainer(overrides, work, timeout=60, launcher=launched, resume=True)
    assert not (tmp_path / "launched").exists() and run.ok and run.resumed_from_step == 4
    assert [s["step"] for s in run.steps] == [0, 1, 2, 3, 4] and (work / "metrics.jsonl").exists()
    assert checkpointed_step([*overrides, f"trainer.default_local_dir={folder}"], work) == 4  # an absolute folder
    assert checkpointed_step(overrides[2:], work) == 0  # no project or experiment named: no folder to look in

    (folder / "latest_checkpointed_iteration.txt").write_text("3")
    run_trainer(overrides, work, timeout=60, launcher=launched, resume=True)
    assert (tmp_path / "launched").exists() and (work / "metrics.attempt0.jsonl").exists()


def test_a_relative_run_folder_is_read_from_where_it_was_given(tmp_path, monkeypatch):
    """The trainer runs in its run's folder: the metrics file it is told of must not be relative to that folder."""
    monkeypatch.chdir(tmp_path)
    logs = ["bash", "-c", 'echo \'{"step": 1, "data": {"loss": 0.5}}\' > "$VERL_FILE_LOGGER_PATH"', "x"]
    run = run_trainer([], "run", timeout=60, launcher=logs)
    assert run.steps == [{"step": 1, "loss": 0.5}] and run.log_path == tmp_path / "run" / "trainer.log"
