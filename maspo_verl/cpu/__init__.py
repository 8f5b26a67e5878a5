"""Run veRL 0.9.1's own trainer on CPU: switched on with ``MASPO_VERL_CPU=1``, off otherwise.

With the switch set, the plugin entry point (`maspo_verl.verl_plugin`, imported by every ``import verl`` in every
process, Ray workers included) calls `install`, which closes the gaps between veRL 0.9.1 and a CPU-only machine:

1. platform: registers a ``cpu`` platform in veRL's platform registry and selects it (``VERL_PLATFORM=cpu``);
   `maspo_verl.cpu.platform`.
2. distributed backend: veRL builds ``"cpu:gloo,cpu:gloo"`` on CPU, which torch rejects; collapsed to
   ``"cpu:gloo"`` (`maspo_verl.cpu.distributed`, a patch of `maspo_verl.verl_patches.CPU_PATCHES`).
3. engine selection: the FSDP engine is registered for cuda/npu only; ``VERL_ENGINE_DEVICE=cuda`` picks its class,
   which then runs on the platform's device, the CPU.
4. rollout: an ``hf`` backend (replica, server, adapter) that samples from the policy's current weights with a
   ``transformers`` model and returns log-probs (`maspo_verl.cpu.hf_rollout`).
5. actor cost: the engine computes logits at the response positions only, not over the prompt
   (`maspo_verl.cpu.response_logits`, patches of `maspo_verl.verl_patches.CPU_PATCHES`); the values veRL keeps are
   unchanged.

The veRL functions it wraps (2, 5) are installed by the plugin's one patch mechanism (`maspo_verl.verl_patches`:
`CPU_PATCHES`, applied only here); the platform and the rollout (1, 4) are registered in veRL's registries.

The run also needs a few settings (`maspo_lab.runs.cpu_overrides.CPU_OVERRIDES`). The glue reaches into veRL internals,
so it refuses to start on any veRL other than `SUPPORTED_VERL`.
"""

from __future__ import annotations

import os

SUPPORTED_VERL = "0.9.1"

_installed = False


def verl_version() -> str:
    from importlib.metadata import version

    return version("verl")


def check_verl_version(found: str | None = None) -> None:
    """Raise ``RuntimeError`` unless the installed veRL is `SUPPORTED_VERL`."""
    found = verl_version() if found is None else found
    if found != SUPPORTED_VERL:
        raise RuntimeError(
            f"MASPO_VERL_CPU=1: the CPU execution of maspo-verl supports verl=={SUPPORTED_VERL} only, "
            f"found verl=={found}. "
            f"Install verl[verl-core]=={SUPPORTED_VERL} or unset MASPO_VERL_CPU."
        )


def install() -> None:
    """Make veRL run on CPU in this process (idempotent). See the module docstring for what it changes."""
    global _installed
    if _installed:
        return
    check_verl_version()
    from maspo_verl import verl_patches
    from maspo_verl.cpu import hf_rollout, platform

    platform.register()
    engine_device = os.environ.setdefault("VERL_ENGINE_DEVICE", "cuda")
    if engine_device != "cuda":
        raise RuntimeError(
            f"MASPO_VERL_CPU=1 selects veRL's FSDP engine class through VERL_ENGINE_DEVICE=cuda, "
            f"but VERL_ENGINE_DEVICE={engine_device!r}; unset it"
        )
    hf_rollout.register()
    verl_patches.install(verl_patches.CPU_PATCHES)
    _installed = True


# Import veRL last: when a submodule of this package is imported first (a Ray actor unpickling the `hf` server),
# `import verl` loads the plugin, which calls `install` above before the submodule runs; never a half-built module.
import verl  # noqa: E402, F401
