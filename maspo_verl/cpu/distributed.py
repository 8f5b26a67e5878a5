"""The process-group backend on CPU.

veRL 0.9.1 builds the backend string ``f"cpu:gloo,{device}:{backend}"`` (``verl/utils/distributed.py``); with the
CPU platform that is ``"cpu:gloo,cpu:gloo"``, which torch rejects (``Duplicate device type cpu in backend string``).
`dedupe_backend` keeps the first backend of each device type, so the string becomes ``"cpu:gloo"``; the wrappers
below apply it to veRL's two initialisers, installed through `maspo_verl.verl_patches.CPU_PATCHES` (in
``verl.utils.distributed`` and wherever the Ray one is bound by name).
"""

from __future__ import annotations

import functools
import os
from datetime import timedelta


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


def wrap_initialize_global_process_group_ray(original):
    """veRL's Ray-side initialiser with a backend string torch accepts on CPU."""

    @functools.wraps(original)
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return original(timeout_second=timeout_second, backend=dedupe_backend(backend or _default_backend()))

    return initialize_global_process_group_ray


def wrap_initialize_global_process_group(original):
    """veRL's initialiser without Ray, as veRL 0.9.1 writes it, with a backend string torch accepts on CPU and no
    ``set_device`` (there is one device)."""
    import torch.distributed

    @functools.wraps(original)
    def initialize_global_process_group(timeout_second=36000):
        torch.distributed.init_process_group(
            backend=_default_backend(),
            timeout=timedelta(seconds=timeout_second),
            init_method=os.environ.get("DIST_INIT_METHOD", None),
        )
        return int(os.environ["LOCAL_RANK"]), int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

    return initialize_global_process_group
