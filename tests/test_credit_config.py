"""algorithm.maspo (adv_estimator=maspo) is checked in the driver before Ray: errors name the key and what is valid."""

import pytest
from hydra import compose, initialize_config_module
from verl_driver import driver_check

from maspo_verl.config import MaspoConfigError
from maspo_verl.credit_config import CreditConfig, credit_settings, validate_algorithm_config

KEY = "algorithm.maspo"


def compose_config(*overrides):
    with initialize_config_module("verl.trainer.config", version_base=None):
        return compose("ppo_trainer", overrides=list(overrides))


def test_overrides_reach_the_typed_settings():
    config = compose_config(
        "algorithm.adv_estimator=maspo", f"+{KEY}.credit_weight=2", f"+{KEY}.error_key=heard", f"+{KEY}.codec.offset=7"
    )
    settings = credit_settings(config.algorithm)
    assert settings == CreditConfig(credit_weight=2.0, error_key="heard", codec=settings.codec)
    assert settings.codec.offset == 7 and isinstance(settings.credit_weight, float)
    assert settings.codec.speech_tokens.offset == 7 and settings.codec.speech_tokens.name == "llasa-1b"
    assert credit_settings(compose_config().algorithm) == CreditConfig.from_mapping({})


def test_the_codec_layout_says_which_response_tokens_are_frames():
    from maspo_base.speech_tokens.layouts import MINI_LLASA

    config = compose_config("algorithm.adv_estimator=maspo", f"+{KEY}.codec.layout=mini-llasa")
    assert credit_settings(config.algorithm).codec.speech_tokens == MINI_LLASA
    with pytest.raises(MaspoConfigError, match=rf"{KEY}.codec.layout: unknown layout 'mini'; registered: \["):
        credit_settings(compose_config("algorithm.adv_estimator=maspo", f"+{KEY}.codec.layout=mini").algorithm)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            f"+{KEY}.credit_wieght=1",
            rf"{KEY}: unknown key\(s\) \['credit_wieght'\]; "
            rf"valid keys: \['codec', 'credit_mode', 'credit_source', 'credit_weight', 'error_key'\]",
        ),
        (f"+{KEY}.credit_weight=abc", rf"{KEY}.credit_weight must be a number, got str"),
        (f"+{KEY}.credit_weight=true", rf"{KEY}.credit_weight must be a number, got bool"),
        (f"+{KEY}.credit_weight=nan", rf"{KEY}.credit_weight must be a finite number, got nan"),
        (f"+{KEY}.credit_weight=inf", rf"{KEY}.credit_weight must be a finite number, got inf"),
        (f"+{KEY}.credit_weight=-0.5", rf"{KEY}.credit_weight: credit_weight must be >= 0, got -0.5"),
        (f"+{KEY}.error_key=''", rf"{KEY}.error_key: error_key must be a non-empty string"),
        (f"+{KEY}.codec.offst=1", rf"{KEY}.codec: unknown key\(s\) \['offst'\]; valid keys: \['codebook_size'"),
        (f"+{KEY}=5", rf"{KEY} must be a mapping, got int"),
        (
            f"+{KEY}.credit_source=words",
            rf"{KEY}.credit_source='words' is not valid; valid values: \['errors', 'likelihood'\]",
        ),
    ],
)
def test_bad_settings_name_the_key(override, message):
    config = compose_config("algorithm.adv_estimator=maspo", override)
    with pytest.raises(MaspoConfigError, match=message):
        validate_algorithm_config(config)


def test_credit_source_selects_the_reward_extra_unless_error_key_names_one():
    assert CreditConfig().error_key == "frame_errors"
    assert CreditConfig(credit_source="likelihood").error_key == "frame_likelihood"
    assert CreditConfig(credit_source="likelihood", error_key="heard").error_key == "heard"


def test_other_estimators_without_a_block_are_not_checked():
    validate_algorithm_config(compose_config("algorithm.adv_estimator=grpo"))


def test_bad_setting_fails_the_drivers_config_check_naming_the_key():
    """veRL's own driver check (`verl_driver.driver_check`) stops the run, naming the key and what is valid."""
    with pytest.raises(MaspoConfigError, match=rf"{KEY}.credit_weight: credit_weight must be >= 0, got -1.0"):
        driver_check("algorithm.adv_estimator=maspo", f"+{KEY}.credit_weight=-1")
