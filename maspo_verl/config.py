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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from maspo_base.speech_tokens.checkpoint_layout import DEFAULT_LAYOUT
from maspo_base.speech_tokens.layouts import LAYOUTS, SpeechTokenLayout, get_layout
from maspo_base.typed_settings import InvalidSetting, SettingsError, build, to_plain
from maspo_verl.segmentation import SEGMENTER_REGISTRY, SegmentationInput, SegmentLayout, get_segmenter, segment_layout

CONFIG_KEY = "actor_rollout_ref.actor.policy_loss.maspo"

VERL_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
SEGMENT_AGG_MODES = ("seg-mean", "seq-mean-seg-mean")


class MaspoConfigError(SettingsError):
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
                raise InvalidSetting(key, f"{key} must be >= 1 or null, got {value}")
        if self.min_len is not None and self.max_len is not None and 2 * self.min_len > self.max_len:
            raise InvalidSetting(
                "",
                f"min_len={self.min_len} needs max_len >= 2 * min_len (got max_len={self.max_len}): splitting a long "
                "segment yields pieces of at least max_len // 2 tokens, which then keep min_len",
            )


@dataclass
class CodecConfig:
    """``maspo.codec``: the model's speech-token layout (where codec ids sit in the vocabulary, the codebook, its FSQ
    lattice), for token-based segmenters and for credit."""

    layout: str | None = None
    """A registered speech-token layout (`maspo_base.speech_tokens.layouts`): ``llasa-1b``, ``mini-llasa`` or one a
    module of ``segmenter_modules`` registers. null: the model's, which the driver fills in from its checkpoint's
    ``speech_tokens.json`` (`maspo_verl.model_layout`), and Llasa-1B's where nothing declares one
    (`maspo_base.speech_tokens.checkpoint_layout.DEFAULT_LAYOUT`)."""
    offset: int | None = None
    """The id of ``<|s_0|>`` when it differs from the layout's (a fine-tuned variant); null: the layout's."""
    codebook_size: int | None = None
    """Codes in the codebook when they differ from the layout's (the FSQ lattice then no longer applies); null: the
    layout's."""
    tokenizer: str | None = None
    """A tokenizer path or hub id to check ``offset`` against when the config is built (null: no check)."""

    def validate(self) -> None:
        try:
            get_layout(self.layout_name)
        except ValueError:
            raise InvalidSetting("layout", f"unknown layout {self.layout!r}; registered: {sorted(LAYOUTS)}") from None
        if self.offset is not None and self.offset < 0:
            raise InvalidSetting("offset", f"offset must be >= 0, got {self.offset}")
        if self.codebook_size is not None and self.codebook_size < 1:
            raise InvalidSetting("codebook_size", f"codebook_size must be >= 1, got {self.codebook_size}")

    @property
    def layout_name(self) -> str:
        """The layout read: ``layout``, or `DEFAULT_LAYOUT` when it is null (no model declared one)."""
        return self.layout or DEFAULT_LAYOUT

    @functools.cached_property
    def speech_tokens(self) -> SpeechTokenLayout:
        """The layout named by ``layout`` with ``offset`` and ``codebook_size`` applied."""
        layout = get_layout(self.layout_name)
        changes: dict[str, Any] = {}
        if self.offset is not None:
            changes["offset"] = self.offset
        if self.codebook_size is not None and self.codebook_size != layout.codebook_size:
            changes.update(codebook_size=self.codebook_size, fsq_levels=None)
        return layout.replace(**changes)

    def check_tokenizer(self, key: str) -> None:
        """Load ``tokenizer`` (when set) and check the codec offset against it; `MaspoConfigError` naming ``key``."""
        if not self.tokenizer:
            return
        from transformers import AutoTokenizer

        try:
            self.speech_tokens.check_tokenizer(AutoTokenizer.from_pretrained(self.tokenizer))
        except ValueError as error:
            raise MaspoConfigError(f"{key}: {error}") from error


@dataclass
class MaspoConfig:
    """Every MASPO setting. Defaults and the reasons for them are in docs/loss.md."""

    segmenter: SegmenterConfig = field(default_factory=SegmenterConfig)
    segmenter_modules: list[str] = field(default_factory=list)
    """Modules imported before the segmenter name is looked up: where custom segmenters register themselves."""
    codec: CodecConfig = field(default_factory=CodecConfig)

    ratio_length_exponent: float = 1.0
    """alpha in ``l_k = sum_{t in seg_k} d_t / |seg_k|**alpha``, in [0, 1] (finite): 1 is the log of the geometric
    mean of the token ratios (GSPO's normalisation), 0 the log of their product (one segment per response: the
    sequence ratio ``pi_theta(y) / pi_old(y)``), between them P-GSPO's power-law normalisation. A token's gradient is
    ``|seg_k|**(1 - alpha) s_k grad log pi_theta(y_t)``, the segment ratio's own (docs/loss.md)."""
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
    compile: bool = False
    """On a GPU, run the segmentation and the segment tables as one ``torch.compile`` graph (fewer kernel launches;
    `maspo_verl.loss.COMPILE_BACKENDS`); elsewhere the eager path. Not yet measured on a GPU: docs/loss.md."""

    def validate(self) -> None:
        checks = (
            ("ratio_length_exponent", 0 <= self.ratio_length_exponent <= 1, "be in [0, 1]"),
            ("clip_ratio_low", 0 <= self.clip_ratio_low < 1, "be in [0, 1)"),
            ("clip_ratio_high", self.clip_ratio_high >= 0, "be >= 0"),
            ("clip_length_exponent", self.clip_length_exponent >= 0, "be >= 0"),
            ("clip_ratio_c", self.clip_ratio_c is None or self.clip_ratio_c > 1, "be > 1 or null"),
            ("log_ratio_clamp", self.log_ratio_clamp > 0, "be > 0"),
        )
        for name, ok, requirement in checks:
            if not ok:
                raise InvalidSetting(name, f"{name} must {requirement}, got {getattr(self, name)}")
        valid_modes = (None, *VERL_AGG_MODES, *SEGMENT_AGG_MODES)
        if self.loss_agg_mode not in valid_modes:
            raise InvalidSetting(
                "loss_agg_mode", f"loss_agg_mode must be one of {list(valid_modes)}, got {self.loss_agg_mode!r}"
            )

    def segment_layout(
        self,
        old_log_prob: torch.Tensor,
        response_mask: torch.Tensor,
        response_ids: torch.Tensor | None,
        heard_words: torch.Tensor | None = None,
    ) -> SegmentLayout:
        """The segments of a micro- or mini-batch under these settings (``segmenter`` and ``codec``)."""
        inputs = SegmentationInput(
            old_log_prob=old_log_prob,
            response_mask=response_mask,
            response_ids=response_ids,
            codec=self.codec.speech_tokens,
            heard_words=heard_words,
        )
        segmenter = self.segmenter
        return segment_layout(inputs, segmenter.name, segmenter.params, segmenter.min_len, segmenter.max_len)

    @classmethod
    def from_mapping(cls, values: Mapping | None, key: str = CONFIG_KEY) -> MaspoConfig:
        """Build and validate from a (Hydra) mapping; every error names the full key and what is valid."""
        values = to_plain(values) if values is not None else {}
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
        if config.segmenter.name == "fsq" and config.codec.speech_tokens.fsq is None:
            raise MaspoConfigError(
                f"{key}.segmenter.name=fsq needs codes with FSQ digits, but {key}.codec (layout "
                f"{config.codec.layout_name!r}, codebook_size {config.codec.speech_tokens.codebook_size}) has no FSQ "
                "lattice"
            )
        segmenter = get_segmenter(config.segmenter.name)
        if segmenter.needs_response_ids or segmenter.needs_heard_words:  # heard words sit on the codec tokens
            config.codec.check_tokenizer(f"{key}.codec")
        return config


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


def _build_segmenter(values: Any, key: str) -> SegmenterConfig:
    values = to_plain(values) if values is not None else {}
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
    return build(cls, values, key, skip=skip, error=MaspoConfigError)


def _policy_loss_config_class() -> type:
    from verl.workers.config import PolicyLossConfig

    @dataclass
    class MaspoPolicyLossConfig(PolicyLossConfig):
        """veRL's policy-loss config plus the ``maspo`` block; select it with ``policy_loss._target_``."""

        maspo: Any = field(default_factory=dict)

        def __post_init__(self):
            from maspo_verl.plugin_loading import load_plugin

            load_plugin()  # loss_mode=maspo and the worker hooks in this process, or the plugin's failure, here
            if not isinstance(self.maspo, MaspoConfig):
                object.__setattr__(self, "maspo", MaspoConfig.from_mapping(self.maspo))

    MaspoPolicyLossConfig.__module__ = __name__
    MaspoPolicyLossConfig.__qualname__ = MaspoPolicyLossConfig.__name__
    return MaspoPolicyLossConfig


def __getattr__(name: str) -> Any:
    # ``MaspoPolicyLossConfig`` subclasses veRL's config, and importing veRL loads the plugin, which imports this
    # module: the class is built on first use (Hydra's ``_target_``, an import, a pickle), so that importing this
    # module imports no veRL and the plugin never meets it half-initialised.
    if name == "MaspoPolicyLossConfig":
        globals()[name] = _policy_loss_config_class()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
