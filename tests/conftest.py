"""Fixtures shared by several test folders: the tiny random speech checkpoints, written once per session, and the
reward server on 127.0.0.1 that serves them (the reward tests and the recipe tests send it their requests)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REWARD_SERVER_SH = Path(__file__).resolve().parents[1] / "recipes" / "llasa_1b" / "reward_server.sh"


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
    random XCodec2 and Paraformer (Chinese); started when first asked for, again after a test stopped it."""

    def __init__(self, codec: Path, paraformer: Path, log_dir: Path):
        self.codec, self.paraformer, self.log_dir = codec, paraformer, log_dir
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
            "ASR_ZH": f"paraformer:{self.paraformer}",
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
                ["bash", str(REWARD_SERVER_SH), "--default-language", "zh", "--threads", "2", "--log-level", "warning"],
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


@pytest.fixture
def reward_server(_reward_server_slot) -> RewardServer:
    """The running reward server (see `_RewardServerSlot`): ``max_batch=8``, ``max_wait_ms=100``, 2 threads,
    default language zh, every other setting at its default. A test may stop it; the next one gets a new one."""
    return _reward_server_slot.get()
