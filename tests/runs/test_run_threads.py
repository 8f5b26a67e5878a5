"""A run's share of the cores: OpenMP/torch threads for the actor and the reward, one for the rollout server."""

from __future__ import annotations

import pytest

from maspo_verl.cpu import ROLLOUT_THREADS_ENV
from maspo_verl.runs import cpu_overrides
from maspo_verl.runs.launch import run_trainer


def test_a_run_gets_its_threads_and_the_rollout_one(tmp_path):
    echo = ["bash", "-c", f'echo "omp=$OMP_NUM_THREADS rollout=${ROLLOUT_THREADS_ENV} cpu=$MASPO_VERL_CPU"', "x"]
    assert "omp=2 rollout=1 cpu=1" in run_trainer([], tmp_path, timeout=60, launcher=echo, threads=2).log_path.read_text()
    assert "omp=1 rollout=1" in run_trainer([], tmp_path / "b", timeout=60, launcher=echo).log_path.read_text()


def test_runs_side_by_side_split_the_cores(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert [cpu_overrides.threads_per_run(j) for j in (1, 2, 3, 8, 16)] == [8, 4, 2, 1, 1]
    with pytest.raises(ValueError, match="threads=0 must be >= 1"):
        cpu_overrides.cpu_environment(0)
