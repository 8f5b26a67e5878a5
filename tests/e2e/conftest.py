"""End-to-end fixtures: one tiny Llasa model and synthetic TTS data per session; every run in its own directory.

Each test launches veRL's real ``python -m verl.trainer.main_ppo`` in a subprocess (`maspo_lab.runs.launch`),
which gives the run its own Ray temp dir and process group and stops everything it started when it returns.
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from shared_runs import SHARED_RUNS

from maspo_lab.runs.launch import TrainerRun, run_trainer
from maspo_lab.runs.synthetic_run import TaskPaths, prepare_task, run_overrides
from maspo_verl.verl_patches.trainer import CREDIT_TRACE_ENV


def pytest_configure(config):
    config.addinivalue_line("markers", "e2e: runs veRL's real trainer in a subprocess (about 30-90 s each)")


@pytest.fixture(scope="session")
def task(tmp_path_factory) -> TaskPaths:
    """The tiny Llasa model (no warm start: these tests check mechanics, not learning) and the dataset."""
    return prepare_task(tmp_path_factory.mktemp("task"), warm_start_steps=0, n_train=32, n_val=8)


_counter = itertools.count()

MECHANICS_SHAPE = {
    "steps": 2,
    "batch": 2,
    "n": 2,
    "mini_batches": 1,
    "micro_batch": 4,
    "response_length": 16,
    "lr": 1e-6,
    "temperature": 1.0,
    "seed": 0,
    "eval_samples": 0,
}
"""The end-to-end tests' runs: as short as veRL's trainer allows, to check mechanics (a test changes some)."""


def start_run(task, tmp_path_factory, *overrides: str, timeout: float = 900, env=None, **settings) -> TrainerRun:
    """A short CPU run of veRL's trainer on the tiny task, in a directory of its own. ``timeout`` only stops a run
    that hangs: a run sharing the 2 cores with other tests' runs took up to 300 s."""
    workdir = tmp_path_factory.mktemp(f"run{next(_counter)}")
    args = run_overrides(task, **{**MECHANICS_SHAPE, **settings}) + list(overrides)
    result = run_trainer(args, workdir, timeout=timeout, env=env)
    sys.stderr.write(
        f"[e2e] {Path(workdir).name}: rc={result.returncode} {result.wall_seconds:.0f}s "
        f"peak={result.peak_rss_bytes / 2**30:.2f} GiB steps={len(result.steps)}\n"
    )
    return result


@pytest.fixture
def train(task, tmp_path_factory):
    """``train(*overrides, **settings) -> TrainerRun``: a short CPU run of veRL's trainer on the tiny task."""

    def run(*overrides: str, timeout: float = 900, **settings) -> TrainerRun:
        return start_run(task, tmp_path_factory, *overrides, timeout=timeout, **settings)

    return run


@dataclass(frozen=True)
class TracedRun:
    run: TrainerRun
    trace: Path
    """What the advantage estimator received and returned, one JSON line per call (``MASPO_VERL_CREDIT_TRACE``)."""


@pytest.fixture(scope="session")
def shared_run(task, tmp_path_factory):
    """``shared_run(name) -> TracedRun``: the run `shared_runs.SHARED_RUNS[name]`, started when a test first asks
    for it and kept for the session, so that the tests sharing it cost one run."""
    done: dict[str, TracedRun] = {}

    def get(name: str) -> TracedRun:
        if name not in done:
            spec = SHARED_RUNS[name]
            trace = tmp_path_factory.mktemp(f"trace_{name}") / "credit.jsonl"
            run = start_run(
                task, tmp_path_factory, *spec.overrides, env={CREDIT_TRACE_ENV: str(trace)}, **spec.settings
            )
            done[name] = TracedRun(run, trace)
        return done[name]

    return get
