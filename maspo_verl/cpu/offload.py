"""A forward-only model's FSDP2 offload on CPU.

veRL 0.9.1's FSDP engine wraps a forward-only model (the reference policy of a KL loss, ``use_kl_loss``) with
FSDP2's ``CPUOffloadPolicy(pin_memory=True)`` (``verl/workers/engine/fsdp/transformer_impl.py``); pinning host memory
needs an accelerator, and torch refuses it on a CPU-only machine ("Cannot access accelerator device when none is
available"). Its parameters live in host memory anyway: `wrap_apply_fsdp2` hands FSDP2 the same policy without
pinning, installed through `maspo_verl.verl_patches.CPU_PATCHES`.
"""

from __future__ import annotations

import functools


def unpinned(fsdp_kwargs: dict) -> dict:
    """``fsdp_kwargs`` with a pinning ``CPUOffloadPolicy`` replaced by one that does not pin (anything else kept)."""
    from torch.distributed.fsdp import CPUOffloadPolicy

    policy = fsdp_kwargs.get("offload_policy")
    if isinstance(policy, CPUOffloadPolicy) and policy.pin_memory:
        return {**fsdp_kwargs, "offload_policy": CPUOffloadPolicy(pin_memory=False)}
    return fsdp_kwargs


def wrap_apply_fsdp2(original):
    """veRL's ``apply_fsdp2`` with `unpinned` keyword arguments."""

    @functools.wraps(original)
    def apply_fsdp2(model, fsdp_kwargs, config):
        return original(model, unpinned(fsdp_kwargs), config)

    return apply_fsdp2
