"""The process-group backend on CPU.

veRL 0.9.1 builds the backend string ``f"cpu:gloo,{device}:{backend}"`` (``verl/utils/distributed.py``); with the
CPU platform that is ``"cpu:gloo,cpu:gloo"``, which torch rejects (``Duplicate device type cpu in backend string``).
`dedupe_backend` keeps the first backend of each device type, so the string becomes ``"cpu:gloo"``; the wrappers
below apply it to veRL's two initialisers, in ``verl.utils.distributed`` and wherever their names were imported.
"""

from __future__ import annotations

import functools
import sys

_IMPORTERS = ("verl.workers.engine_workers", "verl.checkpoint_engine.base", "verl.trainer.sft_trainer")


def dedupe_backend(backend: str) -> str:
    """``"cpu:gloo,cpu:gloo" -> "cpu:gloo"``; keeps the first ``device:backend`` pair of each device type."""
    if ":" not in backend:
        return backend
    kept: dict[str, str] = {}
    for part in backend.split(","):
        device, _, name = part.strip().partition(":")
        kept.setdefault(device, name)
    return ",".join(f"{device}:{name}" for device, name in kept.items())


def _default_backend() -> str:
    from verl.utils.device import get_device_name, get_nccl_backend

    return dedupe_backend(f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}")


def install() -> None:
    """Wrap veRL's process-group initialisers so they pass a backend string torch accepts on CPU."""
    import torch.distributed
    import verl.utils.distributed as dist

    if getattr(dist.initialize_global_process_group_ray, "_maspo_cpu", False):
        return
    original_ray = dist.initialize_global_process_group_ray

    @functools.wraps(original_ray)
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return original_ray(timeout_second=timeout_second, backend=dedupe_backend(backend or _default_backend()))

    @functools.wraps(dist.initialize_global_process_group)
    def initialize_global_process_group(timeout_second=36000):
        import os
        from datetime import timedelta

        torch.distributed.init_process_group(
            backend=_default_backend(),
            timeout=timedelta(seconds=timeout_second),
            init_method=os.environ.get("DIST_INIT_METHOD", None),
        )
        return int(os.environ["LOCAL_RANK"]), int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

    initialize_global_process_group_ray._maspo_cpu = True
    replacements = {
        "initialize_global_process_group_ray": initialize_global_process_group_ray,
        "initialize_global_process_group": initialize_global_process_group,
    }
    for module in (dist, *(sys.modules.get(name) for name in _IMPORTERS)):
        for name, wrapper in replacements.items():
            if module is not None and hasattr(module, name):
                setattr(module, name, wrapper)
