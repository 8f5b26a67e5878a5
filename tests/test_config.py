"""MASPO settings are checked when veRL builds its config: every error names the key at fault and what is valid."""

import textwrap

import pytest
from hydra import compose, initialize_config_module
from hydra.errors import InstantiationException
from verl.utils.config import omega_conf_to_dataclass
from verl_driver import driver_check

from maspo_verl.config import MaspoConfig, MaspoConfigError, MaspoPolicyLossConfig, maspo_settings
from maspo_verl.segmentation import SEGMENTER_REGISTRY
from maspo_verl.segmentation.segmenters import FixedWindowParams, FSQDistanceParams

KEY = "actor_rollout_ref.actor.policy_loss.maspo"
TARGET = "actor_rollout_ref.actor.policy_loss._target_=maspo_verl.config.MaspoPolicyLossConfig"


def build_actor(*overrides, config_module="verl.trainer.config", config_name="ppo_trainer"):
    """veRL's own path: compose the Hydra config, then instantiate the actor config as the driver and worker do."""
    with initialize_config_module(config_module, version_base=None):
        config = compose(config_name, overrides=["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", *overrides])
    return omega_conf_to_dataclass(config.actor_rollout_ref.actor)


def test_hydra_overrides_reach_the_typed_config():
    actor = build_actor(
        TARGET,
        "actor_rollout_ref.actor.policy_loss.loss_mode=maspo",
        f"+{KEY}.segmenter.name=fsq",
        f"+{KEY}.segmenter.threshold=3",
        f"+{KEY}.segmenter.max_len=12",
        f"+{KEY}.gate=sapo",
    )
    settings = maspo_settings(actor.policy_loss)
    assert isinstance(actor.policy_loss, MaspoPolicyLossConfig)
    assert settings.segmenter.name == "fsq" and settings.segmenter.max_len == 12
    assert settings.segmenter.params == FSQDistanceParams(threshold=3.0, metric="l1")
    assert settings.gate == "sapo"


def test_shipped_config_extends_ppo_trainer():
    actor = build_actor(
        f"+{KEY}.segmenter.window=8",
        config_module="maspo_verl.trainer_config",
        config_name="maspo_trainer",
    )
    assert actor.policy_loss.loss_mode == "maspo"
    assert maspo_settings(actor.policy_loss).segmenter.params == FixedWindowParams(window=8)
    assert actor.ppo_epochs == 1  # everything else is veRL's ppo_trainer


def test_shipped_config_spells_out_exactly_the_typed_defaults():
    """maspo_trainer.yaml lists every key of MaspoConfig and CreditConfig (settable without `+`), at its default."""
    import dataclasses

    from maspo_verl.config import CodecConfig
    from maspo_verl.credit_config import CreditConfig

    with initialize_config_module("maspo_verl.trainer_config", version_base=None):
        config = compose("maspo_trainer")
    loss, credit = config.actor_rollout_ref.actor.policy_loss.maspo, config.algorithm.maspo
    names = {cls: {f.name for f in dataclasses.fields(cls)} for cls in (MaspoConfig, CreditConfig, CodecConfig)}
    assert set(loss) == names[MaspoConfig] and set(credit) == names[CreditConfig]
    assert set(loss.codec) == set(credit.codec) == names[CodecConfig]
    assert MaspoConfig.from_mapping(loss) == MaspoConfig.from_mapping({})
    assert CreditConfig.from_mapping(credit) == CreditConfig.from_mapping({})


def test_shipped_config_switches_segmenter_with_one_override():
    actor = build_actor(
        f"{KEY}.segmenter.name=fsq", config_module="maspo_verl.trainer_config", config_name="maspo_trainer"
    )
    assert maspo_settings(actor.policy_loss).segmenter.params == FSQDistanceParams()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (f"+{KEY}.segmenter.name=fsqq", rf"{KEY}.segmenter.name='fsqq' is not a registered segmenter; valid: \["),
        (f"+{KEY}.segmenter.windw=3", rf"{KEY}.segmenter: unknown key\(s\) \['windw'\].*'window'"),
        (f"+{KEY}.segmenter.window=abc", rf"{KEY}.segmenter.window must be an integer, got str"),
        (f"+{KEY}.segmenter.window=0", rf"{KEY}.segmenter.window: window must be >= 1, got 0"),
        (f"+{KEY}.clip_ratio_hi=0.3", rf"{KEY}: unknown key\(s\) \['clip_ratio_hi'\]; valid keys: \["),
        (f"+{KEY}.clip_ratio_low=1.5", rf"{KEY}.clip_ratio_low: clip_ratio_low must be in \[0, 1\)"),
        (f"+{KEY}.gate=soft", rf"{KEY}.gate='soft' is not valid; valid values: \['clip', 'sapo'\]"),
        (f"+{KEY}.loss_agg_mode=seg-sum", rf"{KEY}.loss_agg_mode: loss_agg_mode must be one of \[None, 'token-mean'"),
        (f"+{KEY}.clip_ratio_c=0.5", rf"{KEY}.clip_ratio_c: clip_ratio_c must be > 1 or null"),
        (f"+{KEY}.segmenter_modules=[no_such_module_xyz]", rf"{KEY}.segmenter_modules: cannot import 'no_such_module"),
        (f"+{KEY}.clip_ratio_high=nan", rf"{KEY}.clip_ratio_high must be a finite number, got nan"),
        (f"+{KEY}.ratio_length_exponent=nan", rf"{KEY}.ratio_length_exponent must be a finite number, got nan"),
        (f"+{KEY}.ratio_length_exponent=inf", rf"{KEY}.ratio_length_exponent must be a finite number, got inf"),
        (f"+{KEY}.ratio_length_exponent=1.5", rf"{KEY}.ratio_length_exponent: .* must be in \[0, 1\], got 1.5"),
        (f"+{KEY}.ratio_length_exponent=-0.5", rf"{KEY}.ratio_length_exponent: .* must be in \[0, 1\], got -0.5"),
        (f"+{KEY}.clip_length_exponent=nan", rf"{KEY}.clip_length_exponent must be a finite number, got nan"),
        (f"+{KEY}.log_ratio_clamp=inf", rf"{KEY}.log_ratio_clamp must be a finite number, got inf"),
        (f"+{KEY}.clip_ratio_c=-inf", rf"{KEY}.clip_ratio_c must be a finite number, got -inf"),
        (f"+{KEY}.segmenter.name=fsq +{KEY}.segmenter.threshold=nan", rf"{KEY}.segmenter.threshold must be a finite"),
        (f"+{KEY}.segmenter.name=logprob +{KEY}.segmenter.threshold=inf", rf"{KEY}.segmenter.threshold must be a fini"),
    ],
)
def test_bad_settings_fail_at_build_time_naming_the_key(override, message):
    with pytest.raises(Exception, match=message):
        build_actor(TARGET, "actor_rollout_ref.actor.policy_loss.loss_mode=maspo", *override.split(" "))


def test_min_len_and_max_len_must_be_compatible():
    with pytest.raises(MaspoConfigError, match=r"maspo.segmenter: min_len=4 needs max_len >= 2 \* min_len"):
        MaspoConfig.from_mapping({"segmenter": {"name": "fixed", "min_len": 4, "max_len": 6}})


def test_codec_layout_selects_the_speech_tokens_and_fsq_needs_a_lattice():
    from maspo_base.speech_tokens.layouts import LLASA_1B, MINI_LLASA

    mini = MaspoConfig.from_mapping({"segmenter": {"name": "fsq"}, "codec": {"layout": "mini-llasa"}})
    assert mini.codec.speech_tokens == MINI_LLASA and mini.codec.speech_tokens.fsq.levels == (4,) * 5
    moved = MaspoConfig.from_mapping({"codec": {"layout": "mini-llasa", "offset": 200}}).codec.speech_tokens
    assert (moved.offset, moved.codebook_size, moved.fsq_levels) == (200, 1024, (4,) * 5)
    assert MaspoConfig.from_mapping({"codec": {"codebook_size": 65536}}).codec.speech_tokens == LLASA_1B
    # another codebook size drops the lattice: the fsq segmenter is refused, naming the keys
    with pytest.raises(
        MaspoConfigError,
        match=rf"{KEY}.segmenter.name=fsq needs codes with FSQ digits, but {KEY}.codec \(layout 'llasa-1b', "
        r"codebook_size 1000\) has no FSQ lattice",
    ):
        MaspoConfig.from_mapping({"segmenter": {"name": "fsq"}, "codec": {"codebook_size": 1000}})
    assert MaspoConfig.from_mapping({"segmenter": {"name": "token_jump"}, "codec": {"codebook_size": 1000}})
    with pytest.raises(MaspoConfigError, match=rf"{KEY}.codec.layout: unknown layout 'llasa-8b'; registered: \["):
        MaspoConfig.from_mapping({"codec": {"layout": "llasa-8b"}})


def test_plain_policy_loss_config_uses_defaults():
    actor = build_actor("actor_rollout_ref.actor.policy_loss.loss_mode=maspo")
    assert maspo_settings(actor.policy_loss) == MaspoConfig.from_mapping({})


def test_custom_segmenter_from_a_user_module(tmp_path, monkeypatch):
    (tmp_path / "my_lab_segmenters.py").write_text(
        textwrap.dedent(
            """
            from dataclasses import dataclass
            import torch
            from maspo_verl import register_segmenter

            @dataclass
            class HalvesParams:
                parts: int = 2

            @register_segmenter("halves", params=HalvesParams)
            def halves(inputs, params):
                mask = inputs.response_mask
                length = mask.sum(-1, keepdim=True).clamp(min=1)
                position = torch.cumsum(mask.long(), -1) - 1
                return position * params.parts // length
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        actor = build_actor(
            TARGET,
            "actor_rollout_ref.actor.policy_loss.loss_mode=maspo",
            f"+{KEY}.segmenter_modules=[my_lab_segmenters]",
            f"+{KEY}.segmenter.name=halves",
            f"+{KEY}.segmenter.parts=4",
        )
        settings = maspo_settings(actor.policy_loss)
        assert settings.segmenter.params.parts == 4

        from loss_helpers import loss_and_grad, random_batch

        old, new, advantages, mask = random_batch(batch=1, width=8, lengths=[8])
        _, _, metrics = loss_and_grad("maspo", actor, old, new, advantages, mask)
        assert metrics["actor/maspo/segments_per_response"] == 4.0
        assert metrics["actor/maspo/mean_segment_length"] == 2.0
    finally:
        SEGMENTER_REGISTRY.pop("halves", None)


def test_bad_segmenter_fails_the_drivers_config_check_naming_the_key():
    """veRL's own driver check (`verl_driver.driver_check`) stops a run of maspo_trainer.yaml, with the key and what
    is valid in the message."""
    # veRL builds the loss's config with Hydra's instantiate, which wraps what the config raised
    with pytest.raises(
        InstantiationException, match=rf"{KEY}.segmenter.name='fsqq' is not a registered segmenter"
    ) as e:
        driver_check(
            f"{KEY}.segmenter.name=fsqq", config_module="maspo_verl.trainer_config", config_name="maspo_trainer"
        )
    assert isinstance(e.value.__cause__, MaspoConfigError)


def test_a_methods_bad_parameter_fails_the_drivers_config_check_naming_the_key():
    # a method of trainer_config/method/ with a segmenter parameter out of range, as `maspo-verl demo` and `ablate`
    # pass it to the driver
    from maspo_lab.runs.synthetic_run import method_overrides

    with pytest.raises(InstantiationException, match=rf"{KEY}.segmenter.window: window must be >= 1, got 0") as e:
        driver_check(*method_overrides("maspo-fixed4", f"{KEY}.segmenter.window=0"))
    assert isinstance(e.value.__cause__, MaspoConfigError)


def test_codec_offset_is_checked_against_a_llasa_tokenizer(tmp_path):
    from maspo_lab.data.tiny_llasa import build_tokenizer

    build_tokenizer().save_pretrained(tmp_path)
    settings = MaspoConfig.from_mapping({"segmenter": {"name": "fsq"}, "codec": {"tokenizer": str(tmp_path)}})
    assert settings.codec.offset is None  # the layout's: Llasa-1B's <|s_0|>
    assert settings.codec.speech_tokens.offset == 128264
    with pytest.raises(MaspoConfigError, match=rf"{KEY}.codec: .*maps <\|s_0\|> to id 128264, but codec.offset=128000"):
        MaspoConfig.from_mapping(
            {"segmenter": {"name": "fsq"}, "codec": {"tokenizer": str(tmp_path), "offset": 128_000}}
        )
