"""Typed settings: a dataclass filled from a plain mapping (a Hydra block, CLI flags, an HTTP request), checked.

`build` converts a mapping into an instance of a settings dataclass: unknown keys, wrong types (from the field's
type hint: ``int``, ``float``, ``str``, ``bool``, ``Literal``, ``X | None``, ``list[X]``, nested dataclasses) and
non-finite numbers (NaN and infinities are never valid settings) are rejected, then the dataclass's own ``validate()``
checks ranges and raises `InvalidSetting` naming the field. Every error is a `SettingsError` that names the full key
(``actor_rollout_ref.actor.policy_loss.maspo.clip_ratio_high``) and what would be valid.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar

T = TypeVar("T")


class SettingsError(ValueError):
    """A setting is unknown, mistyped or out of range; the message names the full key."""


class InvalidSetting(ValueError):
    """Raised by a settings dataclass's ``validate()``: ``field`` names the offending field ("" for the whole block).

    ``message`` is the whole sentence the user reads after the key (``"window must be >= 1, got 0"``)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


def to_plain(values: Any) -> Any:
    """OmegaConf containers and mappings -> dicts and lists (resolved), anything else unchanged."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(values, DictConfig | ListConfig):
            return OmegaConf.to_container(values, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf ships with veRL
        pass
    if isinstance(values, Mapping):
        return {str(k): to_plain(v) for k, v in values.items()}
    if isinstance(values, list | tuple):
        return [to_plain(v) for v in values]
    return values


def build(
    cls: type[T], values: Any, key: str, skip: tuple[str, ...] = (), error: type[SettingsError] = SettingsError
) -> T:
    """An instance of dataclass ``cls`` from ``values`` (a mapping; None = all defaults), checked and validated.

    ``skip``: fields left at their defaults (the caller fills them); ``error``: the `SettingsError` subclass raised.
    """
    values = to_plain(values) if values is not None else {}
    if not isinstance(values, dict):
        raise error(f"{key} must be a mapping, got {type(values).__name__}: {values!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.name not in skip]
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise error(f"{key}: unknown key(s) {unknown}; valid keys: {sorted(names)}")
    converted = {name: coerce(values[name], hints[name], f"{key}.{name}", error) for name in names if name in values}
    instance = cls(**converted)
    validate(instance, key, error)
    return instance


def validate(instance: Any, key: str, error: type[SettingsError] = SettingsError) -> None:
    """Run ``instance.validate()`` (if any); an `InvalidSetting` becomes ``error`` naming ``key.<field>``."""
    check = getattr(instance, "validate", None)
    if check is None:
        return
    try:
        check()
    except InvalidSetting as problem:
        where = f"{key}.{problem.field}" if problem.field else key
        raise error(f"{where}: {problem.message}") from problem
    except SettingsError:
        raise
    except ValueError as problem:  # a user's validate() that does not name its field
        raise error(f"{key}: {problem}") from problem


def coerce(value: Any, hint: Any, key: str, error: type[SettingsError] = SettingsError) -> Any:
    """Check ``value`` against a type hint and return it converted (ints to float for float fields)."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        errors = []
        for option in options:
            try:
                return coerce(value, option, key, error)
            except SettingsError as problem:
                errors.append(str(problem))
        raise error(errors[0] if len(errors) == 1 else f"{key}: {value!r} matches none of {hint}")
    if origin is Literal:
        if value not in args:
            raise error(f"{key}={value!r} is not valid; valid values: {list(args)}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise error(f"{key} must be a list, got {type(value).__name__}: {value!r}")
        item = args[0] if args else Any
        return [coerce(v, item, f"{key}[{i}]", error) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise error(f"{key} must be a mapping, got {type(value).__name__}: {value!r}")
        item = args[1] if len(args) == 2 else Any
        return {str(k): coerce(v, item, f"{key}.{k}", error) for k, v in value.items()}
    if hint is Any:
        return value
    if dataclasses.is_dataclass(hint):
        return value if isinstance(value, hint) else build(hint, value, key, error=error)
    if hint is bool:
        if not isinstance(value, bool):
            raise error(f"{key} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise error(f"{key} must be an integer, got {type(value).__name__}: {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise error(f"{key} must be a number, got {type(value).__name__}: {value!r}")
        if not math.isfinite(value):
            raise error(f"{key} must be a finite number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise error(f"{key} must be a string, got {type(value).__name__}: {value!r}")
        return value
    raise error(f"{key}: unsupported setting type {hint}")


# ----------------------------------------------------------------------------------------------------------------
# The same settings as command-line flags


def _flag(f: dataclasses.Field) -> str:
    return f.metadata.get("flag", "--" + f.name.replace("_", "-"))


def add_arguments(parser: argparse.ArgumentParser, cls: type, required: tuple[str, ...] = ()) -> None:
    """One flag per field of ``cls``, named ``--field-name`` unless its metadata says ``flag``, its help from the
    metadata's ``help`` (values stay strings/None: `parse_arguments` types them through `build`, so a default and a
    range have one home, the dataclass)."""
    group = parser.add_argument_group(cls.__name__.removesuffix("Settings").lower(), cls.__doc__)
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else None
        shown = "" if f.name in required or default is None else f" (default: {default})"
        kwargs: dict[str, Any] = {"dest": f.name, "help": f.metadata.get("help", "") + shown, "default": None}
        if f.metadata.get("cli") == "append":
            kwargs.update(action="append", metavar=f.metadata.get("metavar"))
        if f.name in required:
            kwargs["required"] = True
        group.add_argument(_flag(f), **kwargs)


def parse_arguments(args: argparse.Namespace, cls: type[T], command: str) -> T:
    """The settings of ``cls`` from flags `add_arguments` added: strings converted by the field's type, then
    `build`; an error names the flag the user typed (``command``: the command, in the message)."""
    hints = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for name, f in hints.items():
        raw = getattr(args, name)
        if raw is None:
            continue
        flag = _flag(f)
        try:
            values[name] = _from_cli(raw, f)
        except ValueError as exc:
            raise SettingsError(f"{flag} {exc}") from None
    try:
        return build(cls, values, command)
    except SettingsError as exc:
        message = str(exc)
        for name, f in hints.items():  # name the flag the user typed
            message = message.replace(f"{command}.{name}", _flag(f))
        raise SettingsError(message) from None


def _from_cli(raw: Any, f: dataclasses.Field) -> Any:
    cli = f.metadata.get("cli")
    if cli == "append":
        return ";".join(raw)
    if cli == "json":
        try:
            return json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"is not JSON ({exc}): {raw!r}") from None
    kind = f.type if isinstance(f.type, str) else str(f.type)
    for prefix, convert, what in (("int", int, "an integer"), ("float", float, "a number")):
        if kind.startswith(prefix):
            try:
                return convert(raw)  # 'nan' and 'inf' parse as floats here and are rejected by build
            except ValueError:
                raise ValueError(f"must be {what}, got {raw!r}") from None
    return raw
