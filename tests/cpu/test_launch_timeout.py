"""`run_trainer` reports a run it stopped at its time limit as timed out (-9), even when the process exits 0."""

from __future__ import annotations

from maspo_verl.cpu.launch import run_trainer

# a launcher that exits 0 on SIGTERM, as a trainer shutting down gracefully does; it would run 60 s otherwise
GRACEFUL = ["bash", "-c", "trap 'exit 0' TERM; sleep 60 & wait", "launcher"]


def test_a_run_stopped_at_its_limit_reads_as_timed_out(tmp_path):
    run = run_trainer([], tmp_path, timeout=2, launcher=GRACEFUL)
    assert run.returncode == -9 and not run.ok
    assert run.wall_seconds < 30


def test_a_launcher_gets_the_overrides_after_its_own_arguments(tmp_path):
    run = run_trainer(["a=1"], tmp_path, timeout=60, launcher=["bash", "-c", 'echo "args: $*; ray: $RAY_TMP"', "x"])
    assert run.ok
    assert "args: trainer.logger=[console,file] a=1; ray: /tmp/ray_" in run.log_path.read_text()
