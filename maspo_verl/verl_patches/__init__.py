"""Every veRL function the plugin wraps, in one list, installed by one mechanism.

veRL 0.9.1 hands a policy loss only ``response_mask, old_log_probs, advantages`` of a micro-batch, and a registered
advantage estimator only the rewards, mask and uids; it logs a custom reward's parts only in validation. The plugin
closes these gaps by wrapping the veRL functions in `PATCHES`, without forking veRL:

- `actor`: token ids and mini-batch segment counts into the loss (`maspo_verl.loss_inputs`), the loss's metrics of
  the whole mini-batch out of it;
- `trainer`: the reward's frame errors into ``adv_estimator=maspo`` (`maspo_verl.advantage_inputs`), its heard
  words into the actor's batch (the ``heard_words`` segmenter), and in the driver's ``validate_config`` the
  ``policy_loss=<name>`` shorthand expanded, the model's speech-token layout filled in, ``algorithm.maspo``, the
  speech reward's backend and the reward of a heard-words run checked;
- `metrics`: the reward's numeric parts and the credit metrics into each step's log;
- `rollout_correction`: ``algorithm.rollout_correction``'s segment levels and options (``rollout_is=segment``)
  computed where veRL computes its own, and the driver's ``loss_mode`` kept in bypass mode;
- the listening page: both trainers' generation dumps decoded into ``samples.html`` (`maspo_verl.listening`).

One mechanism: `install` patches each target's module now if it is imported, else right after its first import
(`_PatchAfterImport`), so the plugin never imports veRL's heavy trainer modules itself. A name that veRL binds
with ``from ... import`` is listed once for every module that binds it; the first wrap marks the wrapper with
`WRAPPED`, and a marked target is never wrapped again, whichever module is imported first.

Each patch records the parameters it expects its target to have; ``tests/verl_patches/test_targets.py`` checks
them against the installed veRL, so an upgrade fails there first, loudly, instead of training without MASPO's
inputs. `VERL_VERSION` is the veRL release the list was checked against.

`CPU_PATCHES` is the CPU glue's list (`maspo_verl.cpu`), installed by the same mechanism only when
``MASPO_VERL_CPU=1`` (``install(CPU_PATCHES)`` from `maspo_verl.cpu.install`); its wrappers live in
`maspo_verl.cpu` and are imported when a patch is applied, so the plugin's import stays free of them otherwise. The
same test checks them, in a process with the switch on.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from maspo_verl.verl_patches import actor, metrics, rollout_correction, trainer

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
_ROLLOUT_CORRECTION = "verl.trainer.ppo.rollout_corr_helper"
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
        "the v1 trainer reads few fields from its TransferQueue: fetch responses and frame errors; log credit metrics; "
        "responses (and frame words) for a segment-level rollout correction whose segmenter reads token ids (or "
        "heard words)",
    ),
    Patch(
        _LEGACY,
        "RayPPOTrainer._update_actor",
        trainer.wrap_legacy_update_actor,
        ("self", "batch"),
        "the heard_words segmenter: the reward's frame_words placed on the response tokens, a (B, T) batch field "
        "that the actor's micro-batches carry to the loss",
    ),
    Patch(
        _V1,
        "PPOTrainer._update_actor",
        trainer.wrap_v1_update_actor,
        ("self", "batch", "metrics"),
        "the same from the v1 trainer: the field is written to its TransferQueue and named in the batch's fields, "
        "so the actor worker receives it",
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
        "there (the workers receive the full block), algorithm.maspo, algorithm.rollout_correction and "
        "trainer.samples are checked, and a heard-words segmenter's reward reports frame_words",
    ),
    Patch(
        _ROLLOUT_CORRECTION,
        "compute_rollout_correction_and_add_to_batch",
        rollout_correction.wrap_add_to_batch,
        ("batch", "rollout_corr_config"),
        "algorithm.rollout_correction.rollout_is=segment and the seg_* rejection options: weights and mask over the "
        "segments of a segmenter, computed in the driver where veRL computes its token and sequence levels (the "
        "legacy trainer looks the function up here at each step)",
    ),
    Patch(
        _V1,
        "compute_rollout_correction_and_add_to_batch",
        rollout_correction.wrap_add_to_batch,
        ("batch", "rollout_corr_config"),
        "the same function, bound by name in the v1 trainer",
    ),
    Patch(
        _ROLLOUT_CORRECTION,
        "apply_bypass_mode",
        rollout_correction.wrap_apply_bypass_mode,
        ("batch", "rollout_corr_config", "policy_loss_config"),
        "bypass mode sets the driver's policy_loss.loss_mode to bypass_mode after the workers were built with theirs; "
        "for maspo the driver's copy keeps saying maspo (its heard-words hook reads it)",
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


def _cpu_wrap(module: str, wrap: str) -> Callable[[Any], Any]:
    """``maspo_verl.cpu.<module>.<wrap>``, imported when the patch is applied (only in a CPU run)."""

    def wrap_with_cpu_glue(original: Any) -> Any:
        return getattr(importlib.import_module(f"maspo_verl.cpu.{module}"), wrap)(original)

    wrap_with_cpu_glue.__qualname__ = f"maspo_verl.cpu.{module}.{wrap}"
    return wrap_with_cpu_glue


_GROUP_RAY = ("timeout_second", "backend")
_ENGINE = "verl.workers.engine.fsdp.transformer_impl"

CPU_PATCHES: tuple[Patch, ...] = (
    Patch(
        "verl.utils.distributed",
        "initialize_global_process_group_ray",
        _cpu_wrap("distributed", "wrap_initialize_global_process_group_ray"),
        _GROUP_RAY,
        "veRL's backend string 'cpu:gloo,cpu:gloo' is refused by torch: one pair per device",
    ),
    Patch(
        "verl.workers.engine_workers",
        "initialize_global_process_group_ray",
        _cpu_wrap("distributed", "wrap_initialize_global_process_group_ray"),
        _GROUP_RAY,
        "the same function, bound by name where the workers start their process group",
    ),
    Patch(
        "verl.checkpoint_engine.base",
        "initialize_global_process_group_ray",
        _cpu_wrap("distributed", "wrap_initialize_global_process_group_ray"),
        _GROUP_RAY,
        "the same function, bound by name in the checkpoint engine",
    ),
    Patch(
        "verl.utils.distributed",
        "initialize_global_process_group",
        _cpu_wrap("distributed", "wrap_initialize_global_process_group"),
        ("timeout_second",),
        "the same backend string, for a process group veRL starts without Ray (read at call time by sft_trainer)",
    ),
    Patch(
        _ENGINE,
        "apply_fsdp2",
        _cpu_wrap("offload", "wrap_apply_fsdp2"),
        ("model", "fsdp_kwargs", "config"),
        "a forward-only model (the KL loss's reference) is offloaded with pinned memory, which needs an accelerator",
    ),
    Patch(
        _ENGINE,
        "FSDPEngineWithLMHead.prepare_model_inputs",
        _cpu_wrap("response_logits", "wrap_prepare_model_inputs"),
        ("self", "micro_batch"),
        "the model computes logits at the response positions only (HF logits_to_keep): most of a CPU step",
    ),
    Patch(
        _ENGINE,
        "FSDPEngineWithLMHead.prepare_model_outputs",
        _cpu_wrap("response_logits", "wrap_prepare_model_outputs"),
        ("self", "output", "output_args", "micro_batch", "logits_processor_func"),
        "log-probs and entropies from those logits, returned in veRL's layout",
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


_INSTALLED: list[Patch] = []
"""The patches `install` was given in this process (`PATCHES`, and `CPU_PATCHES` in a CPU run), in order."""


def _patch_module(module: Any) -> None:
    for patch in _INSTALLED:
        if patch.module == module.__name__:
            apply(patch, module)


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """A ``sys.meta_path`` finder: a module named in an installed patch gets its patches right after it is executed."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in {patch.module for patch in _INSTALLED}:
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


def install(patches: Sequence[Patch] = PATCHES) -> None:
    """Patch every target of ``patches``: now where its module is imported, else right after its import
    (idempotent; a second list adds to the first)."""
    _INSTALLED.extend(patch for patch in patches if patch not in _INSTALLED)
    for name in {patch.module for patch in patches}:
        if name in sys.modules:
            _patch_module(sys.modules[name])
    if not any(isinstance(finder, _PatchAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterImport())
