"""``actor_rollout_ref.actor.policy_loss=<name>``: the one-line switch is expanded in the driver, before Ray.

The trainer run that trains MASPO with the shorthand is ``v1_probe_token_jump`` (tests/e2e/shared_runs.py), asserted
in tests/e2e/test_cpu_maspo.py.
"""

import subprocess
import sys
import time

import pytest
from omegaconf import OmegaConf
from verl.trainer.ppo import core_algos
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import PolicyLossConfig

from maspo_lab.methods import MethodError, compose_config, user_method, validate_methods
from maspo_verl.config import MaspoConfig, MaspoConfigError, MaspoPolicyLossConfig, maspo_settings
from maspo_verl.policy_loss_shorthand import normalize_policy_loss, policy_loss_block
from maspo_verl.segmentation.segmenters import FSQDistanceParams

LOSS = "actor_rollout_ref.actor.policy_loss"
MICRO_BATCH = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"


def driver_config(*overrides: str):
    """veRL's ``ppo_trainer`` composed with ``overrides`` and normalised as the plugin's driver hook does."""
    overrides = [MICRO_BATCH, *overrides]
    config = compose_config(overrides)
    normalize_policy_loss(config, overrides)
    return config


def actor(*overrides: str):
    return omega_conf_to_dataclass(driver_config(*overrides).actor_rollout_ref.actor)


def test_maspo_shorthand_builds_the_same_actor_config_as_the_block_form():
    shorthand = actor(f"{LOSS}=maspo")
    assert shorthand == actor(f"{LOSS}.loss_mode=maspo")
    assert shorthand == actor(f"{LOSS}._target_=maspo_verl.config.MaspoPolicyLossConfig", f"{LOSS}.loss_mode=maspo")
    assert isinstance(shorthand.policy_loss, MaspoPolicyLossConfig)
    assert shorthand.policy_loss.maspo == MaspoConfig.from_mapping({})
    # veRL's own policy-loss keys keep veRL's defaults
    assert shorthand.policy_loss.ppo_kl_coef == PolicyLossConfig().ppo_kl_coef
    assert shorthand.policy_loss.clip_cov_ratio == PolicyLossConfig().clip_cov_ratio


def test_the_workers_receive_every_maspo_default_in_the_expanded_block():
    block = OmegaConf.to_container(driver_config(f"{LOSS}=maspo").actor_rollout_ref.actor.policy_loss)
    assert block["_target_"] == "maspo_verl.config.MaspoPolicyLossConfig"
    assert block["loss_mode"] == "maspo"
    defaults = MaspoConfig.from_mapping({})
    written = block["maspo"]
    assert set(written) == {"segmenter", "segmenter_modules", "codec", *_scalar_fields(defaults)}
    for name in _scalar_fields(defaults):
        assert written[name] == getattr(defaults, name), name
    assert written["segmenter"] == {"name": "fixed", "min_len": None, "max_len": None}
    # layout null: the model's (veRL's default model path declares none), read as Llasa-1B's
    assert written["codec"] == {"layout": None, "offset": None, "codebook_size": None, "tokenizer": None}
    assert (defaults.codec.speech_tokens.offset, defaults.codec.speech_tokens.codebook_size) == (128264, 65536)
    assert MaspoConfig.from_mapping(written) == defaults


def _scalar_fields(config) -> list[str]:
    return [name for name in config.__dataclass_fields__ if name not in ("segmenter", "segmenter_modules", "codec")]


@pytest.mark.parametrize("name", ["vanilla", "gspo"])
def test_verl_loss_shorthands_give_verls_own_losses(name):
    shorthand = actor(f"{LOSS}={name}")
    assert shorthand == actor(f"{LOSS}.loss_mode={name}")
    assert type(shorthand.policy_loss) is PolicyLossConfig
    expected = {"vanilla": core_algos.compute_policy_loss_vanilla, "gspo": core_algos.compute_policy_loss_gspo}[name]
    assert core_algos.get_policy_loss_fn(shorthand.policy_loss.loss_mode) is expected


@pytest.mark.parametrize(
    "overrides",
    [
        # Hydra alone turns this into {'maspo': {...}}: the block's _target_ and loss_mode are lost
        (f"{LOSS}=maspo", f"+{LOSS}.maspo.segmenter.name=fsq", f"+{LOSS}.maspo.segmenter.threshold=3"),
        # Hydra alone keeps the string: the block keys given first are dropped
        (f"+{LOSS}.maspo.segmenter.name=fsq", f"+{LOSS}.maspo.segmenter.threshold=3", f"{LOSS}=maspo"),
        # the block form needs no _target_ any more
        (f"{LOSS}.loss_mode=maspo", f"+{LOSS}.maspo.segmenter.name=fsq", f"+{LOSS}.maspo.segmenter.threshold=3"),
    ],
    ids=["shorthand-first", "shorthand-last", "block-form"],
)
def test_block_keys_beside_the_shorthand_refine_it_in_either_order(overrides):
    settings = maspo_settings(actor(*overrides).policy_loss)
    assert settings.segmenter.name == "fsq"
    assert settings.segmenter.params == FSQDistanceParams(threshold=3.0)
    assert settings.clip_ratio_low == MaspoConfig().clip_ratio_low  # the rest stays at its defaults


@pytest.mark.parametrize("order", ["shorthand-first", "shorthand-last"])
def test_a_block_key_can_change_a_verl_default_of_the_expanded_block(order):
    # `++`: after the shorthand Hydra holds a string there, before it the key exists (Hydra refuses `+` then)
    overrides = [f"{LOSS}=gspo", f"++{LOSS}.ppo_kl_coef=0.5"]
    policy_loss = actor(*(overrides if order == "shorthand-first" else overrides[::-1])).policy_loss
    assert policy_loss.loss_mode == "gspo" and policy_loss.ppo_kl_coef == 0.5


def test_shorthand_and_a_loss_mode_naming_another_loss_are_refused():
    with pytest.raises(MaspoConfigError, match=r"policy_loss='maspo' and .*policy_loss.loss_mode='gspo' name two"):
        driver_config(f"{LOSS}.loss_mode=gspo", f"{LOSS}=maspo")


def test_unknown_shorthand_names_the_key_the_value_and_the_registered_losses():
    with pytest.raises(MaspoConfigError) as error:
        driver_config(f"{LOSS}=maspoo")
    message = str(error.value)
    assert f"{LOSS}='maspoo' is not a registered policy loss" in message
    for name in ("maspo", "vanilla", "gspo", "sapo"):
        assert f"'{name}'" in message
    with pytest.raises(MaspoConfigError, match="not a registered policy loss"):
        policy_loss_block("")


def test_ablate_prevalidation_accepts_the_shorthand_and_names_a_typo():
    validate_methods([user_method("x", (f"{LOSS}=maspo", MICRO_BATCH))], [])
    with pytest.raises(MethodError, match=r"--method 'y'.*policy_loss='maspoo' is not a registered policy loss"):
        validate_methods([user_method("y", (f"{LOSS}=maspoo", MICRO_BATCH))], [])


def test_a_typo_fails_in_verls_driver_before_ray_starts(tmp_path):
    started = time.monotonic()
    result = subprocess.run(  # in tmp_path: Hydra writes outputs/ into the working directory
        [sys.executable, "-m", "verl.trainer.main_ppo", f"{LOSS}=maspoo"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    seconds = time.monotonic() - started
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"{LOSS}='maspoo' is not a registered policy loss" in output
    assert "'maspo'" in output and "'vanilla'" in output
    assert "ray init kwargs" not in output  # main_ppo prints this as it starts Ray
    sys.stderr.write(f"[shorthand] the driver refused the typo after {seconds:.1f} s\n")
