"""The segmenter registry and what a segmenter sees.

A segmenter is a function ``(inputs: SegmentationInput, params) -> segments`` registered by name::

    @register_segmenter("my_segmenter", params=MyParams, needs_response_ids=True)
    def my_segments(inputs: SegmentationInput, params: MyParams) -> torch.Tensor:
        ...  # (B, T) integer ids, equal on the tokens of one segment, or a (B, T) bool tensor of segment starts

It may return any labelling (integer ids) or segment starts (bool, cheaper): `segment_layout` renumbers it into
contiguous runs, cuts at padding, then applies the common options ``min_len`` and ``max_len``. ``params`` is an
instance of the dataclass given at registration, built and validated from the ``maspo.segmenter`` config block when
the config is built.

Token-based segmenters see codec ids through ``inputs.codec_ids``; a segmenter registered with
``needs_heard_words=True`` sees the words the recogniser heard on each token through ``inputs.heard_words``
(`maspo_base.frame_words`: the reward's ``frame_words`` extra, placed on the tokens by the plugin's trainer hook).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from maspo_base.registry import Registry
from maspo_base.speech_tokens.layouts import LLASA_1B, SpeechTokenLayout
from maspo_verl.segmentation.segment_ids import SegmentLayout, bound_segment_lengths, canonical_starts, starts_from_ids


class MissingResponseIdsError(RuntimeError):
    """A token-based segmenter ran where veRL's loss call carried no response token ids."""


class MissingHeardWordsError(RuntimeError):
    """A segmenter of heard words ran where veRL's loss call carried no heard words."""


@dataclass(frozen=True)
class SegmentationInput:
    """What a segmenter sees for one micro-batch; all tensors ``(B, T)`` on the response positions."""

    old_log_prob: torch.Tensor
    response_mask: torch.Tensor
    """bool, True on response tokens."""
    response_ids: torch.Tensor | None = None
    codec: SpeechTokenLayout = LLASA_1B
    """The model's speech-token layout: where codes sit, the codebook, its FSQ lattice."""
    segmenter_name: str = ""
    heard_words: torch.Tensor | None = None
    """``(B, T)`` int64, the heard word on each response token (`maspo_base.frame_words.scatter_frame_words`: a word
    index, ``UNHEARD``, ``NOT_A_FRAME`` or ``UNALIGNED``); present where the run's reward reports ``frame_words``."""

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

    def require_heard_words(self) -> torch.Tensor:
        if self.heard_words is None:
            raise MissingHeardWordsError(
                f"segmenter {self.segmenter_name!r} needs the words the recogniser heard, but none reached the loss. "
                "Have the speech reward report them (reward_config.frame_words=true, e.g. "
                "+reward.custom_reward_function.reward_kwargs.reward_config.frame_words=true; a reward server: "
                "--reward-config '{\"frame_words\": true}'); inside veRL maspo-verl's trainer and worker hooks "
                "carry them to the loss (installed when the `verl.plugins` entry point or `maspo_verl.verl_plugin` is "
                "imported); when calling the loss directly, wrap the call in "
                "`maspo_verl.loss_inputs.provide_loss_inputs(heard_words=...)`."
            )
        if self.heard_words.shape != self.response_mask.shape:
            raise ValueError(
                f"heard_words has shape {tuple(self.heard_words.shape)} but response_mask has "
                f"{tuple(self.response_mask.shape)}; they must match"
            )
        return self.heard_words

    @property
    def codec_ids(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(codec_ids, is_speech)`` of the response tokens, see `SpeechTokenLayout.codec_ids`."""
        return self.codec.codec_ids(self.require_response_ids())


SegmenterFn = Callable[[SegmentationInput, Any], torch.Tensor]


@dataclass(frozen=True)
class Segmenter:
    name: str
    fn: SegmenterFn
    params: type
    needs_response_ids: bool
    needs_heard_words: bool = False


SEGMENTER_REGISTRY = Registry(
    "segmenter",
    hint=". A custom one is registered with @maspo_verl.register_segmenter in a module listed in "
    "maspo.segmenter_modules",
)


@dataclass
class NoParams:
    pass


def register_segmenter(
    name: str, params: type = NoParams, needs_response_ids: bool = False, needs_heard_words: bool = False
) -> Callable[[SegmenterFn], SegmenterFn]:
    """Register a segmenter under ``name``; ``params`` is the dataclass of its settings (keys of the config block).

    ``needs_heard_words``: it reads ``inputs.heard_words``, so the driver checks that the run's reward reports
    ``frame_words`` and the trainer hook places them on the tokens (`maspo_verl.verl_patches.trainer`).
    Re-registering a name with a different function raises, as veRL does for advantage estimators.
    """

    def decorator(fn: SegmenterFn) -> SegmenterFn:
        segmenter = Segmenter(name, fn, params, needs_response_ids, needs_heard_words)
        SEGMENTER_REGISTRY.add(name, segmenter, origin=fn)
        return fn

    return decorator


def get_segmenter(name: str) -> Segmenter:
    return SEGMENTER_REGISTRY.lookup(name)


def segment_layout(
    inputs: SegmentationInput,
    name: str,
    params: Any = None,
    min_len: int | None = None,
    max_len: int | None = None,
) -> SegmentLayout:
    """Run segmenter ``name``, apply ``min_len`` / ``max_len``, and number the segments of the batch."""
    segmenter = get_segmenter(name)
    mask = inputs.response_mask.bool()
    inputs = dataclasses.replace(inputs, response_mask=mask, segmenter_name=name)
    raw = segmenter.fn(inputs, params if params is not None else segmenter.params())
    if raw.shape != mask.shape:
        raise ValueError(f"segmenter {name!r} returned shape {tuple(raw.shape)}, expected {tuple(mask.shape)}")
    starts = canonical_starts(raw, mask) if raw.dtype == torch.bool else starts_from_ids(raw, mask)
    if (min_len is not None and min_len > 1) or max_len is not None:
        starts = bound_segment_lengths(starts, mask, min_len, max_len)
    return SegmentLayout.from_starts(starts, mask)


def segment_responses(
    inputs: SegmentationInput,
    name: str,
    params: Any = None,
    min_len: int | None = None,
    max_len: int | None = None,
) -> torch.Tensor:
    """Run segmenter ``name`` and return canonical segment ids ``(B, T)`` (`maspo_verl.segmentation.segment_ids`)."""
    return segment_layout(inputs, name, params, min_len, max_len).segment_ids(inputs.response_mask.bool())
