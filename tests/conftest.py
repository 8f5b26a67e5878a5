"""Fixtures shared by several test folders: the tiny random speech checkpoints, written once per session, the
reward server on 127.0.0.1 that serves them (the reward tests and the recipe tests send it their requests), and
the suite's scheduling on several workers."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from maspo_lab.runs.cpu_overrides import ENV, RAY_GCS_WAIT_ENV

REWARD_SERVER_SH = Path(__file__).resolve().parents[1] / "recipes" / "llasa_1b" / "reward_server.sh"

os.environ.setdefault(RAY_GCS_WAIT_ENV, ENV[RAY_GCS_WAIT_ENV])  # the tests' own ray.init, under the suite's load


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow(seconds): a test that takes about this long on 2 quiet cores; its group is started early"
    )


SHARED_FIXTURE_GROUPS = {"shared_run": "e2e-shared-runs", "_reward_server_slot": "reward-server"}
"""Session fixtures that several modules share: their tests run on one worker, so that each is built once."""


def _group(item: pytest.Item) -> str:
    for fixture, group in SHARED_FIXTURE_GROUPS.items():
        if fixture in item.fixturenames:
            return group
    return item.nodeid.split("::")[0]


def pytest_itemcollected(item):
    """The suite runs on several workers (``-n 2 --dist loadgroup`` in pyproject's addopts, pytest-xdist), each
    taking one group at a time: a module (its module fixtures are built once), or the modules sharing a session
    fixture (`SHARED_FIXTURE_GROUPS`). Marked as each test is collected, before pytest-xdist reads the marks."""
    item.add_marker(pytest.mark.xdist_group(_group(item)))


def pytest_collection_modifyitems(config, items):
    """Groups are handed out slowest first (the sum of their ``slow`` marks), so that the trainer runs start early
    and no long one is left alone at the end; within a group the order is the file's."""
    group = {id(item): _group(item) for item in items}
    seconds: dict[str, float] = {}
    for item in items:
        mark = item.get_closest_marker("slow")
        seconds[group[id(item)]] = seconds.get(group[id(item)], 0.0) + (mark.args[0] if mark else 0.0)
    items.sort(key=lambda item: -seconds[group[id(item)]])


@pytest.fixture(scope="session")
def tiny_codec_dir(tmp_path_factory):
    from reward_fns.testing.tiny_models import write_tiny_xcodec2

    return write_tiny_xcodec2(tmp_path_factory.mktemp("xcodec2_random"))


@pytest.fixture(scope="session")
def tiny_paraformer_dir(tmp_path_factory):
    from reward_fns.testing.tiny_models import write_tiny_paraformer

    return write_tiny_paraformer(tmp_path_factory.mktemp("paraformer_random"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RewardServer:
    url: str
    proc: subprocess.Popen


class _RewardServerSlot:
    """`recipes/llasa_1b/reward_server.sh` (``maspo-verl reward-server``) on a free port of 127.0.0.1 with the tiny
    random XCodec2 and Paraformer (Chinese); started when first asked for, again after a test stopped it.
    ``asr_env`` replaces the recogniser (``{"ASR_EN": ...}``), ``flags`` the script's extra flags."""

    def __init__(
        self,
        codec: Path,
        paraformer: Path | None,
        log_dir: Path,
        asr_env: dict[str, str] | None = None,
        flags: tuple[str, ...] = ("--default-language", "zh"),
    ):
        self.codec, self.log_dir = codec, log_dir
        self.asr_env = asr_env or {"ASR_ZH": f"paraformer:{paraformer}"}
        self.flags = flags
        self.server: RewardServer | None = None
        self.starts = 0

    def get(self) -> RewardServer:
        if self.server is None or self.server.proc.poll() is not None:
            self.server = self._start()
        return self.server

    def _start(self) -> RewardServer:
        port = free_port()
        env = {
            **os.environ,
            "PYTHON": sys.executable,
            "CODEC": str(self.codec),
            **self.asr_env,
            "REWARD_DEVICE": "cpu",
            "REWARD_DTYPE": "float32",
            "HOST": "127.0.0.1",
            "PORT": str(port),
            "MAX_BATCH": "8",
            "MAX_WAIT_MS": "100",
        }
        self.starts += 1
        log_path = self.log_dir / f"server{self.starts}.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                ["bash", str(REWARD_SERVER_SH), *self.flags, "--threads", "2", "--log-level", "warning"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        url = f"http://127.0.0.1:{port}"
        import httpx

        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    return RewardServer(url, proc)
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"reward_server.sh did not come up:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.3)

    def stop(self) -> None:
        if self.server is not None and self.server.proc.poll() is None:
            self.server.proc.terminate()
            self.server.proc.wait(timeout=30)


@pytest.fixture(scope="session")
def _reward_server_slot(tiny_codec_dir, tiny_paraformer_dir, tmp_path_factory):
    slot = _RewardServerSlot(tiny_codec_dir, tiny_paraformer_dir, tmp_path_factory.mktemp("reward_server"))
    yield slot
    slot.stop()


@pytest.fixture(scope="session")
def reward_server_slot_class() -> type:
    """`_RewardServerSlot`, for the one module that needs a server with other models than the shared one's."""
    return _RewardServerSlot


@pytest.fixture
def reward_server(_reward_server_slot) -> RewardServer:
    """The running reward server (see `_RewardServerSlot`): ``max_batch=8``, ``max_wait_ms=100``, 2 threads,
    default language zh, every other setting at its default. A test may stop it; the next one gets a new one."""
    return _reward_server_slot.get()


FRESH_VERL_STAGES = {
    # tests/test_plugin_loading.py: `import verl` alone registers the loss and wraps the worker loss, lightly
    "plugin": """
import sys
import verl
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
import verl.workers.engine_workers as engine_workers
import ray
heavy = ("funasr", "faster_whisper", "xcodec2", "torchaudio", "maspo_verl.cpu")
# the plugin may read the light part of the base (token layouts, settings, registry, frame errors and words:
# docs/layout.md), nothing of the codecs or of the reward
base = ("maspo_base", "maspo_base.typed_settings", "maspo_base.registry")
base += ("maspo_base.frame_errors", "maspo_base.frame_words", "maspo_base.reward_backend")
speech = [
    m
    for m in sys.modules
    if m.split(".")[0] in ("reward_fns", "maspo_base") and m not in base and ".speech_tokens" not in m
]
result = {
    "maspo_registered": "maspo" in POLICY_LOSS_REGISTRY,
    "ppo_loss_wrapped": getattr(engine_workers.ppo_loss, "__maspo_wrapped__", False),
    "ray_initialized": ray.is_initialized(),
    "heavy_modules": [m for m in heavy if m in sys.modules] + speech,
}
""",
    # tests/cpu/test_cpu_switch.py: with the switch off, veRL's device, backend and rollouts are its own
    "cpu_switch_off": """
import os
from verl.utils.device import get_device_name, get_torch_device, get_nccl_backend
from verl.workers.rollout.replica import RolloutReplicaRegistry
from verl.workers.rollout.base import _ROLLOUT_REGISTRY
import verl.utils.distributed as d
result = {
    "device": get_device_name(),
    "torch_device": get_torch_device().__name__,
    "backend": get_nccl_backend(),
    "hf_replica": "hf" in RolloutReplicaRegistry._registry,
    "hf_rollout": ("hf", "async") in _ROLLOUT_REGISTRY,
    "engine_device": os.environ.get("VERL_ENGINE_DEVICE"),
    "process_group_patched": getattr(d.initialize_global_process_group_ray, "__maspo_wrapped__", False),
}
""",
    # tests/verl_patches/test_metrics.py: one wrapper of compute_data_metrics, wherever veRL binds it
    "trainer_patches": """
import verl.trainer.ppo.metric_utils as mu
import verl.trainer.ppo.ray_trainer as rt
import verl.trainer.ppo.v1.trainer_base as tb
wrapped = rt.compute_data_metrics
result = {
    "wrapped": getattr(wrapped, "__maspo_wrapped__", False),
    "same_everywhere": wrapped is mu.compute_data_metrics is tb.compute_data_metrics,
    "wrapped_once": not getattr(wrapped.__wrapped__, "__maspo_wrapped__", False),
}
""",
}
"""What the tests that inspect a fresh interpreter look at, in the order it is run (a stage sees only what the
stages before it imported: the first one sees ``import verl`` alone)."""

_FRESH_VERL_RUNNER = """
import json, sys, traceback
for name, code in json.loads(sys.argv[1]).items():
    scope = {}
    try:
        exec(compile(code, name, "exec"), scope)
        line = {"stage": name, "result": scope["result"]}
    except BaseException:
        line = {"stage": name, "error": traceback.format_exc()}
    print("FRESH_VERL " + json.dumps(line), flush=True)
"""


@pytest.fixture(scope="session")
def fresh_verl():
    """``fresh_verl(stage) -> dict``: the result of `FRESH_VERL_STAGES[stage]` in one fresh interpreter (CPU switch
    off: MASPO_VERL_CPU, VERL_PLATFORM and VERL_ENGINE_DEVICE removed from its environment) that imports veRL as a
    user's script does. One interpreter for all: importing veRL takes seconds of CPU."""
    import json

    drop = ("MASPO_VERL_CPU", "VERL_PLATFORM", "VERL_ENGINE_DEVICE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    out = subprocess.run(
        [sys.executable, "-c", _FRESH_VERL_RUNNER, json.dumps(FRESH_VERL_STAGES)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [json.loads(line.split(" ", 1)[1]) for line in out.stdout.splitlines() if line.startswith("FRESH_VERL ")]
    stages = {line["stage"]: line for line in lines}

    def stage(name: str) -> dict:
        line = stages.get(name)
        assert line is not None, f"stage {name!r} did not report (rc={out.returncode}):\n{out.stderr[-3000:]}"
        assert "error" not in line, line["error"]
        return line["result"]

    return stage
