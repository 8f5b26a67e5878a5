"""Segmenters: cut each response into segments of adjacent tokens that share one importance ratio.

A segmenter is a function ``(inputs: SegmentationInput, params) -> segments`` registered by name::

    @register_segmenter("my_segmenter", params=MyParams, needs_response_ids=True)
    def my_segments(inputs: SegmentationInput, params: MyParams) -> torch.Tensor:
        ...  # (B, T) integer ids, equal on the tokens of one segment, or a (B, T) bool tensor of segment starts

It may return any labelling (integer ids) or segment starts (bool, cheaper): the caller renumbers it into contiguous
runs, cuts at padding, then applies the common options ``min_len`` and ``max_len``. ``params`` is an instance of
the dataclass given at registration, built and validated from the ``maspo.segmenter`` config block when the config
is built.

Token-based segmenters see codec ids through ``inputs.codec_ids``; every non-speech token (the
``<|SPEECH_GENERATION_END|>`` tag, any text token) gets a segment of its own, so its ratio stays a token ratio
and never mixes into a speech segment.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from maspo_verl.codec_vocab import CodecVocabulary, fsq_step_distance
from maspo_verl.segments import (
    SegmentLayout,
    canonical_starts,
    merge_short_starts,
    split_long_starts,
    starts_from_ids,
)


class MissingResponseIdsError(RuntimeError):
    """A token-based segmenter ran where veRL's loss call carried no response token ids."""


@dataclass
class SegmentationInput:
    """What a segmenter sees for one micro-batch; all tensors ``(B, T)`` on the response positions."""

    old_log_prob: torch.Tensor
    response_mask: torch.Tensor
    """bool, True on response tokens."""
    response_ids: torch.Tensor | None = None
    codec: CodecVocabulary = field(default_factory=CodecVocabulary)
    segmenter_name: str = ""

    def require_response_ids(self) -> torch.Tensor:
        if self.response_ids is None:
            raise MissingResponseIdsError(
                f"segmenter {self.segmenter_name!r} needs the response token ids, but none reached the loss. "
                "Inside veRL they are provided by maspo-verl's worker hooks (installed when the `verl.plugins` entry "
                "point or `maspo_verl.verl_plugin` is imported); when calling the loss directly, wrap the call in "
                "`maspo_verl.loss_inputs.provide_loss_inputs(response_ids=...)`."
            )
        if self.response_ids.shape != self.response_mask.shape:
            raise ValueError(
                f"response_ids has shape {tuple(self.response_ids.shape)} but response_mask has "
                f"{tuple(self.response_mask.shape)}; they must match"
            )
        return self.response_ids

    @property
    def codec_ids(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(codec_ids, is_speech)`` of the response tokens, see `CodecVocabulary.codec_ids`."""
        return self.codec.codec_ids(self.require_response_ids())


SegmenterFn = Callable[[SegmentationInput, Any], torch.Tensor]


@dataclass(frozen=True)
class Segmenter:
    name: str
    fn: SegmenterFn
    params: type
    needs_response_ids: bool


SEGMENTER_REGISTRY: dict[str, Segmenter] = {}


@dataclass
class NoParams:
    pass


def register_segmenter(
    name: str, params: type = NoParams, needs_response_ids: bool = False
) -> Callable[[SegmenterFn], SegmenterFn]:
    """Register a segmenter under ``name``; ``params`` is the dataclass of its settings (keys of the config block).

    Re-registering a name with a different function raises, as veRL does for advantage estimators.
    """

    def decorator(fn: SegmenterFn) -> SegmenterFn:
        existing = SEGMENTER_REGISTRY.get(name)
        if existing is not None and existing.fn is not fn and existing.fn.__qualname__ != fn.__qualname__:
            raise ValueError(f"segmenter {name!r} is already registered by {existing.fn.__module__}")
        SEGMENTER_REGISTRY[name] = Segmenter(name, fn, params, needs_response_ids)
        return fn

    return decorator


def get_segmenter(name: str) -> Segmenter:
    if name not in SEGMENTER_REGISTRY:
        raise ValueError(
            f"unknown segmenter {name!r}; registered segmenters: {sorted(SEGMENTER_REGISTRY)}. A custom one is "
            "registered with @maspo_verl.register_segmenter in a module listed in maspo.segmenter_modules"
        )
    return SEGMENTER_REGISTRY[name]


def segment_layout(
    inputs: SegmentationInput,
    name: str,
    params: Any = None,
    min_len: int | None = None,
    max_len: int | None = None,
) -> SegmentLayout:
    """Run segmenter ``name``, apply ``min_len`` / ``max_len``, and number the segments of the batch."""
    segmenter = get_segmenter(name)
    inputs.segmenter_name = name
    inputs.response_mask = mask = inputs.response_mask.bool()
    raw = segmenter.fn(inputs, params if params is not None else segmenter.params())
    if raw.shape != mask.shape:
        raise ValueError(f"segmenter {name!r} returned shape {tuple(raw.shape)}, expected {tuple(mask.shape)}")
    starts = canonical_starts(raw, mask) if raw.dtype == torch.bool else starts_from_ids(raw, mask)
    if min_len is not None and min_len > 1:
        starts = merge_short_starts(starts, mask, min_len)
    if max_len is not None:
        starts = split_long_starts(starts, mask, max_len)
    return SegmentLayout.from_starts(starts, mask)


def segment_responses(
    inputs: SegmentationInput,
    name: str,
    params: Any = None,
    min_len: int | None = None,
    max_len: int | None = None,
) -> torch.Tensor:
    """Run segmenter ``name`` and return canonical segment ids ``(B, T)`` (see `maspo_verl.segments`)."""
    return segment_layout(inputs, name, params, min_len, max_len).segment_ids(inputs.response_mask)


def _starts_with_singleton_non_speech(boundary: torch.Tensor, is_speech: torch.Tensor) -> torch.Tensor:
    """Segment starts from a boundary flag, with every non-speech token a segment of its own.

    ``boundary[:, t]`` says "token t starts a new segment" for t >= 1 (column 0 is always a start).
    """
    not_speech = ~is_speech
    return boundary | not_speech | torch.nn.functional.pad(not_speech[:, :-1], (1, 0), value=True)


# --------------------------------------------------------------------------------------------- fixed windows


@dataclass
class FixedWindowParams:
    window: int = 5

    def validate(self) -> None:
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")


@register_segmenter("fixed", params=FixedWindowParams)
def fixed_window_segments(inputs: SegmentationInput, params: FixedWindowParams) -> torch.Tensor:
    """Windows of ``W`` tokens by response position: ``segment = t // W``. W=1 is GRPO, W >= T is GSPO.

    veRL's responses start at position 0, so windows are aligned to the response; a masked token inside a
    response closes its window early (the next window restarts after it).
    """
    mask = inputs.response_mask
    window_starts = torch.arange(mask.shape[-1], device=mask.device) % params.window == 0
    return window_starts & mask


# --------------------------------------------------------------------------------- old-policy log-prob drops


@dataclass
class LogProbDropParams:
    threshold: float = 1.0
    mode: Literal["zscore", "absolute"] = "zscore"

    def validate(self) -> None:
        if self.threshold <= 0:
            raise ValueError(f"threshold must be > 0, got {self.threshold}")


@register_segmenter("logprob", params=LogProbDropParams)
def logprob_drop_segments(inputs: SegmentationInput, params: LogProbDropParams) -> torch.Tensor:
    """A boundary where the old policy's log-prob drops: the model became less sure.

    With ``delta_t = log pi_old(y_t) - log pi_old(y_{t-1})`` (both tokens valid), token t starts a segment when

    - ``absolute``: ``delta_t < -threshold`` (a drop of more than ``threshold`` nats), or
    - ``zscore``: ``(delta_t - mean_i) / std_i < -threshold``, with mean and std over response i's own deltas.
    """
    mask = inputs.response_mask
    pair_valid = mask[:, 1:] & mask[:, :-1]  # (B, T - 1): delta_t for t = 1 .. T-1
    delta = torch.diff(inputs.old_log_prob.detach(), dim=-1) * pair_valid
    if params.mode == "absolute":
        drop = delta < -params.threshold
    else:
        count = torch.count_nonzero(pair_valid, dim=-1).clamp(min=1).unsqueeze(-1)
        mean = delta.sum(dim=-1, keepdim=True) / count
        centred = (delta - mean) * pair_valid
        std = (centred.square().sum(dim=-1, keepdim=True) / count).sqrt().clamp(min=1e-6)
        drop = centred < -params.threshold * std
    return torch.nn.functional.pad(drop & pair_valid, (1, 0), value=False)


# ------------------------------------------------------------------------------------- codec-id jumps (raw)


@dataclass
class TokenJumpParams:
    threshold: int = 4096

    def validate(self) -> None:
        if self.threshold < 0:
            raise ValueError(f"threshold must be >= 0, got {self.threshold}")


@register_segmenter("token_jump", params=TokenJumpParams, needs_response_ids=True)
def token_jump_segments(inputs: SegmentationInput, params: TokenJumpParams) -> torch.Tensor:
    """A boundary where ``|c_t - c_{t-1}| > threshold`` on raw codec ids (the design note's TokenVal).

    The raw id is a base-4 number, so this mostly sees changes on the high FSQ dimensions; `fsq` measures the
    change on every dimension alike.
    """
    codec_ids, is_speech = inputs.codec_ids
    jump = torch.diff(codec_ids, dim=-1).abs() > params.threshold
    return _starts_with_singleton_non_speech(torch.nn.functional.pad(jump, (1, 0), value=False), is_speech)


# ---------------------------------------------------------------------------------- FSQ lattice distance


@dataclass
class FSQDistanceParams:
    threshold: float = 4.0
    metric: Literal["l1", "l2", "changed_dims"] = "l1"

    def validate(self) -> None:
        if self.threshold < 0:
            raise ValueError(f"threshold must be >= 0, got {self.threshold}")


@register_segmenter("fsq", params=FSQDistanceParams, needs_response_ids=True)
def fsq_distance_segments(inputs: SegmentationInput, params: FSQDistanceParams) -> torch.Tensor:
    """A boundary where consecutive XCodec2 codes lie far apart on the FSQ lattice.

    With digits ``d_k`` (8 dims x 4 levels) and code values ``c_k = (d_k - 2) / 2``, token t starts a segment when
    ``dist(t-1, t) > threshold`` for

    - ``l1``: ``sum_k |d_k(t) - d_k(t-1)|`` (level steps, 0..24),
    - ``l2``: ``sqrt(sum_k (c_k(t) - c_k(t-1))**2)`` (Euclidean, in code units, 0..sqrt(18)),
    - ``changed_dims``: the number of dimensions whose level changed (0..8).
    """
    codec_ids, is_speech = inputs.codec_ids
    far = fsq_step_distance(codec_ids[:, :-1], codec_ids[:, 1:], params.metric) > params.threshold
    return _starts_with_singleton_non_speech(torch.nn.functional.pad(far, (1, 0), value=False), is_speech)
