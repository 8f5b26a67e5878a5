"""Settings of the segment-level rollout correction (``algorithm.rollout_correction``), checked in the driver before
Ray (`prepare_rollout_correction`, run by the trainer patch of ``validate_config``).

veRL keeps ``algorithm.rollout_correction`` a plain block and reads it only when a step corrects its first batch;
here every key it holds is checked at once, veRL's own included (a wrong ``rollout_rs`` or threshold stops the run
in seconds, naming the key, instead of after the first rollout). Besides veRL's keys the block takes the
segmentation of the segment modes (`maspo_verl.rollout_correction`)::

    algorithm.rollout_correction.rollout_is=segment
    algorithm.rollout_correction.rollout_rs=seg_mean_k1
    algorithm.rollout_correction.rollout_rs_threshold=0.9_1.1
    +algorithm.rollout_correction.segmenter.name=fixed        # optional: the MASPO block's segmenter by default
    +algorithm.rollout_correction.segmenter.window=10

``segmenter``, ``segmenter_modules`` and ``codec`` mean what they mean in the MASPO block (docs/loss.md). Without
them a MASPO run's rollout correction takes the loss's own segmentation (the driver writes it into the block, so
that the segments of the weights are those of the ratio), any other loss MASPO's defaults (windows of 5 tokens).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from maspo_base.typed_settings import to_plain
from maspo_verl.config import MaspoConfig, MaspoConfigError
from maspo_verl.rollout_correction import SEGMENT_IS_LEVELS, SEGMENT_RS_OPTIONS, split_rejection_options, uses_segments

ROLLOUT_CORRECTION_KEY = "algorithm.rollout_correction"
POLICY_LOSS_KEY = "actor_rollout_ref.actor.policy_loss"
VERL_KEYS = (
    "rollout_is",
    "rollout_is_threshold",
    "rollout_is_batch_normalize",
    "rollout_rs",
    "rollout_rs_threshold",
    "bypass_mode",
    "loss_type",
)
"""veRL 0.9.1's keys of the block (``RolloutCorrectionConfig``)."""
SEGMENTATION_KEYS = ("segmenter", "segmenter_modules", "codec")
"""The keys added here: the segmentation of the segment modes, as in the MASPO block."""
VERL_IS_LEVELS = ("token", "sequence")
LOSS_TYPES = ("ppo_clip", "reinforce")
ROLLOUT_CORRECTION_TARGET = "verl.trainer.config.RolloutCorrectionConfig"


def _verl_rejection_options() -> list[str]:
    from verl.trainer.ppo.rollout_corr_helper import SUPPORTED_ROLLOUT_RS_OPTIONS

    return sorted(SUPPORTED_ROLLOUT_RS_OPTIONS)


def check_verl_keys(block: Mapping, key: str = ROLLOUT_CORRECTION_KEY) -> None:
    """Unknown keys, ``rollout_is``, ``rollout_rs``, their thresholds (veRL's own parsers), ``bypass_mode`` and
    ``loss_type``; a `MaspoConfigError` names the key and what is valid."""
    unknown = sorted(set(block) - {*VERL_KEYS, *SEGMENTATION_KEYS, "_target_"})
    if unknown:
        raise MaspoConfigError(f"{key}: unknown key(s) {unknown}; valid keys: {sorted(VERL_KEYS + SEGMENTATION_KEYS)}")
    levels = [None, *VERL_IS_LEVELS, *SEGMENT_IS_LEVELS]
    rollout_is = block.get("rollout_is", None)
    if rollout_is not in levels:
        raise MaspoConfigError(f"{key}.rollout_is={rollout_is!r} is not valid; valid: {levels}")
    if rollout_is is not None:
        from verl.trainer.ppo.rollout_corr_helper import _parse_rollout_is_threshold

        _checked(key, "rollout_is_threshold", _parse_rollout_is_threshold, block.get("rollout_is_threshold", 2.0))
    _check_rejection(block, key)
    for name in ("bypass_mode", "rollout_is_batch_normalize"):
        if not isinstance(block.get(name, False), bool):
            raise MaspoConfigError(f"{key}.{name} must be true or false, got {block.get(name)!r}")
    if block.get("loss_type", "ppo_clip") not in LOSS_TYPES:
        raise MaspoConfigError(f"{key}.loss_type={block.get('loss_type')!r} is not valid; valid: {list(LOSS_TYPES)}")


def _checked(key: str, name: str, parse, *args) -> Any:
    try:
        return parse(*args)
    except (TypeError, ValueError) as error:
        raise MaspoConfigError(f"{key}.{name}: {error}") from error


def _check_rejection(block: Mapping, key: str) -> None:
    rollout_rs = block.get("rollout_rs", None)
    if rollout_rs is None:
        return
    valid = [*_verl_rejection_options(), *SEGMENT_RS_OPTIONS]
    options = [option.strip() for option in str(rollout_rs).split(",") if option.strip()]
    if not options or not isinstance(rollout_rs, str):
        raise MaspoConfigError(f"{key}.rollout_rs={rollout_rs!r}: a comma-separated list of options from {valid}")
    bad = [option for option in options if option not in valid]
    if bad:
        raise MaspoConfigError(f"{key}.rollout_rs: {bad} not valid; valid options (comma separated): {valid}")
    from verl.trainer.ppo.rollout_corr_helper import _parse_rollout_rs_thresholds

    threshold = block.get("rollout_rs_threshold", None)
    pairs = _checked(key, "rollout_rs_threshold", split_rejection_options, rollout_rs, threshold)
    for group in pairs:
        if group:
            names, specs = [o for o, _ in group], ",".join(s for _, s in group)
            _checked(key, "rollout_rs_threshold", _parse_rollout_rs_thresholds, names, specs)


def segmentation_settings(block: Mapping, key: str = ROLLOUT_CORRECTION_KEY) -> MaspoConfig:
    """The segmentation of the block's segment modes (`SEGMENTATION_KEYS`, MASPO's defaults where absent), as the
    MASPO settings that carry it (`MaspoConfig.segment_layout`). A segmenter of heard words reads the reward's
    ``frame_words``, which both trainers hold when the correction runs
    (`maspo_verl.verl_patches.rollout_correction.heard_words_for_correction`)."""
    values = {name: block[name] for name in SEGMENTATION_KEYS if block.get(name, None) is not None}
    return MaspoConfig.from_mapping(values, key)


def correction_segmenter(block: Any) -> Any:
    """The registered segmenter (`maspo_verl.segmentation.Segmenter`: what it reads) of a block's segment modes."""
    from maspo_verl.segmentation import get_segmenter

    return get_segmenter(segmentation_settings(to_plain(block)).segmenter.name)


def _own_segmentation(block: Mapping) -> bool:
    return any(block.get(name, None) is not None for name in SEGMENTATION_KEYS)


def _maspo_segmentation(policy_loss: Any) -> dict[str, Any]:
    """The MASPO block's segmentation keys as a plain mapping (what it sets; the rest are MASPO's defaults)."""
    block = policy_loss.get("maspo", None) or {}
    if isinstance(block, MaspoConfig):
        segmenter = block.segmenter
        return {
            "segmenter": {
                "name": segmenter.name,
                "min_len": segmenter.min_len,
                "max_len": segmenter.max_len,
                **dataclasses.asdict(segmenter.params),
            },
            "segmenter_modules": list(block.segmenter_modules),
            "codec": dataclasses.asdict(block.codec),
        }
    plain = to_plain(block)
    return {name: plain[name] for name in SEGMENTATION_KEYS if plain.get(name, None) is not None}


def prepare_rollout_correction(config: Any) -> None:
    """In the driver, before Ray, on a composed veRL config (in place):

    - check ``algorithm.rollout_correction`` (`check_verl_keys`, `segmentation_settings` where a segment mode is
      asked for);
    - a MASPO run without a segmentation of its own gets the loss's (written into the block, which is all the
      trainer hands the correction);
    - bypass mode: veRL 0.9.1 puts the block into the actor's ``policy_loss`` only in the driver's copy, after the
      workers are built, so the workers never apply it; for ``loss_mode=maspo`` the block's veRL keys are written
      into ``policy_loss.rollout_correction`` here, and the MASPO loss takes its segment ratio against the rollout
      policy and applies the rejection (`maspo_verl.rollout_correction.correct_in_bypass`). A segment mode in bypass
      mode with another loss, ``loss_type=reinforce`` with MASPO, or a segmentation of its own with MASPO in bypass
      mode stop the run here."""
    from omegaconf import OmegaConf, open_dict

    algorithm = config.get("algorithm", None)
    block = algorithm.get("rollout_correction", None) if algorithm is not None else None
    if block is None:
        return
    check_verl_keys(to_plain(block))
    policy_loss = config.actor_rollout_ref.actor.get("policy_loss", None)
    loss_mode = policy_loss.get("loss_mode", "vanilla") if policy_loss is not None else "vanilla"
    if block.get("bypass_mode", False):
        _check_bypass(block, loss_mode)
        if loss_mode == "maspo":
            verl_block = {name: to_plain(block.get(name)) for name in VERL_KEYS if name in block}
            with open_dict(policy_loss):
                policy_loss.rollout_correction = OmegaConf.create({"_target_": ROLLOUT_CORRECTION_TARGET, **verl_block})
        return
    if not uses_segments(block):
        return
    if loss_mode == "maspo" and not _own_segmentation(block):
        with open_dict(block):
            for name, value in _maspo_segmentation(policy_loss).items():
                block[name] = value
    segmentation_settings(to_plain(block))


def _check_bypass(block: Any, loss_mode: str) -> None:
    key = ROLLOUT_CORRECTION_KEY
    if loss_mode != "maspo":
        if uses_segments(block):
            raise MaspoConfigError(
                f"{key}.bypass_mode=true with {POLICY_LOSS_KEY}.loss_mode={loss_mode!r}: the segment modes "
                f"(rollout_is={block.get('rollout_is')!r}, rollout_rs={block.get('rollout_rs')!r}) are applied in "
                "bypass mode by the maspo loss only (veRL 0.9.1's workers keep their loss and never see this block "
                "in bypass mode); use bypass_mode=false, or loss_mode=maspo"
            )
        return
    if block.get("loss_type", "ppo_clip") != "ppo_clip":
        raise MaspoConfigError(
            f"{key}.loss_type={block.get('loss_type')!r} replaces the policy loss with veRL's REINFORCE; with "
            f"{POLICY_LOSS_KEY}.loss_mode=maspo use loss_type=ppo_clip (the segment ratio against the rollout policy "
            "is the correction)"
        )
    if _own_segmentation(block):
        raise MaspoConfigError(
            f"{key}: in bypass mode the maspo loss rejects on its own segments (those of its ratio); remove "
            f"{key}.segmenter / codec / segmenter_modules and set them in {POLICY_LOSS_KEY}.maspo.segmenter"
        )
