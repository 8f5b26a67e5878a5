"""Typed settings: a dataclass filled from a plain mapping (a Hydra block, CLI flags, an HTTP request), checked.

`build` converts a mapping into an instance of a settings dataclass: unknown keys, wrong types (from the field's
type hint: ``int``, ``float``, ``str``, ``bool``, ``Literal``, ``X | None``, ``list[X]``, nested dataclasses) and
non-finite numbers (NaN and infinities are never valid settings) are rejected, then the dataclass's own ``validate()``
checks ranges and raises `InvalidSetting` naming the field. Every error is a `SettingsError` that names the full key
(``actor_rollout_ref.actor.policy_loss.maspo.clip_ratio_high``) and what would be valid.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import json
import math
import textwrap
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
        items = [coerce(v, item, f"{key}[{i}]", error) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
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
#
# A field's flag is ``--field-name`` (``metadata["flag"]`` renames it); its help is ``metadata["help"]``, else the
# field's docstring, then its default. Its value follows the field's type: a number or a string; ``bool``: a switch
# (``--flag``; ``--flag``/``--no-flag`` when the default is true); ``Literal``: one of its values; ``list``/``tuple``:
# comma-separated items (``metadata["nargs"]``, argparse's: separate words instead). ``metadata["cli"]``: ``"json"``
# (a JSON value) or ``"append"`` (repeatable, joined by ``;``); ``metadata["choices"]``: the values a string may take
# (a registry's names); ``metadata["metavar"]``: its placeholder in the help.


MAX_LISTED_CHOICES = 40
"""A flag's values are its placeholder in the help (``{float32,float64}``) when they fit in this many characters."""


def _flag(f: dataclasses.Field) -> str:
    return f.metadata.get("flag", "--" + f.name.replace("_", "-"))


def _bare(hint: Any) -> Any:
    """``X | None`` -> ``X`` (a command line holds no None)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        return options[0] if len(options) == 1 else hint
    return hint


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The string literal written under each field of a dataclass (its base classes' too), whitespace collapsed, by
    field name; none where the source cannot be read."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        except (OSError, TypeError, SyntaxError, IndexError, AttributeError):
            continue
        for node, after in zip(body, body[1:]):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _choices(f: dataclasses.Field, hint: Any) -> tuple | None:
    if typing.get_origin(hint) is Literal:
        return typing.get_args(hint)
    return tuple(f.metadata["choices"]) if "choices" in f.metadata else None


def _shown(value: Any, f: dataclasses.Field) -> str:
    """A default as the user would type it; "" for none worth showing (None, a switch, a mapping, a dataclass)."""
    if value is None or isinstance(value, bool | Mapping) or dataclasses.is_dataclass(value):
        return ""
    if isinstance(value, list | tuple):
        if f.metadata.get("cli") == "json":
            return json.dumps(list(value))
        return (" " if "nargs" in f.metadata else ",").join(map(str, value))
    return str(value)


def _argument(f: dataclasses.Field, hint: Any, default: Any, help_text: str, required: bool) -> dict[str, Any]:
    """argparse's keywords for the flag of field ``f`` (type ``hint``, None stripped; ``default``: the value shown)."""
    shown = "" if required else _shown(default, f)
    if shown:
        sentence = help_text.endswith(".") and not help_text.endswith("..")  # a docstring's full stop, not "..."
        help_text = f"{help_text[:-1] if sentence else help_text} (default: {shown})".lstrip()
    kwargs: dict[str, Any] = {"dest": f.name, "help": help_text, "default": None}
    if hint is bool:
        kwargs["action"] = argparse.BooleanOptionalAction if default else "store_true"
        return kwargs
    listed = "{" + ",".join(map(str, _choices(f, hint) or ())) + "}"
    named = _flag(f).lstrip("-").replace("-", "_").upper()
    kwargs["metavar"] = f.metadata.get("metavar", listed if 2 < len(listed) <= MAX_LISTED_CHOICES else named)
    if f.metadata.get("cli") == "append":
        kwargs["action"] = "append"
    if "nargs" in f.metadata:
        kwargs["nargs"] = f.metadata["nargs"]
    if required:
        kwargs["required"] = True
    return kwargs


def add_arguments(
    parser: argparse.ArgumentParser,
    cls: type,
    required: tuple[str, ...] = (),
    skip: tuple[str, ...] = (),
    defaults: Any = None,
    into: Any = None,
) -> None:
    """One flag per field of ``cls`` but those in ``skip`` (see above); ``required``: flags that must be given. The
    values stay as typed until `parse_arguments` converts them and builds the settings, so a default and a range
    have one home: the dataclass, or ``defaults`` (an instance; the help shows its values, as `parse_arguments`
    takes them). The flags go into ``into`` (the parser itself, or a group of it), else a new group named after
    the class."""
    group = into or parser.add_argument_group(cls.__name__.removesuffix("Settings").lower(), cls.__doc__)
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        if defaults is not None:
            default = getattr(defaults, f.name)
        else:
            default = f.default if f.default is not dataclasses.MISSING else None
        help_text = f.metadata.get("help", docs.get(f.name, ""))
        group.add_argument(_flag(f), **_argument(f, _bare(hints[f.name]), default, help_text, f.name in required))


def parse_arguments(args: argparse.Namespace, cls: type[T], command: str, defaults: T | None = None) -> T:
    """The settings of ``cls`` from the flags `add_arguments` added: each flag given, converted by its field's type,
    over ``defaults`` (an instance; None: the dataclass's defaults), then `build`; a field without a flag on
    ``args`` keeps its default. An error names the flag the user typed (``command``: the command, in the message)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    values = {name: getattr(defaults, name) for name in fields} if defaults is not None else {}
    for name, f in fields.items():
        raw = getattr(args, name, None)
        if raw is None:
            continue
        try:
            values[name] = _from_cli(raw, f, _bare(hints[name]))
        except ValueError as exc:
            raise SettingsError(f"{_flag(f)} {exc}") from None
    try:
        return build(cls, values, command)
    except SettingsError as exc:
        message = str(exc)
        for name, f in fields.items():  # name the flag the user typed
            message = message.replace(f"{command}.{name}", _flag(f))
        raise SettingsError(message) from None


def parse_arguments_or_exit(
    parser: argparse.ArgumentParser, args: argparse.Namespace, cls: type[T], command: str, defaults: T | None = None
) -> T:
    """`parse_arguments`, a bad value reported through ``parser`` as argparse reports a bad flag: the usage, then the
    message naming the flag, exit status 2. A ``ValueError`` a settings class raises itself (``__post_init__``) is
    reported the same way."""
    try:
        return parse_arguments(args, cls, command, defaults)
    except ValueError as error:  # a SettingsError names the flag
        parser.error(str(error))


def _from_cli(raw: Any, f: dataclasses.Field, hint: Any) -> Any:
    """A flag's value (a string, a list of strings, a bool) as the field's type wants it; ``ValueError`` saying what
    was expected, after the flag's name."""
    cli = f.metadata.get("cli")
    if cli == "append":
        return ";".join(raw)
    if cli == "json":
        try:
            return json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"is not JSON ({exc}): {raw!r}") from None
    if "choices" in f.metadata and raw not in f.metadata["choices"]:
        raise ValueError(f"must be one of {list(f.metadata['choices'])}, got {raw!r}")
    if typing.get_origin(hint) in (list, tuple):
        words = isinstance(raw, list)
        items = raw if words else [item.strip() for item in raw.split(",") if item.strip()]
        try:
            return [_scalar(item, (typing.get_args(hint) or (str,))[0]) for item in items]
        except ValueError as exc:
            raise ValueError(f"takes {'' if words else 'comma-separated '}items, each {exc}, got {raw!r}") from None
    try:
        return _scalar(raw, hint)
    except ValueError as exc:
        raise ValueError(f"must be {exc}, got {raw!r}") from None


def _scalar(raw: Any, hint: Any) -> Any:
    """A string as ``hint`` (int, float; anything else unchanged); ``ValueError`` naming what was expected. 'nan' and
    'inf' parse as floats here and are rejected by `build`."""
    for kind, convert, what in ((int, int, "an integer"), (float, float, "a number")):
        if hint is kind and isinstance(raw, str):
            try:
                return convert(raw)
            except ValueError:
                raise ValueError(what) from None
    return raw
