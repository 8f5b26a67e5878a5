"""`run_trainer` reports a run it stopped at its time limit as timed out (-9), even when the process exits 0, and
one stopped through its ``cancel`` event as cancelled."""

from __future__ import annotations

import threading

from maspo_lab.runs.launch import CANCELLED, TIMED_OUT, run_trainer

# a launcher that exits 0 on SIGTERM, as a trainer shutting down gracefully does, saying so in its log; nothing else
# ends it (its process group is killed with it)
GRACEFUL = ["bash", "-c", "trap 'echo stopped by TERM; exit 0' TERM; sleep infinity & wait", "launcher"]


def test_a_run_stopped_at_its_limit_reads_as_timed_out(tmp_path):
    run = run_trainer([], tmp_path, timeout=2, launcher=GRACEFUL)
    assert run.returncode == TIMED_OUT == -9 and not run.ok
    assert "stopped by TERM" in run.log_path.read_text()


def test_a_launcher_gets_the_overrides_after_its_own_arguments(tmp_path):
    run = run_trainer(["a=1"], tmp_path, timeout=60, launcher=["bash", "-c", 'echo "args: $*; ray: $RAY_TMP"', "x"])
    assert run.ok
    assert "args: trainer.logger=[console,file] a=1; ray: /tmp/ray_" in run.log_path.read_text()


def test_a_cancelled_run_is_stopped_and_reads_as_cancelled(tmp_path):
    cancel = threading.Event()
    threading.Timer(1.0, cancel.set).start()
    run = run_trainer([], tmp_path, timeout=120, launcher=GRACEFUL, cancel=cancel)
    assert run.returncode == CANCELLED and not run.ok
    assert "stopped by TERM" in run.log_path.read_text()


def test_a_run_that_ends_by_itself_is_not_cancelled_afterwards(tmp_path):
    cancel = threading.Event()
    run = run_trainer([], tmp_path, timeout=120, launcher=["bash", "-c", "exit 3", "x"], cancel=cancel)
    cancel.set()
    assert run.returncode == 3
