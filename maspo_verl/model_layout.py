"""A run's speech-token layout from the model it trains: the checkpoint's ``speech_tokens.json`` says it once.

The codec blocks a run reads name the layout that tells codec tokens from the rest of a response:

- ``actor_rollout_ref.actor.policy_loss.maspo.codec`` when the loss is MASPO (token segmenters, heard words);
- ``algorithm.maspo.codec`` when the advantage is segment credit or the block is given;
- ``algorithm.rollout_correction.codec`` when the correction has a segmentation of its own.

In the driver, before Ray (`fill_model_layout`, run by the trainer patch of ``validate_config``), the layout the
checkpoint at ``actor_rollout_ref.model.path`` declares (`maspo_base.speech_tokens.checkpoint_layout`) is applied to
each of them by one rule (`apply_model_layout`):

- a block that names no layout (``layout: null``, the shipped default) gets the checkpoint's;
- a block that names the checkpoint's keeps it;
- a block that names another stops the run, naming both (no config can make a model speak another layout).

A checkpoint that declares none (a real Llasa-1B, a hub id) leaves the blocks as configured, and null reads as
Llasa-1B's layout (`maspo_verl.config.CodecConfig.layout_name`). veRL hands the workers this config, so the loss and
the advantage read the model's layout without any config repeating it. The lab applies the same rule to a method it
runs on a task's model (`maspo_lab.methods.task_method`).
"""

from __future__ import annotations

from typing import Any

from maspo_base.speech_tokens.checkpoint_layout import LAYOUT_FILE, declared_layout
from maspo_verl.config import CONFIG_KEY, MaspoConfigError

MODEL_PATH_KEY = "actor_rollout_ref.model.path"
CREDIT_CODEC_KEY = "algorithm.maspo.codec"
CORRECTION_KEY = "algorithm.rollout_correction"
CORRECTION_SEGMENTATION = ("segmenter", "segmenter_modules", "codec")
"""The keys by which ``algorithm.rollout_correction`` has a segmentation of its own
(`maspo_verl.rollout_correction_config.SEGMENTATION_KEYS`)."""


def codec_blocks(config: Any) -> list[str]:
    """The dotted keys of the codec blocks ``config`` (a veRL config or a method's nested mapping) reads."""
    from omegaconf import OmegaConf

    node = OmegaConf.create(config) if isinstance(config, dict) else config
    keys = []
    policy_loss = OmegaConf.select(node, "actor_rollout_ref.actor.policy_loss", default=None)
    if policy_loss is not None and not isinstance(policy_loss, str) and policy_loss.get("loss_mode", None) == "maspo":
        keys.append(f"{CONFIG_KEY}.codec")
    algorithm = node.get("algorithm", None)
    if algorithm is not None:
        estimator = algorithm.get("adv_estimator", None)
        if getattr(estimator, "value", estimator) == "maspo" or algorithm.get("maspo", None) is not None:
            keys.append(CREDIT_CODEC_KEY)
        correction = algorithm.get("rollout_correction", None)
        if correction is not None and any(correction.get(k, None) is not None for k in CORRECTION_SEGMENTATION):
            keys.append(f"{CORRECTION_KEY}.codec")
    return keys


def apply_model_layout(config: Any, layout: str | None, model: str) -> None:
    """Apply the layout ``model`` declares (None: it declares none) to every codec block of ``config`` (an
    OmegaConf config, or a plain nested dict), in place, by the module's rule; `MaspoConfigError` naming the block's
    key, its layout, the model and its layout when they differ."""
    if layout is None:
        return
    from omegaconf import OmegaConf

    node = OmegaConf.create(config) if isinstance(config, dict) else config
    for key in codec_blocks(node):
        configured = OmegaConf.select(node, f"{key}.layout", default=None)
        if configured is None:
            OmegaConf.update(node, f"{key}.layout", layout, force_add=True)
        elif configured != layout:
            raise MaspoConfigError(
                f"{key}.layout={configured!r}, but the model {model} speaks {layout!r} (its {LAYOUT_FILE}): "
                f"drop {key}.layout (the model's layout is read from it) or train a model of {configured!r}"
            )
    if isinstance(config, dict):
        config.update(OmegaConf.to_container(node))


def fill_model_layout(config: Any) -> None:
    """In the driver, before Ray: `apply_model_layout` with the layout the checkpoint at ``actor_rollout_ref.model
    .path`` declares, on the composed veRL config (in place; the workers receive it)."""
    from omegaconf import OmegaConf

    model = OmegaConf.select(config, MODEL_PATH_KEY, default=None)
    if not model:
        return
    try:
        layout = declared_layout(model)
    except ValueError as error:
        raise MaspoConfigError(f"{MODEL_PATH_KEY}={model}: {error}") from None
    apply_model_layout(config, layout, f"{MODEL_PATH_KEY}={model}")
