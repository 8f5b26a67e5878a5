"""``algorithm.rollout_correction`` with the segment modes: checked in the driver before Ray, naming the key; a MASPO
run's correction takes the loss's segmentation; bypass mode hands the block to the MASPO loss."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf
from verl.trainer.config import RolloutCorrectionConfig
from verl_driver import driver_check

from maspo_lab.methods import compose_config
from maspo_verl.config import MaspoConfigError, MaspoPolicyLossConfig
from maspo_verl.policy_loss_shorthand import normalize_policy_loss
from maspo_verl.rollout_correction import bypass_correction
from maspo_verl.rollout_correction_config import prepare_rollout_correction, segmentation_settings

RC = "algorithm.rollout_correction"
LOSS = "actor_rollout_ref.actor.policy_loss"
MICRO_BATCH = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"


def prepared(*overrides: str):
    """veRL's ``ppo_trainer`` composed with ``overrides``, its policy loss expanded and its rollout correction
    prepared, as the plugin's driver hook does."""
    overrides = [MICRO_BATCH, *overrides]
    config = compose_config(overrides)
    normalize_policy_loss(config, overrides)
    prepare_rollout_correction(config)
    return config


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([f"{RC}.rollout_is=segments"], rf"{RC}.rollout_is='segments' is not valid; valid: \[None, 'token'"),
        ([f"{RC}.rollout_is=segment", f"{RC}.rollout_is_threshold=0.5_x"], rf"{RC}.rollout_is_threshold: Invalid"),
        ([f"{RC}.rollout_rs=seg_mean_k4", f"{RC}.rollout_rs_threshold=2"], rf"{RC}.rollout_rs: \['seg_mean_k4'\]"),
        ([f"{RC}.rollout_rs=seg_mean_k1"], rf"{RC}.rollout_rs_threshold: rollout_rs_threshold must be provided"),
        ([f"{RC}.rollout_rs=seg_sum_k1", f"{RC}.rollout_rs_threshold=2.0_1.0"], rf"{RC}.rollout_rs_threshold: .*lower"),
        (
            [f"{RC}.rollout_rs=seg_sum_k3", f"{RC}.rollout_rs_threshold=0.1_0.2"],
            rf"{RC}.rollout_rs_threshold: .*single",
        ),
        (
            [f"{RC}.rollout_rs='seg_sum_k3,token_k1'", f"{RC}.rollout_rs_threshold='0.1,0.5_2,3'"],
            rf"{RC}.rollout_rs_threshold: .*exactly 2 thresholds",
        ),
        ([f"{RC}.loss_type=reinforc"], rf"{RC}.loss_type='reinforc' is not valid; valid: \['ppo_clip', 'reinforce'\]"),
        ([f"+{RC}.segmentr.name=fixed"], rf"{RC}: unknown key\(s\) \['segmentr'\]; valid keys: .*'segmenter'"),
        (
            [f"{RC}.rollout_is=segment", f"+{RC}.segmenter.name=nope"],
            rf"{RC}.segmenter.name='nope' is not a registered segmenter",
        ),
        ([f"{RC}.rollout_is=segment", f"+{RC}.segmenter.window=0"], rf"{RC}.segmenter.window: window must be >= 1"),
        (
            [f"{RC}.rollout_is=segment", f"{RC}.bypass_mode=true"],
            rf"{RC}.bypass_mode=true with {LOSS}.loss_mode='vanilla': the segment modes",
        ),
        (
            [f"{LOSS}=maspo", f"{RC}.bypass_mode=true", f"{RC}.loss_type=reinforce"],
            rf"{RC}.loss_type='reinforce' replaces the policy loss",
        ),
        (
            [
                f"{LOSS}=maspo",
                f"{RC}.bypass_mode=true",
                f"{RC}.rollout_rs=seg_mean_k1",
                f"{RC}.rollout_rs_threshold=2",
                f"+{RC}.segmenter.name=fixed",
            ],
            rf"{RC}: in bypass mode the maspo loss rejects on its own segments",
        ),
    ],
    ids=lambda value: str(value)[:60] if isinstance(value, list) else None,
)
def test_bad_settings_stop_the_drivers_config_check_naming_the_key(overrides, message):
    with pytest.raises(MaspoConfigError, match=message):
        driver_check(MICRO_BATCH, *overrides)


def test_veRLs_own_modes_pass_unchanged():
    overrides = [f"{RC}.rollout_is=token", f"{RC}.rollout_rs='seq_mean_k1,token_k3'", f"{RC}.rollout_rs_threshold=1.01"]
    block = OmegaConf.to_container(prepared(*overrides).algorithm.rollout_correction)
    assert "segmenter" not in block and block["rollout_is"] == "token"


def test_a_maspo_run_corrects_over_the_losss_own_segments():
    config = prepared(
        f"{LOSS}=maspo",
        f"+{LOSS}.maspo.segmenter.name=fsq",
        f"+{LOSS}.maspo.segmenter.threshold=3",
        f"+{LOSS}.maspo.codec.layout=mini-llasa",
        f"{RC}.rollout_is=segment",
    )
    block = config.algorithm.rollout_correction
    settings = segmentation_settings(OmegaConf.to_container(block))
    assert settings.segmenter.name == "fsq" and settings.segmenter.params.threshold == 3.0
    assert settings.codec.layout == "mini-llasa"


def test_a_segmentation_of_its_own_wins_and_other_losses_get_maspos_defaults():
    own = prepared(
        f"{LOSS}=maspo",
        f"{RC}.rollout_rs=seg_sum_k1",
        f"{RC}.rollout_rs_threshold=0.5_2.0",
        f"+{RC}.segmenter.name=fixed",
        f"+{RC}.segmenter.window=10",
    )
    settings = segmentation_settings(OmegaConf.to_container(own.algorithm.rollout_correction))
    assert (settings.segmenter.name, settings.segmenter.params.window) == ("fixed", 10)
    vanilla = prepared(f"{RC}.rollout_is=segment_geo")
    settings = segmentation_settings(OmegaConf.to_container(vanilla.algorithm.rollout_correction))
    assert (settings.segmenter.name, settings.segmenter.params.window) == ("fixed", 5)


def test_bypass_mode_hands_the_block_to_the_maspo_loss_on_the_workers():
    from verl.utils.config import omega_conf_to_dataclass

    config = prepared(
        f"{LOSS}=maspo",
        f"{RC}.bypass_mode=true",
        f"{RC}.rollout_is=segment",
        f"{RC}.rollout_rs=seg_mean_k1",
        f"{RC}.rollout_rs_threshold=0.9_1.1",
    )
    # what the actor worker builds from its config (veRL's engine workers, at init)
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    assert isinstance(actor.policy_loss, MaspoPolicyLossConfig)
    correction = actor.policy_loss.rollout_correction
    assert isinstance(correction, RolloutCorrectionConfig)
    assert (correction.bypass_mode, correction.rollout_rs, correction.rollout_rs_threshold) == (
        True,
        "seg_mean_k1",
        "0.9_1.1",
    )
    assert bypass_correction(actor.policy_loss) is correction
    # without bypass mode the workers' loss sees no block (veRL's default: bypass off)
    decoupled = omega_conf_to_dataclass(prepared(f"{LOSS}=maspo", f"{RC}.rollout_is=segment").actor_rollout_ref.actor)
    assert bypass_correction(decoupled.policy_loss) is None
