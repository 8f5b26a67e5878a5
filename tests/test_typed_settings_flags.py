"""A settings dataclass as command-line flags (`maspo_base.typed_settings.add_arguments` / `parse_arguments`): one
flag per field, typed by the field, the dataclass (or a given instance) the one home of the defaults."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Literal

import pytest
from help_text import help_entries

from maspo_base.typed_settings import (
    InvalidSetting,
    SettingsError,
    add_arguments,
    field_docs,
    parse_arguments,
    parse_arguments_or_exit,
)


@dataclass(frozen=True)
class Toy:
    """A settings class with one field of every kind a command uses."""

    steps: int = field(default=3, metadata={"help": "optimiser steps"})
    lr: float = 0.5
    """Peak learning rate."""
    lengths: tuple[int, ...] = field(default=(4, 8), metadata={"flag": "--length", "help": "segment lengths"})
    voices: tuple[str, ...] = field(default=("rms", "slt"), metadata={"nargs": "+", "help": "voices"})
    fast: bool = field(default=False, metadata={"help": "go fast"})
    check: bool = field(default=True, metadata={"help": "check the result"})
    dtype: Literal["float32", "float64"] = "float32"
    frontend: str = field(default="text", metadata={"choices": ("text", "espeak-ng:en-us")})
    limit: int | None = None
    hidden: int = 7

    def validate(self) -> None:
        if self.steps < 1:
            raise InvalidSetting("steps", f"steps must be >= 1, got {self.steps}")


def parser_of(**kwargs) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="toy")
    add_arguments(parser, Toy, skip=("hidden",), into=parser, **kwargs)
    return parser


def parsed(argv: list[str], defaults: Toy | None = None) -> Toy:
    return parse_arguments(parser_of(defaults=defaults).parse_args(argv), Toy, "toy", defaults=defaults)


def test_no_flag_gives_the_dataclass_defaults_and_every_flag_sets_its_field_by_its_type():
    assert parsed([]) == Toy()
    given = parsed(
        ["--steps", "5", "--lr", "0.25", "--length", "2, 3,", "--voices", "awb", "kal16", "--fast", "--no-check"]
        + ["--dtype", "float64", "--frontend", "espeak-ng:en-us", "--limit", "9"]
    )
    assert given == Toy(5, 0.25, (2, 3), ("awb", "kal16"), True, False, "float64", "espeak-ng:en-us", 9, 7)
    assert isinstance(given.lengths, tuple) and isinstance(given.lr, float)


def test_an_instance_of_defaults_fills_what_no_flag_gives_and_is_what_the_help_shows(capsys):
    base = Toy(steps=10, lengths=(1,))
    assert parsed(["--lr", "2"], defaults=base) == Toy(steps=10, lr=2.0, lengths=(1,))
    with pytest.raises(SystemExit):
        parser_of(defaults=base).parse_args(["--help"])
    lines = help_entries(capsys.readouterr().out)
    assert lines["--steps"].endswith("optimiser steps (default: 10)")
    assert lines["--length"].endswith("segment lengths (default: 1)")


def test_the_help_shows_each_default_as_typed_the_docstring_when_no_help_and_the_choices(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "400")
    with pytest.raises(SystemExit):
        parser_of().parse_args(["--help"])
    text = capsys.readouterr().out
    lines = help_entries(text)
    assert lines["--lr"].endswith("Peak learning rate (default: 0.5)")  # the field's docstring
    assert lines["--length"].endswith("(default: 4,8)") and lines["--voices"].endswith("(default: rms slt)")
    assert lines["--fast"].endswith("go fast") and lines["--check"].startswith("--check, --no-check")
    assert "--dtype {float32,float64}" in text and "--frontend {text,espeak-ng:en-us}" in text
    assert "--hidden" not in text and "(default: None)" not in text
    assert field_docs(Toy) == {"lr": "Peak learning rate."}


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--steps", "x"], "--steps must be an integer, got 'x'"),
        (["--length", "1,x"], "--length takes comma-separated items, each an integer, got '1,x'"),
        (["--lr", "nan"], "--lr must be a finite number, got nan"),
        (["--dtype", "float16"], r"--dtype='float16' is not valid; valid values: \['float32', 'float64'\]"),
        (["--frontend", "ipa"], r"--frontend must be one of \['text', 'espeak-ng:en-us'\], got 'ipa'"),
        (["--steps", "0"], "--steps: steps must be >= 1, got 0"),
    ],
)
def test_a_bad_value_is_refused_naming_the_flag(argv, message):
    with pytest.raises(SettingsError, match=message):
        parsed(argv)


@dataclass(frozen=True)
class SelfChecked:
    """A settings class that checks a value in ``__post_init__`` (a plain ``ValueError``)."""

    rate: float = 0.5

    def __post_init__(self):
        if not 0 <= self.rate < 1:
            raise ValueError(f"SelfChecked.rate must be in [0, 1), got {self.rate}")


@pytest.mark.parametrize(
    "cls,argv,message",
    [
        (Toy, ["--steps", "0"], "--steps: steps must be >= 1, got 0"),
        (SelfChecked, ["--rate", "2"], "SelfChecked.rate must be in [0, 1), got 2.0"),
    ],
)
def test_a_command_reports_a_bad_value_through_its_parser_and_exits_2(cls, argv, message, capsys):
    parser = argparse.ArgumentParser(prog="toy")
    add_arguments(parser, cls, into=parser)
    with pytest.raises(SystemExit) as exited:
        parse_arguments_or_exit(parser, parser.parse_args(argv), cls, "toy")
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: toy") and f"toy: error: {message}\n" in err
    assert parse_arguments_or_exit(parser, parser.parse_args([]), cls, "toy") == cls()
