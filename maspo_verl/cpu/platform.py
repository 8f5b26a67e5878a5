"""A CPU platform for veRL's platform registry (``verl.plugin.platform``), selected with ``VERL_PLATFORM=cpu``.

veRL 0.9.1 ships CUDA, NPU and ROCm platforms only and falls back to "nvidia" (silently turning
``trainer.device=cpu`` back into cuda). This platform makes every ``get_device_name()`` say ``cpu``,
``get_torch_device()`` return a ``torch.cpu``-like module that also answers the CUDA memory calls veRL makes
(``empty_cache``, ``mem_get_info``, ``max_memory_allocated``, ...), and the current device be ``"cpu"`` (veRL
calls ``model.to(device=get_device_id())``, which a device index 0 would route to an accelerator).

Ray still schedules workers on the resource named "GPU" (veRL asks for it by that name): start Ray with a logical
``num_gpus`` (`maspo_lab.runs.cpu_overrides`), which reserves nothing on this machine.
"""

from __future__ import annotations

import os
import resource
import sys
import types
from contextlib import contextmanager
from typing import Any

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

PLATFORM_NAME = "cpu"


def _rss_bytes() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _peak_rss_bytes() -> int:
    # ru_maxrss is in KiB on Linux, bytes on macOS
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def _mem_get_info(device: Any = None) -> tuple[int, int]:
    import psutil

    vm = psutil.virtual_memory()
    return vm.available, vm.total


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


def _cpu_device_module() -> types.ModuleType:
    """``torch.cpu`` plus the ``torch.cuda`` calls veRL makes on ``get_torch_device()``, answered for host memory."""
    module = types.ModuleType("maspo_verl.cpu.device", "torch.cpu with the torch.cuda calls veRL makes.")
    for name in dir(torch.cpu):
        if not name.startswith("_"):
            setattr(module, name, getattr(torch.cpu, name))
    module.current_device = lambda: "cpu"
    module.get_device_name = lambda device=None: "CPU"
    module.empty_cache = _noop
    module.ipc_collect = _noop
    module.set_per_process_memory_fraction = _noop
    module.reset_peak_memory_stats = _noop
    module.mem_get_info = _mem_get_info
    module.memory_allocated = lambda device=None: _rss_bytes()
    module.memory_reserved = lambda device=None: _rss_bytes()
    module.max_memory_allocated = lambda device=None: _peak_rss_bytes()
    module.max_memory_reserved = lambda device=None: _peak_rss_bytes()
    module.get_rng_state = lambda device=None: torch.get_rng_state()
    module.set_rng_state = lambda state, device=None: torch.set_rng_state(state)
    module.manual_seed = torch.manual_seed
    module.manual_seed_all = torch.manual_seed
    return module


class PlatformCPU(PlatformBase):
    """Host CPU as veRL's accelerator: gloo collectives, host memory, no profiler, no IPC."""

    def __init__(self) -> None:
        self._module = _cpu_device_module()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return self._module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Never auto-detected: chosen explicitly with VERL_PLATFORM=cpu.
        return False

    def current_device(self) -> str:  # type: ignore[override]  # veRL moves modules to this value
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets it for actors holding the logical "GPU" resource; nothing reads it on CPU.
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def register() -> None:
    """Register `PlatformCPU` as ``cpu`` and make it the platform of this process (``VERL_PLATFORM=cpu``).

    Raises ``RuntimeError`` if ``VERL_PLATFORM`` names another platform, or if veRL already resolved a non-CPU
    platform in this process.
    """
    from verl.plugin.platform import platform_manager

    chosen = os.environ.setdefault("VERL_PLATFORM", PLATFORM_NAME).strip().lower()
    if chosen != PLATFORM_NAME:
        raise RuntimeError(
            f"MASPO_VERL_CPU=1 runs veRL on the CPU platform, but VERL_PLATFORM={chosen!r}; "
            f"unset VERL_PLATFORM or set it to {PLATFORM_NAME!r}"
        )
    PlatformRegistry.register(platform=PLATFORM_NAME)(PlatformCPU)
    current = platform_manager._current_platform
    if current is not None and current.device_name != "cpu":
        raise RuntimeError(
            f"veRL already chose the {current.device_name!r} platform in this process before the CPU switch ran; "
            "set MASPO_VERL_CPU=1 before the process starts"
        )
