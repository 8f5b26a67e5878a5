"""The reward's settings: one list, every float rejects NaN and infinities naming its key, CLI flags included."""

import dataclasses
import re
import typing

import pytest

from maspo_base.typed_settings import SettingsError, build
from reward_fns import reward_settings
from reward_fns.http_server import main
from reward_fns.reward import RewardConfig

ALL = (*reward_settings.SERVER_SETTINGS, *reward_settings.REMOTE_SETTINGS)


def float_fields(cls):
    hints = typing.get_type_hints(cls)
    return [f.name for f in dataclasses.fields(cls) if hints[f.name] in (float, float | None)]


@pytest.mark.parametrize("cls", [*ALL, RewardConfig], ids=lambda c: c.__name__)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_every_float_setting_rejects_nan_and_infinities_naming_the_key(cls, bad):
    names = float_fields(cls)
    assert names or cls is reward_settings.ModelSettings  # integers only (RewardConfig has its own case)
    for name in names:
        with pytest.raises(SettingsError, match=rf"key\.{name} must be a finite number"):
            build(cls, {name: bad}, "key")


def test_rate_bounds_and_directly_built_configs_reject_non_finite_values():
    with pytest.raises(SettingsError, match=r"reward_config.rate_bounds.word\[0\] must be a finite number"):
        RewardConfig.from_dict({"rate_bounds": {"word": [float("nan"), 3.0]}})
    with pytest.raises(SettingsError, match="reward_config.invalid_score: invalid_score must be a finite number"):
        RewardConfig(invalid_score=float("-inf"))  # built in code, not from a mapping


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--max-wait-ms", "nan"], "--max-wait-ms must be a finite number, got nan"),
        (["--request-timeout-s", "inf"], "--request-timeout-s must be a finite number, got inf"),
        (["--reward-config", '{"cer_scale": NaN}'], "--reward-config.cer_scale must be a finite number"),
        (["--max-codes", "1e3"], "--max-codes must be an integer, got '1e3'"),
        (["--max-body-mb", "0"], "--max-body-mb: max_body_mb must be > 0"),
        (["--dtype", "float16"], r"--dtype='float16' is not valid; valid values: \['float32', 'bfloat16'\]"),
    ],
)
def test_server_flags_reject_bad_values_naming_the_flag_and_exit_2(tmp_path, capsys, flags, message):
    assert main(["--codec", str(tmp_path), "--asr", "zh=paraformer", *flags]) == 2
    assert re.search(message, capsys.readouterr().err)
