"""The one-line switch: ``actor_rollout_ref.actor.policy_loss=<name>`` stands for veRL's whole policy-loss block with
``loss_mode=<name>`` (for ``maspo``: the `MaspoPolicyLossConfig` target and every MASPO default), expanded in the
driver before veRL checks its config (`normalize_policy_loss`, run by the trainer patch); later overrides of the
block's keys apply on top."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

from maspo_verl.config import MaspoConfigError, _default_settings
from maspo_verl.plugin_loading import load_plugin

POLICY_LOSS_KEY = "actor_rollout_ref.actor.policy_loss"
VERL_POLICY_LOSS_TARGET = "verl.workers.config.PolicyLossConfig"
MASPO_POLICY_LOSS_TARGET = "maspo_verl.config.MaspoPolicyLossConfig"


def registered_policy_losses() -> list[str]:
    """Names veRL's ``get_policy_loss_fn`` accepts in this process (``maspo`` included)."""
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    load_plugin()  # registers loss_mode=maspo
    return sorted(POLICY_LOSS_REGISTRY)


def maspo_defaults_block() -> dict[str, Any]:
    """Every MASPO setting at its default, as the plain ``policy_loss.maspo`` mapping that builds it; the segmenter
    by name and common options only, so that its own parameters are those of whichever segmenter is chosen."""
    settings = dataclasses.asdict(_default_settings())
    del settings["segmenter"]["params"]
    return settings


def policy_loss_block(name: str) -> dict[str, Any]:
    """The full ``policy_loss`` block that ``policy_loss=<name>`` stands for: veRL's own defaults
    (``trainer/config/actor/actor.yaml``) with ``loss_mode=<name>``; for ``maspo`` the `MaspoPolicyLossConfig`
    target and every MASPO default."""
    registered = registered_policy_losses()
    if name not in registered:
        raise MaspoConfigError(
            f"{POLICY_LOSS_KEY}={name!r} is not a registered policy loss; registered: {registered} (the shorthand "
            f"names a loss; its settings use the block form, e.g. {POLICY_LOSS_KEY}.maspo.segmenter.name=fsq)"
        )
    block = dict(_verl_policy_loss_defaults(), loss_mode=name)
    if name == "maspo":
        block.update(_target_=MASPO_POLICY_LOSS_TARGET, maspo=maspo_defaults_block())
    return block


@functools.cache
def _verl_policy_loss_defaults() -> dict[str, Any]:
    from importlib.resources import files

    from omegaconf import OmegaConf

    actor_yaml = files("verl.trainer.config").joinpath("actor", "actor.yaml").read_text()
    return OmegaConf.to_container(OmegaConf.create(actor_yaml).policy_loss, resolve=False)


def normalize_policy_loss(config: Any, overrides: Sequence[str] | None = None) -> None:
    """Give the workers a full ``policy_loss`` block, in place on a composed veRL config (run in the driver).

    ``overrides``: the command's Hydra overrides (None: those of the running Hydra app, as in ``main_ppo``).

    - ``policy_loss=<name>`` (a string where veRL expects a block) becomes `policy_loss_block(name)`; a name no
      loss is registered under raises `MaspoConfigError` naming the key, the value and the registered losses.
    - Block keys given beside the shorthand
      (``policy_loss.maspo.segmenter.name=fsq``) refine the expanded block whatever their order (Hydra alone
      either drops them or drops the block's ``_target_`` and ``loss_mode``); a ``policy_loss.loss_mode`` that
      names another loss than the shorthand is refused.
    - ``loss_mode=maspo`` on veRL's own `PolicyLossConfig` target gets the `MaspoPolicyLossConfig` target, so the
      block form needs no ``_target_`` and both forms build the same actor config.
    """
    from omegaconf import OmegaConf, open_dict

    actor = config.actor_rollout_ref.actor
    block = actor.get("policy_loss", None)
    parsed = _parse_overrides(_hydra_task_overrides() if overrides is None else overrides)
    shorthand = _shorthand_name(parsed)
    if isinstance(block, str) or shorthand is not None:
        name = block if isinstance(block, str) else shorthand
        expanded = OmegaConf.create(policy_loss_block(name))
        if shorthand is not None:
            _apply_block_overrides(expanded, parsed, name)
        with open_dict(actor):
            actor.policy_loss = expanded
    elif block is not None and block.get("loss_mode", None) == "maspo":
        if block.get("_target_", VERL_POLICY_LOSS_TARGET) == VERL_POLICY_LOSS_TARGET:
            with open_dict(block):
                block._target_ = MASPO_POLICY_LOSS_TARGET


def _parse_overrides(overrides: Sequence[str]) -> list:
    if not overrides:
        return []
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_overrides(overrides=list(overrides))


def _shorthand_name(parsed: list) -> str | None:
    names = [o.value() for o in parsed if o.key_or_group == POLICY_LOSS_KEY and not o.is_delete()]
    names = [name for name in names if isinstance(name, str)]
    return names[-1] if names else None


def _apply_block_overrides(block: Any, parsed: list, name: str) -> None:
    from omegaconf import OmegaConf, open_dict

    prefix = f"{POLICY_LOSS_KEY}."
    with open_dict(block):
        for override in parsed:
            if not override.key_or_group.startswith(prefix):
                continue
            key = override.key_or_group[len(prefix) :]
            if override.is_delete():
                parent, _, leaf = key.rpartition(".")
                node = OmegaConf.select(block, parent) if parent else block
                if node is not None:
                    node.pop(leaf, None)
                continue
            value = override.value()
            if key == "loss_mode" and value != name:
                raise MaspoConfigError(
                    f"{POLICY_LOSS_KEY}={name!r} and {POLICY_LOSS_KEY}.loss_mode={value!r} name two losses; "
                    "give one of them"
                )
            OmegaConf.update(block, key, value, merge=True, force_add=True)


def _hydra_task_overrides() -> list[str]:
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return []
    return list(HydraConfig.get().overrides.task)
