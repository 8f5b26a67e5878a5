"""The commands whose flags are a settings class's fields (`maspo_base.typed_settings.add_arguments`): with no flag
the settings are the class's defaults (the task's, for ``fidelity``), each flag sets its field, and ``--help`` shows
every default. Parsing only: no model is loaded, nothing is trained."""

from __future__ import annotations

import dataclasses

import pytest
from help_text import help_entries

from maspo_lab.analysis.fidelity import FidelitySettings
from maspo_lab.commands import build_codec, build_model, fidelity, prepare_data
from maspo_lab.commands import eval as eval_command
from maspo_lab.data.prepare import Limits
from maspo_lab.speaking_model.codec_training import CodecSettings
from maspo_lab.speaking_model.model import ModelSize
from maspo_lab.speaking_model.training import TrainSettings

FIDELITY_FLAGS = {
    "--updates": ("0,2", "updates", (0, 2)),
    "--estimators": ("grpo, gspo", "estimators", ("grpo", "gspo")),
    "--repeats": ("2", "repeats", 2),
    "--batch": ("4", "batch", 4),
    "--n": ("3", "n", 3),
    "--mini-batches": ("2", "mini_batches", 2),
    "--lr": ("0.01", "lr", 0.01),
    "--temperature": ("0.5", "temperature", 0.5),
    "--response-length": ("9", "response_length", 9),
    "--reference-groups": ("0", "reference_groups", 0),
    "--micro-batch": ("3", "micro_batch", 3),
    "--score-batch": ("5", "score_batch", 5),
    "--vocabulary-gradient": (None, "vocabulary_gradient", True),
    "--target-length": ("3,5", "target_lengths", (3, 5)),
    "--window-lengths": ("1,2", "window_lengths", (1, 2)),
    "--max-lag": ("7", "max_lag", 7),
    "--device": ("cuda:1", "device", "cuda:1"),
    "--dtype": ("float64", "dtype", "float64"),
    "--seed": ("4", "seed", 4),
}
CODEC_FLAGS = {
    "--steps": ("7", "steps", 7),
    "--batch": ("3", "batch", 3),
    "--lr": ("0.5", "lr", 0.5),
    "--channels": ("9", "channels", 9),
    "--levels": ("3,5", "levels", (3, 5)),
    "--voices": (["a", "b"], "voices", ("a", "b")),
    "--seed": ("2", "seed", 2),
}
TRAIN_FLAGS = {
    "--steps": ("5", "steps", 5),
    "--tokens-per-batch": ("8", "tokens_per_batch", 8),
    "--lr": ("0.1", "lr", 0.1),
    "--eval-every": ("2", "eval_every", 2),
    "--seed": ("3", "seed", 3),
    "--voices": (["rms"], "voices", ("rms",)),
    "--text-frontend": ("text", "text_frontend", "text"),
    "--dropout": ("0.2", "dropout", 0.2),
    "--device": ("cuda:1", "device", "cuda:1"),
    "--max-minutes": ("1.5", "max_minutes", 1.5),
}
SIZE_FLAGS = {
    "--hidden-size": ("64", "hidden_size", 64),
    "--layers": ("2", "num_layers", 2),
    "--heads": ("2", "num_heads", 2),
    "--intermediate-size": ("9", "intermediate_size", 9),
}
LIMIT_FLAGS = {
    "--min-chars": ("2", "min_chars", 2),
    "--max-chars": ("9", "max_chars", 9),
    "--max-prompt-seconds": ("3.5", "max_prompt_seconds", 3.5),
    "--max-prompt-tokens": ("40", "max_prompt_tokens", 40),
}
MODEL_ARGV = ["--out", "o", "--corpus", "c", "--codec", "k"]
COMMANDS = {  # name: (command, argv it needs, its settings, their defaults, flags, fields without a flag)
    "fidelity-speech": (
        fidelity,
        [],
        lambda args: args.settings,
        FidelitySettings.for_task("speech"),
        FIDELITY_FLAGS,
        {"task", "extra"},
    ),
    "fidelity-synthetic": (
        fidelity,
        ["--task", "synthetic"],
        lambda args: args.settings,
        FidelitySettings.for_task("synthetic"),
        FIDELITY_FLAGS,
        {"task", "extra"},
    ),
    "build-codec": (
        build_codec,
        ["--corpus", "c", "--out", "o"],
        lambda args: args.settings,
        CodecSettings(),
        CODEC_FLAGS,
        {"crop_frames", "threads"},
    ),
    "build-model": (
        build_model,
        MODEL_ARGV,
        lambda args: args.settings,
        TrainSettings(),
        TRAIN_FLAGS,
        {"warmup_steps", "weight_decay", "threads"},
    ),
    "build-model-size": (
        build_model,
        MODEL_ARGV,
        lambda args: args.size,
        ModelSize(),
        SIZE_FLAGS,
        {"num_kv_heads", "max_positions"},
    ),
    "prepare-data": (prepare_data, ["x.txt", "--out", "o"], lambda args: args.limits, Limits(), LIMIT_FLAGS, set()),
}


def command_line(flags: dict) -> list[str]:
    argv = []
    for flag, (value, _, _) in flags.items():
        argv += [flag] + ([] if value is None else value if isinstance(value, list) else [value])
    return argv


@pytest.mark.parametrize("name", COMMANDS)
def test_no_flag_gives_the_defaults_and_each_flag_sets_its_field(name):
    command, argv, settings_of, defaults, flags, unflagged = COMMANDS[name]
    fields = {f.name for f in dataclasses.fields(defaults)}
    assert {field for _, field, _ in flags.values()} == fields - unflagged  # every flag is checked here
    assert settings_of(command.parse_args(argv)) == defaults
    given = settings_of(command.parse_args([*argv, *command_line(flags)]))
    for flag, (_, field, expected) in flags.items():
        assert getattr(given, field) == expected, flag
    assert all(getattr(given, name) == getattr(defaults, name) for name in unflagged - {"num_kv_heads"})


@pytest.mark.parametrize("name", COMMANDS)
def test_the_help_shows_every_default(name, monkeypatch, capsys):
    command, argv, _, defaults, flags, _ = COMMANDS[name]
    monkeypatch.setenv("COLUMNS", "1000")  # one line per entry
    with pytest.raises(SystemExit):
        command.parse_args([*argv, "--help"])
    entries = help_entries(capsys.readouterr().out)
    for flag, (_, field, _) in flags.items():
        value = getattr(defaults, field)
        if isinstance(value, tuple):
            value = (" " if field == "voices" else ",").join(map(str, value))
        if value is None or isinstance(value, bool):
            assert f"(default: {value})" not in entries[flag], flag
        else:
            assert entries[flag].endswith(f"(default: {value})"), (flag, entries[flag])


def test_the_command_specific_defaults_and_checks():
    assert build_model.parse_args([*MODEL_ARGV, "--heads", "2", "--hidden-size", "64"]).size.num_kv_heads == 2
    long_texts = fidelity.parse_args(["--task", "synthetic", "--long-texts"]).settings
    assert long_texts.response_length == 4 * FidelitySettings.for_task("synthetic").response_length
    assert (
        fidelity.parse_args(["--task", "synthetic", "--long-texts", "--response-length", "5"]).settings.response_length
        == 5
    )


@pytest.mark.parametrize(
    "command,argv,message",
    [
        (
            fidelity,
            ["--task", "synthetic", "--updates", "1,x"],
            "--updates takes comma-separated items, each an integer",
        ),
        (fidelity, ["--task", "synthetic", "--repeats", "0"], "--repeats must be >= 1, got 0"),
        (fidelity, ["--task", "synthetic", "--dtype", "float16"], "--dtype='float16' is not valid"),
        (build_codec, ["--corpus", "c", "--out", "o", "--levels", "4,1"], "every FSQ level must be >= 2"),
        (build_model, [*MODEL_ARGV, "--text-frontend", "ipa"], "--text-frontend must be one of"),
        (build_model, [*MODEL_ARGV, "--hidden-size", "10", "--heads", "4"], "must be a multiple of --heads 4"),
        (prepare_data, ["x.txt", "--out", "o", "--max-chars", "many"], "--max-chars must be an integer"),
        (  # before any model loads
            eval_command,
            ["--checkpoint", "c", "--list", "l", "--codec", "k", "--asr", "en=x", "--out", "o", "--temperature", "0"],
            "--temperature: temperature must be > 0, got 0.0",
        ),
    ],
)
def test_a_bad_value_stops_the_command_naming_the_flag(command, argv, message, capsys):
    with pytest.raises(SystemExit):
        command.parse_args(argv)
    assert message in capsys.readouterr().err
