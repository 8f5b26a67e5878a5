"""Every veRL function the plugin wraps, in one list, installed by one mechanism.

veRL 0.9.1 hands a policy loss only ``response_mask, old_log_probs, advantages`` of a micro-batch, and a registered
advantage estimator only the rewards, mask and uids; it logs a custom reward's parts only in validation. The plugin
closes these gaps by wrapping the veRL functions in `PATCHES`, without forking veRL:

- `actor`: token ids and mini-batch segment counts into the loss (`maspo_verl.loss_inputs`), the loss's metrics of
  the whole mini-batch out of it;
- `trainer`: the reward's frame errors into ``adv_estimator=maspo`` (`maspo_verl.advantage_inputs`), and in the
  driver's ``validate_config`` the ``policy_loss=<name>`` shorthand expanded and ``algorithm.maspo`` checked;
- `metrics`: the reward's numeric parts and the credit metrics into each step's log;
- the listening page: both trainers' generation dumps decoded into ``samples.html`` (`maspo_verl.listening`).

One mechanism: `install` patches each target's module now if it is imported, else right after its first import
(`_PatchAfterImport`), so the plugin never imports veRL's heavy trainer modules itself. A name that veRL binds
with ``from ... import`` is listed once for every module that binds it; the first wrap marks the wrapper with
`WRAPPED`, and a marked target is never wrapped again, whichever module is imported first.

Each patch records the parameters it expects its target to have; ``tests/verl_patches/test_targets.py`` checks
them against the installed veRL, so an upgrade fails there first, loudly, instead of training without MASPO's
inputs. `VERL_VERSION` is the veRL release the list was checked against. `CPU_TARGETS` lists the veRL functions the
CPU glue (`maspo_verl.cpu`, ``MASPO_VERL_CPU=1``) replaces with its own install code; the same test checks them.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from maspo_verl.verl_patches import actor, metrics, trainer

VERL_VERSION = "0.9.1"
WRAPPED = "__maspo_wrapped__"
"""Set to True on every wrapper `install` puts in place: what "already wrapped" means, for every patch."""


@dataclass(frozen=True)
class Patch:
    """``module.attribute`` (``attribute`` may be ``Class.member``) is replaced by ``wrap(original)``."""

    module: str
    attribute: str
    wrap: Callable[[Any], Any]
    parameters: tuple[str, ...]
    """The target's parameter names as the wrapper calls it (for a class: those of its ``checked`` member)."""
    reason: str
    checked: str = ""
    """A member of the target whose parameters are checked instead (a class the wrapper subclasses)."""


_LEGACY = "verl.trainer.ppo.ray_trainer"
_V1 = "verl.trainer.ppo.v1.trainer_base"
_LOSS_PARAMS = ("config", "model_output", "data", "dp_group")
_ADV_PARAMS = ("data", "adv_estimator", "gamma", "lam", "num_repeat", "norm_adv_by_std_in_grpo", "config")
_METRICS_PARAMS = ("batch", "use_critic")
_DUMP_PARAMS = ("self", "inputs", "outputs", "gts", "scores", "reward_extra_infos_dict", "dump_path")

PATCHES: tuple[Patch, ...] = (
    Patch(
        "verl.workers.utils.losses",
        "ppo_loss",
        actor.wrap_ppo_loss,
        _LOSS_PARAMS,
        "the loss sees the micro-batch's response token ids (veRL narrows the batch before the policy loss)",
    ),
    Patch(
        "verl.workers.engine_workers",
        "ppo_loss",
        actor.wrap_ppo_loss,
        _LOSS_PARAMS,
        "the same function, bound by name where the actor worker calls it",
    ),
    Patch(
        "verl.workers.engine_workers",
        "ActorRolloutRefWorker.actor_worker_cls",
        actor.segment_counting_worker_cls,
        ("self", "data"),
        "seg-mean divides by the segments of the whole mini-batch, counted before veRL splits it",
        checked="train_batch",
    ),
    Patch(
        _LEGACY,
        "compute_advantage",
        trainer.wrap_compute_advantage,
        _ADV_PARAMS,
        "adv_estimator=maspo sees each response's frame errors placed on its codec tokens",
    ),
    Patch(
        "verl.trainer.ppo.v1.utils",
        "compute_advantage",
        trainer.wrap_compute_advantage,
        _ADV_PARAMS,
        "the same function, bound by name where the v1 trainer calls it",
    ),
    Patch(
        _V1,
        "PPOTrainer._compute_advantage",
        trainer.wrap_v1_compute_advantage,
        ("self", "batch", "metrics"),
        "the v1 trainer reads few fields from its TransferQueue: fetch responses and frame errors; log credit metrics",
    ),
    Patch(
        _LEGACY,
        "RayPPOTrainer._dump_generations",
        trainer.wrap_dump_generations,
        _DUMP_PARAMS,
        "the listening page: validation and rollout dumps decoded to wav into samples.html (maspo_verl.listening)",
    ),
    Patch(
        _V1,
        "PPOTrainer._dump_generations",
        trainer.wrap_dump_generations,
        _DUMP_PARAMS,
        "the same page from the v1 trainer's dumps",
    ),
    Patch(
        "verl.utils.config",
        "validate_config",
        trainer.wrap_validate_config,
        ("config", "use_reference_policy", "use_critic"),
        "main_ppo checks the config in the driver before Ray starts: the policy_loss=<name> shorthand is expanded "
        "there (the workers receive the full block), algorithm.maspo and trainer.samples are checked",
    ),
    Patch(
        "verl.trainer.ppo.metric_utils",
        "compute_data_metrics",
        metrics.wrap_compute_data_metrics,
        _METRICS_PARAMS,
        "legacy trainer: a custom reward's numeric parts and the credit metrics reach each step's log",
    ),
    Patch(
        _LEGACY,
        "compute_data_metrics",
        metrics.wrap_compute_data_metrics,
        _METRICS_PARAMS,
        "the same function, bound by name in the legacy trainer",
    ),
    Patch(
        _V1,
        "compute_data_metrics",
        metrics.wrap_compute_data_metrics,
        _METRICS_PARAMS,
        "the same function, bound by name in the v1 trainer",
    ),
    Patch(
        _V1,
        "PPOTrainer._compute_metrics",
        metrics.wrap_v1_compute_metrics,
        ("self", "batch", "metrics", "timing_raw", "global_steps", "epoch"),
        "v1 trainer: a custom reward's numeric parts (in the TransferQueue's extra_fields) reach each step's log",
    ),
)


@dataclass(frozen=True)
class CpuTarget:
    """A veRL function the CPU glue replaces when ``MASPO_VERL_CPU=1`` installs it (`maspo_verl.cpu.install`, at
    plugin load, only in CPU runs); listed here so that the same signature test guards it."""

    module: str
    attribute: str
    parameters: tuple[str, ...]
    reason: str
    installed_by: str


CPU_TARGETS: tuple[CpuTarget, ...] = (
    CpuTarget(
        "verl.utils.distributed",
        "initialize_global_process_group_ray",
        ("timeout_second", "backend"),
        "veRL's backend string 'cpu:gloo,cpu:gloo' is refused by torch: one pair per device (also where it is bound "
        "by name: engine_workers, checkpoint_engine.base, sft_trainer)",
        "maspo_verl.cpu.distributed",
    ),
    CpuTarget(
        "verl.utils.distributed",
        "initialize_global_process_group",
        ("timeout_second",),
        "the same backend string, for a process group veRL starts without Ray",
        "maspo_verl.cpu.distributed",
    ),
    CpuTarget(
        "verl.workers.engine.fsdp.transformer_impl",
        "FSDPEngineWithLMHead.prepare_model_inputs",
        ("self", "micro_batch"),
        "the model computes logits at the response positions only (HF logits_to_keep): most of a CPU step",
        "maspo_verl.cpu.response_logits",
    ),
    CpuTarget(
        "verl.workers.engine.fsdp.transformer_impl",
        "FSDPEngineWithLMHead.prepare_model_outputs",
        ("self", "output", "output_args", "micro_batch", "logits_processor_func"),
        "log-probs and entropies from those logits, returned in veRL's layout",
        "maspo_verl.cpu.response_logits",
    ),
)


def resolve(module: Any, attribute: str) -> tuple[Any, str, Any]:
    """``(owner, name, value)`` of a dotted ``attribute`` of ``module``."""
    *path, name = attribute.split(".")
    owner = module
    for part in path:
        owner = getattr(owner, part)
    return owner, name, getattr(owner, name)


def apply(patch: Patch, module: Any) -> None:
    """Wrap ``patch``'s target in ``module`` unless it is wrapped already (idempotent)."""
    owner, name, original = resolve(module, patch.attribute)
    if getattr(original, WRAPPED, False):
        return
    wrapped = patch.wrap(original)
    setattr(wrapped, WRAPPED, True)
    setattr(owner, name, wrapped)


def _patch_module(module: Any) -> None:
    for patch in PATCHES:
        if patch.module == module.__name__:
            apply(patch, module)


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """A ``sys.meta_path`` finder: a module named in `PATCHES` gets its patches right after it is executed."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in {patch.module for patch in PATCHES}:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch_module(module)

        spec.loader.exec_module = exec_and_patch
        return spec


def install() -> None:
    """Patch every target: now where its module is imported, else right after its import (idempotent)."""
    for name in {patch.module for patch in PATCHES}:
        if name in sys.modules:
            _patch_module(sys.modules[name])
    if not any(isinstance(finder, _PatchAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterImport())
