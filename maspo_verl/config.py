"""Typed MASPO settings, validated when veRL builds its config.

veRL rejects unknown keys under ``actor_rollout_ref.actor.policy_loss``, so MASPO's settings ride in a nested block
of a `PolicyLossConfig` subclass chosen with ``_target_``. Hydra hands that block over as a plain dict; it is
converted and checked here (unknown keys, types, ranges, segmenter names) in ``__post_init__``, which veRL runs in
the driver while it validates the config, long before any Ray worker starts::

    actor_rollout_ref.actor.policy_loss._target_=maspo_verl.config.MaspoPolicyLossConfig
    actor_rollout_ref.actor.policy_loss.loss_mode=maspo
    +actor_rollout_ref.actor.policy_loss.maspo.segmenter.name=fixed
    +actor_rollout_ref.actor.policy_loss.maspo.segmenter.window=5
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from verl.workers.config import PolicyLossConfig

from maspo_verl.codec_vocab import LLASA_CODEC_OFFSET, XCODEC2_CODEBOOK_SIZE, CodecVocabulary
from maspo_verl.segmenters import SEGMENTER_REGISTRY, get_segmenter

CONFIG_KEY = "actor_rollout_ref.actor.policy_loss.maspo"

VERL_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
SEGMENT_AGG_MODES = ("seg-mean", "seq-mean-seg-mean")


class MaspoConfigError(ValueError):
    """A MASPO setting is unknown, mistyped or out of range; the message names the full key."""


@dataclass
class SegmenterConfig:
    """``maspo.segmenter``: the segmenter's name, its own parameters, and the options every segmenter has."""

    name: str = "fixed"
    min_len: int | None = None
    """Merge segments shorter than this into a neighbour (never across padding)."""
    max_len: int | None = None
    """Split segments longer than this into near-equal pieces."""
    params: Any = None
    """The segmenter's own settings, an instance of the dataclass it registered (e.g. ``window`` for ``fixed``)."""

    def validate(self) -> None:
        for key in ("min_len", "max_len"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ValueError(f"{key} must be >= 1 or null, got {value}")
        if self.min_len is not None and self.max_len is not None and 2 * self.min_len > self.max_len:
            raise ValueError(
                f"min_len={self.min_len} needs max_len >= 2 * min_len (got max_len={self.max_len}): splitting a long "
                "segment yields pieces of at least max_len // 2 tokens, which then keep min_len"
            )


@dataclass
class CodecConfig:
    """``maspo.codec``: where codec ids sit in the vocabulary, for token-based segmenters."""

    offset: int = LLASA_CODEC_OFFSET
    codebook_size: int = XCODEC2_CODEBOOK_SIZE
    tokenizer: str | None = None
    """A tokenizer path or hub id to check ``offset`` against when the config is built (null: no check)."""

    def validate(self) -> None:
        if self.offset < 0:
            raise ValueError(f"offset must be >= 0, got {self.offset}")
        if self.codebook_size < 1:
            raise ValueError(f"codebook_size must be >= 1, got {self.codebook_size}")

    @property
    def vocabulary(self) -> CodecVocabulary:
        return CodecVocabulary(offset=self.offset, codebook_size=self.codebook_size)


@dataclass
class MaspoConfig:
    """Every MASPO setting. Defaults and the reasons for them are in the README's "MASPO loss" section."""

    segmenter: SegmenterConfig = field(default_factory=SegmenterConfig)
    segmenter_modules: list[str] = field(default_factory=list)
    """Modules imported before the segmenter name is looked up: where custom segmenters register themselves."""
    codec: CodecConfig = field(default_factory=CodecConfig)

    ratio_length_exponent: float = 1.0
    """alpha in ``l_k = sum_{t in seg_k} d_t / |seg_k|**alpha``; 1 is the geometric mean of the token ratios."""
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28
    clip_length_exponent: float = 0.5
    """gamma: a segment of length L is clipped to ``[1 - low * L**-gamma, 1 + high * L**-gamma]``; 0 = fixed range."""
    clip_ratio_c: float | None = 3.0
    """Dual clip for A < 0 (veRL's ``clip_ratio_c``): the loss of a segment is at most ``-A * c``; null disables."""
    gate: Literal["clip", "sapo"] = "clip"
    """``clip``: PPO clip on the segment ratio; ``sapo``: SAPO's soft gate on it (tau from actor.tau_pos/tau_neg)."""
    log_ratio_clamp: float = 20.0
    """Segment log-ratios are clamped to +-this before exp (veRL's ``vanilla`` clamps token log-ratios at 20)."""
    loss_agg_mode: str | None = None
    """null: the actor's ``loss_agg_mode``; or one of veRL's modes, ``seg-mean``, ``seq-mean-seg-mean``."""

    def validate(self) -> None:
        if not 0 <= self.ratio_length_exponent <= 1:
            raise ValueError(f"ratio_length_exponent must be in [0, 1], got {self.ratio_length_exponent}")
        if not 0 <= self.clip_ratio_low < 1:
            raise ValueError(f"clip_ratio_low must be in [0, 1), got {self.clip_ratio_low}")
        if self.clip_ratio_high < 0:
            raise ValueError(f"clip_ratio_high must be >= 0, got {self.clip_ratio_high}")
        if self.clip_length_exponent < 0:
            raise ValueError(f"clip_length_exponent must be >= 0, got {self.clip_length_exponent}")
        if self.clip_ratio_c is not None and self.clip_ratio_c <= 1:
            raise ValueError(f"clip_ratio_c must be > 1 or null, got {self.clip_ratio_c}")
        if self.log_ratio_clamp <= 0:
            raise ValueError(f"log_ratio_clamp must be > 0, got {self.log_ratio_clamp}")
        valid_modes = (None, *VERL_AGG_MODES, *SEGMENT_AGG_MODES)
        if self.loss_agg_mode not in valid_modes:
            raise ValueError(f"loss_agg_mode must be one of {list(valid_modes)}, got {self.loss_agg_mode!r}")

    @classmethod
    def from_mapping(cls, values: Mapping | None, key: str = CONFIG_KEY) -> MaspoConfig:
        """Build and validate from a (Hydra) mapping; every error names the full key and what is valid."""
        values = _plain(values) if values is not None else {}
        if not isinstance(values, dict):
            raise MaspoConfigError(f"{key} must be a mapping, got {type(values).__name__}")
        values = dict(values)
        modules = values.get("segmenter_modules", [])
        for module in modules if isinstance(modules, list) else []:
            try:
                importlib.import_module(module)
            except ImportError as error:
                raise MaspoConfigError(f"{key}.segmenter_modules: cannot import {module!r}: {error}") from error
        segmenter = values.pop("segmenter", {})
        codec = values.pop("codec", {})
        config = _build(cls, values, key, skip=("segmenter", "codec"))
        config.codec = _build(CodecConfig, codec, f"{key}.codec")
        config.segmenter = _build_segmenter(segmenter, f"{key}.segmenter")
        if config.codec.tokenizer and get_segmenter(config.segmenter.name).needs_response_ids:
            from transformers import AutoTokenizer

            try:
                config.codec.vocabulary.check_tokenizer(AutoTokenizer.from_pretrained(config.codec.tokenizer))
            except ValueError as error:
                raise MaspoConfigError(f"{key}.codec: {error}") from error
        return config


@dataclass
class MaspoPolicyLossConfig(PolicyLossConfig):
    """veRL's policy-loss config plus the ``maspo`` block; select it with ``policy_loss._target_``."""

    maspo: Any = field(default_factory=dict)

    def __post_init__(self):
        # Registers loss_mode=maspo and the worker hooks in this process even where veRL's entry-point discovery
        # is off; re-raises here, at config build time, whatever made the plugin fail when veRL imported it.
        import maspo_verl.verl_plugin  # noqa: F401

        if not isinstance(self.maspo, MaspoConfig):
            object.__setattr__(self, "maspo", MaspoConfig.from_mapping(self.maspo))


def maspo_settings(policy_loss: Any) -> MaspoConfig:
    """The MASPO settings carried by an actor's ``policy_loss`` config (defaults when it has no ``maspo`` block)."""
    block = policy_loss.get("maspo", None) if policy_loss is not None else None
    if isinstance(block, MaspoConfig):
        return block
    if block is None:
        return _default_settings()
    return MaspoConfig.from_mapping(block)


@functools.cache
def _default_settings() -> MaspoConfig:
    return MaspoConfig.from_mapping({})


def _plain(values: Any) -> Any:
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(values, DictConfig | ListConfig):
            return OmegaConf.to_container(values, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf ships with veRL
        pass
    if isinstance(values, Mapping):
        return {k: _plain(v) for k, v in values.items()}
    return values


def _build_segmenter(values: Any, key: str) -> SegmenterConfig:
    values = _plain(values) if values is not None else {}
    if isinstance(values, str):
        values = {"name": values}
    if not isinstance(values, dict):
        raise MaspoConfigError(f"{key} must be a mapping with a `name`, got {type(values).__name__}")
    values = dict(values)
    name = values.pop("name", SegmenterConfig.name)
    if name not in SEGMENTER_REGISTRY:
        raise MaspoConfigError(
            f"{key}.name={name!r} is not a registered segmenter; valid: {sorted(SEGMENTER_REGISTRY)} "
            f"(custom segmenters: list their module in {key.rsplit('.', 1)[0]}.segmenter_modules)"
        )
    segmenter = get_segmenter(name)
    common = {k: values.pop(k) for k in ("min_len", "max_len") if k in values}
    param_names = [f.name for f in dataclasses.fields(segmenter.params)]
    unknown = sorted(set(values) - set(param_names))
    if unknown:
        raise MaspoConfigError(
            f"{key}: unknown key(s) {unknown} for segmenter {name!r}; valid keys: "
            f"{sorted(['name', 'min_len', 'max_len', *param_names])}"
        )
    config = _build(SegmenterConfig, {"name": name, **common}, key, skip=("params",))
    config.params = _build(segmenter.params, values, key)
    return config


def _build(cls: type, values: Any, key: str, skip: tuple[str, ...] = ()) -> Any:
    values = _plain(values) if values is not None else {}
    if not isinstance(values, dict):
        raise MaspoConfigError(f"{key} must be a mapping, got {type(values).__name__}: {values!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.name not in skip]
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise MaspoConfigError(f"{key}: unknown key(s) {unknown}; valid keys: {sorted(names)}")
    converted = {name: _coerce(values[name], hints[name], f"{key}.{name}") for name in names if name in values}
    instance = cls(**converted)
    _validate(instance, key)
    return instance


def _validate(instance: Any, key: str) -> None:
    validate = getattr(instance, "validate", None)
    if validate is None:
        return
    try:
        validate()
    except ValueError as error:
        if isinstance(error, MaspoConfigError):
            raise
        message = str(error)
        field_name = message.split(" ", 1)[0]
        where = f"{key}.{field_name}" if field_name in {f.name for f in dataclasses.fields(instance)} else key
        raise MaspoConfigError(f"{where}: {message}") from error


def _coerce(value: Any, hint: Any, key: str) -> Any:
    """Check ``value`` against a type hint (int, float, str, bool, Literal, Optional, list[str])."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        errors = []
        for option in options:
            try:
                return _coerce(value, option, key)
            except MaspoConfigError as error:
                errors.append(str(error))
        raise MaspoConfigError(errors[0] if len(errors) == 1 else f"{key}: {value!r} matches none of {hint}")
    if origin is Literal:
        if value not in args:
            raise MaspoConfigError(f"{key}={value!r} is not valid; valid values: {list(args)}")
        return value
    if origin is list:
        if not isinstance(value, list | tuple):
            raise MaspoConfigError(f"{key} must be a list, got {type(value).__name__}: {value!r}")
        return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if hint is Any:
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise MaspoConfigError(f"{key} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise MaspoConfigError(f"{key} must be an integer, got {type(value).__name__}: {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise MaspoConfigError(f"{key} must be a number, got {type(value).__name__}: {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise MaspoConfigError(f"{key} must be a string, got {type(value).__name__}: {value!r}")
        return value
    raise MaspoConfigError(f"{key}: unsupported setting type {hint}")
