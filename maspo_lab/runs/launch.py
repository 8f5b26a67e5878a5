"""Launch veRL's real trainer (``python -m verl.trainer.main_ppo``) on CPU in a subprocess, and always clean up.

Every run gets its own short Ray temp dir (``/tmp/ray_<random>``: Ray's socket paths must stay under 108 bytes), its
own process group, and a metrics file (veRL's ``file`` logger, one JSON line per step). When the run ends, fails or is
interrupted, its process group is killed, then every process still naming its Ray temp dir (Ray's GCS, raylet and
workers), then the dir is removed. The memory of the whole process tree (proportional set size) is sampled
every few seconds (`MEMORY_SAMPLE_SECONDS`: reading every process's memory map costs CPU the run needs) to
report its peak.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from maspo_lab.runs.cpu_overrides import CPU_OVERRIDES, cpu_environment, ray_temp_dir_override

MEMORY_SAMPLE_SECONDS = 3.0
WATCH_SECONDS = 0.5
"""How often a run's watcher looks at its time limit and its ``cancel`` event."""
TIMED_OUT, CANCELLED = -9, -2
"""`TrainerRun.returncode` of a run stopped at its time limit, and through ``cancel``."""
_STEP_LINE = re.compile(r"step:(\d+) - (.*)")
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_NUMPY_WRAPPER = re.compile(r"np\.\w+\(")  # console values may read np.float64(0.5)
_ERROR_LINE = re.compile(r"Traceback|^\S*(Error|Exception): |\) (\w+Error|Exception): ")
LOADED_CHECKPOINT = "Load from checkpoint folder"
"""veRL's line when a run resumes: ``Load from checkpoint folder: .../global_step_N``."""
MILESTONES = {
    "ray_started": ("Started a local Ray instance",),
    "workers_ready": ("Training from scratch", LOADED_CHECKPOINT),
    "initial_validation_done": ("Initial validation metrics",),
    "first_step_done": ("step:1 - ",),
}
"""Lines of veRL's output marking where a run's time goes (`TrainerRun.milestones`: seconds since launch of the
first line containing any of each's markers); ``workers_ready``: the actor and the rollout server are built, the
checkpoint looked up (none found, or one loaded)."""
_RESUMED_FROM = re.compile(rf"{LOADED_CHECKPOINT}: .*global_step_(\d+)")


def parse_step_line(line: str) -> tuple[int, dict[str, float]] | None:
    """veRL's console logger line ``step:N - key:value - ...`` as ``(N, {key: value})``; None for other lines."""
    match = _STEP_LINE.search(line)
    if match is None:
        return None
    metrics = {}
    for item in match.group(2).split(" - "):
        key, sep, value = item.partition(":")
        number = _NUMBER.search(_NUMPY_WRAPPER.sub("", value)) if sep else None
        if number is not None:
            metrics[key] = float(number.group())
    return int(match.group(1)), metrics


def is_error_line(line: str) -> bool:
    """A trainer output line that reports an error (a traceback or an exception message)."""
    return _ERROR_LINE.search(line) is not None


@dataclass
class TrainerRun:
    """What a finished trainer subprocess left: exit code, per-step metrics, its log, time and peak memory."""

    returncode: int
    steps: list[dict[str, float]]
    log_path: Path
    wall_seconds: float
    peak_rss_bytes: int
    command: list[str] = field(default_factory=list)
    milestones: dict[str, float] = field(default_factory=dict)
    last_step_seconds: float = float("nan")
    """Seconds since launch when the last ``step:N`` line came (the end of training and of the last validation)."""
    resumed_from_step: int = 0
    """The step of the checkpoint this attempt resumed from (0: it started afresh); the steps after it are the ones
    its wall time was spent on, while ``steps`` holds every attempt's (`merged_metrics`)."""

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def series(self, key: str) -> list[float]:
        """Values of metric ``key`` per step (steps that did not log it are skipped)."""
        return [step[key] for step in self.steps if key in step]


def run_folder(text: str) -> Path:
    """A command's ``--out`` as an absolute path (an argparse ``type``): veRL's trainer runs in its run's own folder
    (`run_trainer`), so a relative path in its overrides would be read from there, not from where it was typed."""
    return Path(text).absolute()


def trainer_command(overrides: Sequence[str], ray_temp_dir: str, launcher: Sequence[str] | None = None) -> list[str]:
    """``python -m verl.trainer.main_ppo`` with the CPU overrides, a Ray temp dir and ``overrides`` (last wins).

    ``launcher``: a script that adds the CPU overrides and the Ray temp dir (from ``$RAY_TMP``) itself and takes
    veRL overrides after it (``bash recipes/llasa_1b/run.sh grpo`` with ``MODEL=tiny``).
    """
    if launcher:
        return [*launcher, "trainer.logger=[console,file]", *overrides]
    command = [sys.executable, "-m", "verl.trainer.main_ppo", *CPU_OVERRIDES, ray_temp_dir_override(ray_temp_dir)]
    return [*command, "trainer.logger=[console,file]", *overrides]


def read_metrics(path: Path) -> list[dict[str, float]]:
    """veRL's file-logger lines ``{"step": n, "data": {...}}`` as one dict per step (``step`` included)."""
    if not path.exists():
        return []
    steps = []
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            steps.append({"step": record["step"], **record["data"]})
    return steps


EARLIER_ATTEMPT = "metrics.attempt{}.jsonl"
"""Where a resumed run keeps what an earlier, interrupted attempt logged (veRL's file logger starts its file anew)."""


def merged_metrics(workdir: Path) -> list[dict[str, float]]:
    """Every step of a run that was resumed from veRL's checkpoints: the earlier attempts' records, then the
    latest ``metrics.jsonl``'s, merged per step (a later record's values win: the resumed run validates its
    checkpoint's step again), in step order."""
    merged: dict[int, dict[str, float]] = {}
    attempts = sorted(
        workdir.glob(EARLIER_ATTEMPT.format("*")), key=lambda p: int(p.stem.removeprefix("metrics.attempt"))
    )
    for path in [*attempts, workdir / "metrics.jsonl"]:
        for record in read_metrics(path):
            merged.setdefault(int(record["step"]), {}).update(record)
    return [merged[step] for step in sorted(merged)]


def _tree(pid: int, ray_dir: str) -> list:
    import psutil

    procs = []
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        pass
    seen = {p.pid for p in procs}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.pid not in seen and any(ray_dir in arg for arg in proc.info["cmdline"] or ()):
                procs.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return procs


def _memory(procs: list) -> int:
    """Proportional set size summed over ``procs``: shared pages (torch, Ray's object store) counted once."""
    import psutil

    total = 0
    for proc in procs:
        try:
            total += proc.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied, AttributeError):
            continue
    return total


def _kill(pid: int, ray_dir: str) -> None:
    """Stop the run's process group, then any process still naming its Ray dir; SIGTERM first, SIGKILL after 5 s."""
    import psutil

    try:
        os.killpg(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    procs = _tree(pid, ray_dir)
    for proc in procs:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(procs, timeout=5)
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for proc in alive + _tree(pid, ray_dir):
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            continue


def run_trainer(
    overrides: Sequence[str],
    workdir: str | Path,
    *,
    timeout: float = 900,
    env: dict[str, str] | None = None,
    on_line: Callable[[str], None] | None = None,
    launcher: Sequence[str] | None = None,
    cancel: threading.Event | None = None,
    threads: int = 1,
    resume: bool = False,
) -> TrainerRun:
    """Run veRL's trainer on CPU with ``overrides`` and wait for it; the log goes to ``workdir/trainer.log``.

    ``threads``: the cores the run has to itself (`maspo_lab.runs.cpu_overrides.cpu_environment`). ``resume``: the
    run continues from veRL's latest checkpoint in ``workdir`` if an earlier attempt saved one (``trainer.save_freq``,
    ``resume_mode=auto``); the earlier attempts' metrics are kept and the run's steps are all of them
    (`merged_metrics`).

    ``on_line`` sees every output line as it comes (progress). On timeout the run is killed and reported with
    return code `TIMED_OUT`; when ``cancel`` is set (another thread stopping a grid), with `CANCELLED`. Ray and
    every child process are stopped before this returns, whatever happened. ``launcher``: see `trainer_command`.
    The trainer runs in ``workdir``, so paths in ``overrides`` must be absolute (a relative ``workdir`` is made so).
    """
    workdir = Path(workdir).absolute()
    if resume and (done := _trained_to_the_end(overrides, workdir)) is not None:
        return done
    metrics_path = _fresh_metrics(workdir, resume)
    ray_dir = tempfile.mkdtemp(prefix="ray_", dir="/tmp")
    log_path = workdir / "trainer.log"
    command = trainer_command(overrides, ray_dir, launcher)
    run_env = {**os.environ, **cpu_environment(threads), "VERL_FILE_LOGGER_PATH": str(metrics_path)}
    run_env.update({"PYTHONUNBUFFERED": "1", "RAY_TMP": ray_dir, **(env or {})})
    start = time.monotonic()
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(command) + "\n")
        log.flush()
        proc = subprocess.Popen(
            command,
            cwd=workdir,
            env=run_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        memory = _PeakMemory(proc.pid, ray_dir)
        limit = _Limit(proc.pid, ray_dir, start + timeout, cancel)
        try:
            milestones, last_step, resumed_from = _follow(proc, log, start, on_line)
            returncode = proc.wait()
            returncode = limit.stop() or returncode
        finally:
            limit.stop()
            _kill(proc.pid, ray_dir)
            proc.wait()
            peak = memory.stop()
            shutil.rmtree(ray_dir, ignore_errors=True)
    return TrainerRun(
        returncode=returncode,
        steps=merged_metrics(workdir) if resume else read_metrics(metrics_path),
        log_path=log_path,
        wall_seconds=time.monotonic() - start,
        peak_rss_bytes=peak,
        command=command,
        milestones=milestones,
        last_step_seconds=last_step,
        resumed_from_step=resumed_from,
    )


def _override(overrides: Sequence[str], key: str) -> str | None:
    """The value ``overrides`` give ``key`` (the last one wins, as in Hydra); None when they give none."""
    values = [o.partition("=")[2] for o in overrides if o.partition("=")[0] == key]
    return values[-1] if values else None


def checkpointed_step(overrides: Sequence[str], workdir: Path) -> int:
    """The step of the latest checkpoint veRL saved for the run of ``overrides`` in ``workdir``: the
    ``latest_checkpointed_iteration.txt`` in its ``trainer.default_local_dir`` (veRL's default
    ``checkpoints/<project_name>/<experiment_name>``); 0 when there is none, or the overrides do not say where."""
    folder = _override(overrides, "trainer.default_local_dir")
    if folder is None:
        project, experiment = (_override(overrides, f"trainer.{k}") for k in ("project_name", "experiment_name"))
        if project is None or experiment is None:
            return 0
        folder = f"checkpoints/{project}/{experiment}"
    latest = workdir / folder / "latest_checkpointed_iteration.txt"
    return int(latest.read_text()) if latest.exists() else 0


def _trained_to_the_end(overrides: Sequence[str], workdir: Path) -> TrainerRun | None:
    """A run whose checkpoint is at its last step (``trainer.total_training_steps``: an attempt that ended before its
    grid recorded it) as what that attempt left, without launching veRL, which would resume it and train a step past
    its end; None when there are steps left to train."""
    total = _override(overrides, "trainer.total_training_steps")
    step = checkpointed_step(overrides, workdir)
    if total is None or step < int(total):
        return None
    log_path = workdir / "trainer.log"
    return TrainerRun(
        returncode=0, steps=merged_metrics(workdir), log_path=log_path, wall_seconds=0.0, peak_rss_bytes=0,
        resumed_from_step=step,
    )  # fmt: skip


def _fresh_metrics(workdir: Path, resume: bool) -> Path:
    """``workdir/metrics.jsonl``, absent; with ``resume``, an earlier attempt's is kept under `EARLIER_ATTEMPT`."""
    workdir.mkdir(parents=True, exist_ok=True)
    metrics_path = workdir / "metrics.jsonl"
    if resume and metrics_path.exists():
        metrics_path.rename(workdir / EARLIER_ATTEMPT.format(len(list(workdir.glob(EARLIER_ATTEMPT.format("*"))))))
    metrics_path.unlink(missing_ok=True)
    return metrics_path


def _follow(proc: subprocess.Popen, log, start: float, on_line) -> tuple[dict[str, float], float, int]:
    """Copy the run's output to ``log`` (and ``on_line``) until it closes; when each of `MILESTONES` was first seen
    and when the last step was logged, in seconds from ``start``, and the step of the checkpoint it resumed from
    (0 if none)."""
    milestones: dict[str, float] = {}
    last_step = float("nan")
    resumed_from = 0
    assert proc.stdout is not None
    for line in proc.stdout:
        log.write(line)
        now = time.monotonic() - start
        for name, markers in MILESTONES.items():
            if name not in milestones and any(marker in line for marker in markers):
                milestones[name] = now
        if _STEP_LINE.search(line):
            last_step = now
        if (resumed := _RESUMED_FROM.search(line)) is not None:
            resumed_from = int(resumed.group(1))
        if on_line is not None:
            on_line(line.rstrip("\n"))
    return milestones, last_step, resumed_from


class _PeakMemory:
    """Samples the resident memory of the run's process tree every `MEMORY_SAMPLE_SECONDS`, in a thread."""

    def __init__(self, pid: int, ray_dir: str) -> None:
        self.peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(pid, ray_dir), daemon=True)
        self._thread.start()

    def _sample(self, pid: int, ray_dir: str) -> None:
        while not self._stop.wait(MEMORY_SAMPLE_SECONDS):
            self.peak = max(self.peak, _memory(_tree(pid, ray_dir)))

    def stop(self) -> int:
        """Stop sampling; the peak, in bytes."""
        self._stop.set()
        self._thread.join()
        return self.peak


class _Limit:
    """Stops the run (`_kill`) at ``deadline`` (`time.monotonic`) or when ``cancel`` is set, checked every
    `WATCH_SECONDS`, in a thread."""

    def __init__(self, pid: int, ray_dir: str, deadline: float, cancel: threading.Event | None) -> None:
        self.stopped_by: list[int] = []
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(pid, ray_dir, deadline, cancel), daemon=True)
        self._thread.start()

    def _watch(self, pid: int, ray_dir: str, deadline: float, cancel: threading.Event | None) -> None:
        while not self._ended.wait(min(WATCH_SECONDS, max(deadline - time.monotonic(), 0.0))):
            if cancel is not None and cancel.is_set():
                self.stopped_by.append(CANCELLED)
            elif time.monotonic() >= deadline:
                self.stopped_by.append(TIMED_OUT)
            else:
                continue
            _kill(pid, ray_dir)  # after noting why: a run that exits 0 on SIGTERM still reads as stopped
            return

    def stop(self) -> int | None:
        """Stop watching; `TIMED_OUT` or `CANCELLED` if it stopped the run, else None."""
        self._ended.set()
        self._thread.join()
        return self.stopped_by[0] if self.stopped_by else None
