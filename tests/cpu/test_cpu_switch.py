"""The CPU switch: off by default, refuses other veRL releases, and installs the platform, backend fix and rollout."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from maspo_lab.runs.cpu_overrides import ray_temp_dir_override
from maspo_verl import cpu
from maspo_verl.cpu.distributed import dedupe_backend


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("MASPO_VERL_CPU", "VERL_PLATFORM", "VERL_ENGINE_DEVICE")}
    return subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, timeout=120
    )


PROBE = """
import os, verl
from verl.utils.device import get_device_name, get_torch_device, get_nccl_backend
from verl.workers.rollout.replica import RolloutReplicaRegistry
from verl.workers.rollout.base import _ROLLOUT_REGISTRY
import verl.utils.distributed as d
print(get_device_name(), get_torch_device().__name__, get_nccl_backend(),
      "hf" in RolloutReplicaRegistry._registry, ("hf", "async") in _ROLLOUT_REGISTRY,
      os.environ.get("VERL_ENGINE_DEVICE"), getattr(d.initialize_global_process_group_ray, "__maspo_wrapped__", False))
"""


def test_switch_off_changes_nothing(fresh_verl):
    result = fresh_verl("cpu_switch_off")  # tests/conftest.py: a fresh interpreter without the switch
    assert result["device"] != "cpu"
    assert result["hf_replica"] is result["hf_rollout"] is result["process_group_patched"] is False
    assert result["engine_device"] is None


def test_switch_on_installs_the_cpu_execution():
    out = _python(PROBE, MASPO_VERL_CPU="1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["cpu", "maspo_verl.cpu.device", "gloo", "True", "True", "cuda", "True"]


def test_switch_on_refuses_a_conflicting_platform():
    out = _python(
        "import verl; from verl.utils.device import get_device_name; print(get_device_name())",
        MASPO_VERL_CPU="1",
        VERL_PLATFORM="nvidia",
    )
    assert "VERL_PLATFORM='nvidia'" in out.stderr
    assert out.stdout.strip() != "cpu"


def test_refuses_other_verl_releases():
    cpu.check_verl_version("0.9.1")
    with pytest.raises(RuntimeError, match=r"supports verl==0\.9\.1 only, found verl==0\.10\.0"):
        cpu.check_verl_version("0.10.0")


def test_backend_string_collapses_duplicate_devices():
    assert dedupe_backend("cpu:gloo,cpu:gloo") == "cpu:gloo"
    assert dedupe_backend("cpu:gloo,cuda:nccl") == "cpu:gloo,cuda:nccl"
    assert dedupe_backend("gloo") == "gloo"


def test_ray_temp_dir_must_be_short():
    assert ray_temp_dir_override("/tmp/ray_x") == "+ray_kwargs.ray_init._temp_dir=/tmp/ray_x"
    with pytest.raises(ValueError, match="108 bytes"):
        ray_temp_dir_override("/tmp/" + "d" * 80)


def test_a_forward_only_model_is_offloaded_without_pinned_memory():
    """veRL offloads the KL loss's reference with ``CPUOffloadPolicy(pin_memory=True)``; pinning needs an
    accelerator, so the CPU glue hands FSDP2 the same policy unpinned and leaves anything else alone."""
    from torch.distributed.fsdp import CPUOffloadPolicy

    from maspo_verl.cpu.offload import unpinned, wrap_apply_fsdp2

    kwargs = {"mesh": "m", "offload_policy": CPUOffloadPolicy(pin_memory=True), "reshard_after_forward": True}
    seen = []
    wrap_apply_fsdp2(lambda model, fsdp_kwargs, config: seen.append(fsdp_kwargs))("model", kwargs, {})
    assert seen[0]["offload_policy"] == CPUOffloadPolicy(pin_memory=False)
    assert {k: v for k, v in seen[0].items() if k != "offload_policy"} == {"mesh": "m", "reshard_after_forward": True}
    assert kwargs["offload_policy"].pin_memory  # the caller's dict is left as it was
    assert unpinned({"offload_policy": None}) == {"offload_policy": None}
