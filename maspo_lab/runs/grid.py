"""A grid of runs through veRL's trainer, resumable: each run in its own folder (`RunKey.dir`), a finished one
recorded in its ``done.json`` with the overrides it ran with, so that the same command skips it and reruns what
failed or changed; ``jobs`` runs at a time, each its share of the cores; Ctrl-C cancels the runs in flight.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunKey:
    method: str
    seed: int
    regime: str = "default"

    def dir(self, out: Path) -> Path:
        return out / "runs" / self.regime / self.method / f"seed{self.seed}"

    @classmethod
    def in_folder(cls, out: Path) -> list[RunKey]:
        """Every run folder in the grid folder ``out`` (`dir`'s layout read back), linked ones included."""
        folders = sorted((out / "runs").glob("*/*/seed*"))
        return [cls(f.parent.name, int(f.name[4:]), f.parent.parent.name) for f in folders if f.name[4:].isdigit()]

    def validation_dir(self, out: Path) -> Path:
        """The run's folder of veRL's validation dumps (``trainer.validation_data_dir``: ``<step>.jsonl``, every
        evaluated response with its reward parts)."""
        return self.dir(out) / "validation"


def load_finished(
    out: Path, expected: dict[RunKey, list[str]]
) -> tuple[dict[RunKey, list[dict[str, float]]], dict[RunKey, dict]]:
    """Runs whose ``done.json`` records the same overrides (method, seed, steps, task) as this invocation's, in
    ``expected``'s order: their steps, and their ``done.json`` records."""
    from maspo_lab.runs.launch import read_metrics

    runs, records = {}, {}
    for key, overrides in expected.items():
        done = key.dir(out) / "done.json"
        if done.exists() and (record := json.loads(done.read_text())).get("overrides") == overrides:
            runs[key], records[key] = read_metrics(key.dir(out) / "metrics.jsonl"), record
    return runs, records


def jobs_of(records: dict[RunKey, dict]) -> dict[RunKey, int]:
    """``--jobs`` of each finished run, from its ``done.json`` record (1 for runs from before the option)."""
    return {key: record.get("jobs", 1) for key, record in records.items()}


def mark_finished(out: Path, key: RunKey, record: dict) -> None:
    """Record ``key`` as finished (`load_finished` reads it back when its overrides are ``record["overrides"]``)."""
    (key.dir(out) / "done.json").write_text(json.dumps(record))


@dataclass(frozen=True)
class Launch:
    """When a run started (``time.time()``) and how many runs were in flight then, itself included: what ``jobs``
    let run side by side."""

    started: float
    alongside: int


def run_grid(
    pending: list[RunKey],
    run_overrides: dict[RunKey, list[str]],
    out: Path,
    finish: Callable[[RunKey, object, Launch], None],
    *,
    jobs: int,
    timeout: float,
    resume: bool,
) -> bool:
    """Run ``pending`` through veRL's trainer (`maspo_lab.runs.launch.run_trainer`, from its last checkpoint when
    ``resume``), ``jobs`` at a time, calling ``finish(key, run, launch)`` in this thread as each ends. Returns
    whether Ctrl-C interrupted the grid (the runs in flight are then cancelled)."""
    from maspo_lab.runs.cpu_overrides import threads_per_run
    from maspo_lab.runs.launch import run_trainer

    cancel = threading.Event()
    in_flight, in_flight_lock = [0], threading.Lock()
    threads = threads_per_run(jobs)  # each run's share of the cores

    def run_one(key: RunKey):
        workdir = key.dir(out)
        (workdir / "done.json").unlink(missing_ok=True)
        with in_flight_lock:
            in_flight[0] += 1
            launch = Launch(time.time(), in_flight[0])
        try:
            run = run_trainer(
                run_overrides[key], workdir, timeout=timeout, cancel=cancel, threads=threads, resume=resume
            )
            return run, launch
        finally:
            with in_flight_lock:
                in_flight[0] -= 1

    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="ablate-run")
    try:
        futures = {pool.submit(run_one, key): key for key in pending}
        for future in as_completed(futures):
            run, launch = future.result()
            finish(futures[future], run, launch)
    except KeyboardInterrupt:
        cancel.set()
        return True
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return False
