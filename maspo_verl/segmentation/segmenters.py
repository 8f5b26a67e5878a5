"""The built-in segmenters: fixed windows, old-policy log-prob drops, raw codec-id jumps, FSQ lattice distance, the
words the recogniser heard.

Token-based segmenters give every non-speech token (the ``<|SPEECH_GENERATION_END|>`` tag, any text token) a segment
of its own, so its ratio stays a token ratio and never mixes into a speech segment. Each ``*Params`` dataclass is the
segmenter's config block; its ``validate`` runs when the config is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from maspo_base.frame_words import NOT_A_FRAME, UNALIGNED
from maspo_base.speech_tokens.xcodec2_fsq import XCODEC2_FSQ, fsq_far_steps, units_threshold
from maspo_base.typed_settings import InvalidSetting
from maspo_verl.segmentation.registry import SegmentationInput, register_segmenter


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
            raise InvalidSetting("window", f"window must be >= 1, got {self.window}")


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
            raise InvalidSetting("threshold", f"threshold must be > 0, got {self.threshold}")


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
            raise InvalidSetting("threshold", f"threshold must be >= 0, got {self.threshold}")


@register_segmenter("token_jump", params=TokenJumpParams, needs_response_ids=True)
def token_jump_segments(inputs: SegmentationInput, params: TokenJumpParams) -> torch.Tensor:
    """A boundary where ``|c_t - c_{t-1}| > threshold`` on raw codec ids (the design note's TokenVal).

    The raw id is a base-4 number, so this mostly sees changes on the high FSQ dimensions; `fsq` measures the
    change on every dimension alike.
    """
    codec_ids, is_speech = inputs.codec.codec_ids(inputs.require_response_ids(), zero_off_speech=False)
    # pairs with a non-speech token are cut anyway; codes differ by less than the codebook size
    jump = torch.diff(codec_ids, dim=-1).abs_() > min(params.threshold, inputs.codec.codebook_size)
    return _starts_with_singleton_non_speech(torch.nn.functional.pad(jump, (1, 0), value=False), is_speech)


# ---------------------------------------------------------------------------------- FSQ lattice distance


@dataclass
class FSQDistanceParams:
    threshold: float = 4.0
    metric: Literal["l1", "l2", "changed_dims"] = "l1"

    def validate(self) -> None:
        if self.threshold < 0:
            raise InvalidSetting("threshold", f"threshold must be >= 0, got {self.threshold}")


@register_segmenter("fsq", params=FSQDistanceParams, needs_response_ids=True)
def fsq_distance_segments(inputs: SegmentationInput, params: FSQDistanceParams) -> torch.Tensor:
    """A boundary where consecutive codes lie far apart on the codec's FSQ lattice (the layout's ``fsq_levels``).

    With digits ``d_k`` and code values ``c_k = (d_k - h_k) / h_k``, ``h_k = L_k // 2`` (XCodec2: 8 dims x 4 levels;
    the mini codec: 5 x 4), token t starts a segment when ``dist(t-1, t) > threshold`` for

    - ``l1``: ``sum_k |d_k(t) - d_k(t-1)|`` (level steps; XCodec2 0..24),
    - ``l2``: ``sqrt(sum_k (c_k(t) - c_k(t-1))**2)`` (Euclidean, in code units; XCodec2 0..sqrt(18)),
    - ``changed_dims``: the number of dimensions whose level changed.
    """
    lattice = inputs.codec.fsq
    if lattice is None:
        raise ValueError(
            f"segmenter 'fsq' needs codes with FSQ digits, but layout {inputs.codec.name!r} declares no fsq_levels "
            f"(codebook_size {inputs.codec.codebook_size}); choose another segmenter"
        )
    if lattice == XCODEC2_FSQ:  # XCodec2's own codebook: one fused pass over the ids
        threshold = units_threshold(params.threshold, params.metric)
        return fsq_far_steps(inputs.require_response_ids(), inputs.codec.offset, threshold, params.metric)
    codec_ids, is_speech = inputs.codec_ids
    far = lattice.step_distance(codec_ids, params.metric) > params.threshold
    return _starts_with_singleton_non_speech(torch.nn.functional.pad(far, (1, 0), value=False), is_speech)


# ------------------------------------------------------------------------------------ words the recogniser heard


@dataclass
class HeardWordsParams:
    fallback: Literal["fixed", "response"] = "fixed"
    """Responses without alignment (the reward reported no ``frame_words``: unscored, no timestamps): ``fixed``
    windows of ``fallback_window`` tokens by response position, or ``response``: their frames one segment."""
    fallback_window: int = 5
    """The window of the ``fixed`` fallback (the ``fixed`` segmenter's default)."""

    def validate(self) -> None:
        if self.fallback_window < 1:
            raise InvalidSetting("fallback_window", f"fallback_window must be >= 1, got {self.fallback_window}")


@register_segmenter("heard_words", params=HeardWordsParams, needs_heard_words=True)
def heard_word_segments(inputs: SegmentationInput, params: HeardWordsParams) -> torch.Tensor:
    """One segment per word the recogniser heard (the frames its timestamps cover), one per unheard stretch.

    Reads ``inputs.heard_words`` (`maspo_base.frame_words.scatter_frame_words`: the reward's ``frame_words`` on the
    tokens), so a segment starts where the heard word changes from the token before: a new word, a stretch of frames
    no heard word covers (``UNHEARD``), the first frame after a non-speech token. Every non-speech token (the end
    tag, a text token: ``NOT_A_FRAME``) is a segment of its own, as in the token-based segmenters. The frames of a
    response without alignment (``UNALIGNED``) follow ``fallback``. The common ``min_len`` / ``max_len`` then merge
    short words into a neighbour and split long words or stretches.
    """
    words = inputs.require_heard_words()
    previous = torch.nn.functional.pad(words[:, :-1], (1, 0), value=NOT_A_FRAME)
    starts = (words != previous) | (words == NOT_A_FRAME)
    if params.fallback == "fixed":
        window_starts = torch.arange(words.shape[-1], device=words.device) % params.fallback_window == 0
        starts |= (words == UNALIGNED) & window_starts
    return starts & inputs.response_mask
