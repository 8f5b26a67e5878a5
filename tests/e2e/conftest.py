"""End-to-end fixtures: one tiny Llasa model and synthetic TTS data per session; every run in its own directory.

Each test launches veRL's real ``python -m verl.trainer.main_ppo`` in a subprocess (`maspo_verl.cpu.launch`),
which gives the run its own Ray temp dir and process group and stops everything it started when it returns.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

from maspo_verl.cpu.launch import TrainerRun, run_trainer
from maspo_verl.cpu.synthetic_run import TaskPaths, prepare_task, run_overrides


def pytest_configure(config):
    config.addinivalue_line("markers", "e2e: runs veRL's real trainer in a subprocess (about 30-90 s each)")


@pytest.fixture(scope="session")
def task(tmp_path_factory) -> TaskPaths:
    """The tiny Llasa model (no warm start: these tests check mechanics, not learning) and the dataset."""
    return prepare_task(tmp_path_factory.mktemp("task"), warm_start_steps=0, n_train=32, n_val=8)


_counter = itertools.count()


@pytest.fixture
def train(task, tmp_path_factory):
    """``train(*overrides, **settings) -> TrainerRun``: a short CPU run of veRL's trainer on the tiny task."""

    def run(*overrides: str, timeout: float = 300, **settings) -> TrainerRun:
        workdir = tmp_path_factory.mktemp(f"run{next(_counter)}")
        args = run_overrides(task, **settings) + list(overrides)
        result = run_trainer(args, workdir, timeout=timeout)
        sys.stderr.write(
            f"[e2e] {Path(workdir).name}: rc={result.returncode} {result.wall_seconds:.0f}s "
            f"peak={result.peak_rss_bytes / 2**30:.2f} GiB steps={len(result.steps)}\n"
        )
        return result

    return run
