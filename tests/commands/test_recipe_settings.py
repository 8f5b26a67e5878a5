"""``maspo-verl recipe-settings``: what the recipes read, printed from each fact's one home."""

from __future__ import annotations

import json

import pytest

from maspo_base.speech_tokens import llasa_tokens as lt
from maspo_base.speech_tokens import mini_llasa_tokens as mt
from maspo_lab.cli import main
from maspo_lab.runs.cpu_overrides import CPU_NEEDS, CPU_OVERRIDES, cpu_environment
from maspo_lab.speaking_model.model import ModelSize, build_model, build_tokenizer


def lines(capsys, *argv: str) -> list[str]:
    assert main(["recipe-settings", *argv]) == 0
    return capsys.readouterr().out.splitlines()


def test_cpu_settings_are_the_run_toolings(capsys):
    assert lines(capsys, "cpu-overrides") == list(CPU_OVERRIDES)
    needed = lines(capsys, "cpu-overrides", "--needed")
    assert needed == list(CPU_NEEDS) and set(needed) < set(CPU_OVERRIDES)
    assert dict(line.split("=", 1) for line in lines(capsys, "cpu-env")) == cpu_environment()


def test_stop_config_writes_the_one_stop_rules_ids(tmp_path, capsys):
    size = ModelSize(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=2, intermediate_size=64, max_positions=64)
    model = build_model(tmp_path / "model", size, seed=0)
    config = model / "generation_config.json"
    eot = build_tokenizer().convert_tokens_to_ids(mt.EOT)
    config.write_text(json.dumps({**json.loads(config.read_text()), "eos_token_id": [eot]}))
    assert lines(capsys, "stop-config", str(model), str(tmp_path / "stop")) == [str(tmp_path / "stop")]
    written = json.loads((tmp_path / "stop" / "generation_config.json").read_text())
    end = build_tokenizer().convert_tokens_to_ids(lt.SPEECH_GENERATION_END)
    assert written["eos_token_id"] == [eot, end]  # the checkpoint's own end, then the end tag


def test_mini_overrides_refuse_an_unknown_method_before_writing_data(tmp_path):
    with pytest.raises(SystemExit, match="no-such-method"):
        main(["recipe-settings", "mini-overrides", str(tmp_path), "no-such-method"])
    assert not any(tmp_path.iterdir())


def test_an_unknown_setting_is_refused_naming_the_valid_ones(capsys):
    with pytest.raises(SystemExit):
        main(["recipe-settings", "gpu-env"])
    assert "cpu-env" in capsys.readouterr().err


def test_tiny_overrides_name_the_synthetic_task_under_the_workdir_and_a_dry_run_builds_nothing(tmp_path, capsys):
    from maspo_lab.runs.synthetic_run import task_paths

    paths = task_paths(tmp_path / "tiny")
    assert lines(capsys, "tiny-overrides", str(tmp_path / "tiny"), "--no-build") == [
        "scale=tiny",
        f"data.train_files={paths.train}",
        f"data.val_files={paths.val}",
        f"actor_rollout_ref.model.path={paths.model}",
    ]
    assert not (tmp_path / "tiny").exists()
    with pytest.raises(SystemExit, match="--warm-start must be >= 0"):
        main(["recipe-settings", "tiny-overrides", str(tmp_path), "--warm-start", "-1"])


def test_tiny_overrides_build_the_task_once(tmp_path, capsys):
    from maspo_lab.runs.synthetic_run import task_paths

    lines(capsys, "tiny-overrides", str(tmp_path))
    config = task_paths(tmp_path).model / "config.json"
    assert config.exists() and task_paths(tmp_path).train.exists() and task_paths(tmp_path).val.exists()
    built = config.stat().st_mtime_ns
    lines(capsys, "tiny-overrides", str(tmp_path))
    assert config.stat().st_mtime_ns == built  # found, not built again
