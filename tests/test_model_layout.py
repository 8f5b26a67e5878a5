"""A run's speech-token layout is the one its model's checkpoint declares (``speech_tokens.json``): the driver fills it
into every codec block the run reads and stops a config that names another (`maspo_verl.model_layout`), before Ray."""

from __future__ import annotations

import json

import pytest
from verl_driver import driver_check

from maspo_base.speech_tokens.checkpoint_layout import LAYOUT_FILE, checkpoint_layout_name, declared_layout
from maspo_verl.config import MaspoConfigError, maspo_settings
from maspo_verl.credit_config import credit_settings

LOSS = "actor_rollout_ref.actor.policy_loss"
MASPO = f"{LOSS}.maspo"
MODEL = "actor_rollout_ref.model.path"
RUN = (
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
    "algorithm.adv_estimator=grpo",  # no critic: its model would be veRL's default one
)
"""What veRL's own driver check asks of a run, before what a test sets."""


def drive(*overrides: str):
    return driver_check(*RUN, *overrides)


def checkpoint(folder, layout: str | None):
    """A model folder as far as its layout goes: ``speech_tokens.json`` naming ``layout`` (None: no file)."""
    folder.mkdir(parents=True, exist_ok=True)
    if layout is not None:
        (folder / LAYOUT_FILE).write_text(json.dumps({"layout": layout, "seed": 0}))
    return folder


def test_a_checkpoint_declares_its_layout_or_none(tmp_path):
    assert declared_layout(checkpoint(tmp_path / "mini", "mini-llasa")) == "mini-llasa"
    assert declared_layout(checkpoint(tmp_path / "llasa", None)) is None  # a real Llasa-1B has no such file
    assert checkpoint_layout_name(tmp_path / "llasa") == "llasa-1b"
    assert declared_layout("HKUSTAudio/Llasa-1B") is None  # a hub id: nothing here to read
    (tmp_path / "bad" / LAYOUT_FILE).parent.mkdir()
    (tmp_path / "bad" / LAYOUT_FILE).write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"bad/speech_tokens.json: expected a JSON object with the model's layout"):
        declared_layout(tmp_path / "bad")


def test_the_driver_gives_the_loss_and_the_credit_the_models_layout(tmp_path):
    """No config names the layout: the workers receive the checkpoint's in both blocks."""
    model = checkpoint(tmp_path / "mini", "mini-llasa")
    config = drive(
        f"{MODEL}={model}",
        f"{LOSS}.loss_mode=maspo",  # the block form (the shorthand with block keys needs Hydra's own app)
        f"+{MASPO}.segmenter.name=fsq",
        "algorithm.adv_estimator=maspo",
    )
    assert config.actor_rollout_ref.actor.policy_loss.maspo.codec.layout == "mini-llasa"
    assert maspo_settings(config.actor_rollout_ref.actor.policy_loss).codec.speech_tokens.codebook_size == 1024
    assert credit_settings(config.algorithm).codec.speech_tokens.name == "mini-llasa"


def test_a_users_method_in_block_form_on_the_shipped_model_reads_mini_llasa():
    """A user's MASPO method, written as its own overrides (``maspo_trainer.yaml`` keeps ``layout: null``), on the
    speaking testbed's shipped checkpoint."""
    from maspo_lab.speaking_model import SHIPPED_MODEL

    config = driver_check(
        *RUN,
        f"{MODEL}={SHIPPED_MODEL}",
        f"{MASPO}.segmenter.name=fsq",
        config_module="maspo_verl.trainer_config",
        config_name="maspo_trainer",
    )
    assert config.actor_rollout_ref.actor.policy_loss.maspo.codec.layout == "mini-llasa"
    assert config.algorithm.maspo.codec.layout == "mini-llasa"  # the block is there: credit would read it


def test_a_configured_layout_that_is_not_the_models_stops_the_driver_naming_both(tmp_path):
    model = checkpoint(tmp_path / "mini", "mini-llasa")
    with pytest.raises(
        MaspoConfigError,
        match=rf"{MASPO}.codec.layout='llasa-1b', but the model {MODEL}=.*mini speaks 'mini-llasa' "
        r"\(its speech_tokens.json\)",
    ):
        drive(f"{MODEL}={model}", f"{LOSS}.loss_mode=maspo", f"+{MASPO}.codec.layout=llasa-1b")
    with pytest.raises(MaspoConfigError, match=r"algorithm.maspo.codec.layout='llasa-1b', but the model"):
        drive(f"{MODEL}={model}", "algorithm.adv_estimator=maspo", "+algorithm.maspo.codec.layout=llasa-1b")
    # the model's own layout, written out, passes
    config = drive(f"{MODEL}={model}", f"{LOSS}.loss_mode=maspo", f"+{MASPO}.codec.layout=mini-llasa")
    assert config.actor_rollout_ref.actor.policy_loss.maspo.codec.layout == "mini-llasa"


def test_a_checkpoint_without_a_declaration_keeps_the_configured_layout(tmp_path):
    """A real Llasa-1B has no speech_tokens.json: the config's layout stands, and null reads as Llasa-1B's."""
    model = checkpoint(tmp_path / "llasa", None)
    config = drive(f"{MODEL}={model}", f"{LOSS}.loss_mode=maspo", f"+{MASPO}.codec.layout=mini-llasa")
    assert config.actor_rollout_ref.actor.policy_loss.maspo.codec.layout == "mini-llasa"
    config = drive(f"{MODEL}={model}", f"{LOSS}=maspo")
    assert config.actor_rollout_ref.actor.policy_loss.maspo.codec.layout is None
    assert maspo_settings(config.actor_rollout_ref.actor.policy_loss).codec.speech_tokens.name == "llasa-1b"


def test_a_rollout_correction_with_its_own_segments_reads_the_models_layout(tmp_path):
    model = checkpoint(tmp_path / "mini", "mini-llasa")
    rc = "algorithm.rollout_correction"
    config = drive(
        f"{MODEL}={model}", f"{rc}.rollout_is=segment", f"+{rc}.segmenter.name=fsq", f"+{rc}.segmenter.threshold=4"
    )
    assert config.algorithm.rollout_correction.codec.layout == "mini-llasa"
    # without a segmentation of its own a MASPO run's correction takes the loss's, filled before it is copied
    config = drive(f"{MODEL}={model}", f"{LOSS}=maspo", f"{rc}.rollout_is=segment")
    assert config.algorithm.rollout_correction.codec.layout == "mini-llasa"
