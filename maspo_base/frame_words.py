"""Per-frame word signal: which word the recogniser heard at each codec frame of a response, and how it reaches tokens.

A reward reports, beside its score, one integer per codec frame of the response (the ``frame_words`` extra, with
``reward_config.frame_words``; `reward_fns.alignment.frame_words_from_words`): the index of the heard word covering
frame k (its position in the recogniser's timed words), or `UNHEARD` (-1) where no heard word does. Frame k is the
k-th codec token of the response, as for frame errors (`maspo_base.frame_errors`).

On the wire the signal is a string, for the reason frame errors are (veRL turns every reward extra into a numpy
array across the batch): the integers joined by commas, ``"-1,0,0,0,1,1,-1"``. The empty string means "no
alignment" (a recogniser without timestamps, an unscored response).

`scatter_frame_words` places the decoded signals on the response tokens as one ``(B, T)`` integer tensor, the form
the ``heard_words`` segmenter reads (`maspo_verl.segmentation.segmenters`); tokens that carry no word get the
negative codes below.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch

from maspo_base.frame_errors import NO_ALIGNMENT

FRAME_WORDS_KEY = "frame_words"
"""The reward extra that carries each response's encoded frame words."""

UNHEARD = -1
"""A codec frame that no heard word covers (silence, noise, speech the recogniser did not turn into a word)."""
NOT_A_FRAME = -2
"""On tokens only: a response token that is no codec frame (the end tag, a text token) or padding."""
UNALIGNED = -3
"""On tokens only: a codec frame of a response whose reward reported no alignment."""

_WIRE = re.compile(r"-?[0-9]+(?:,-?[0-9]+)*", re.ASCII)


def encode_frame_words(words: Sequence[int] | None) -> str:
    """``[-1, 0, 0, 1]`` -> ``"-1,0,0,1"``; ``None`` -> ``""`` (no alignment). Values must be integers >= -1."""
    if words is None:
        return NO_ALIGNMENT
    parts = []
    for k, value in enumerate(words):
        if isinstance(value, bool) or int(value) != value or value < UNHEARD:
            raise ValueError(f"frame word {k} is {value!r}; frame words are word indices >= 0, or -1 (unheard)")
        parts.append(str(int(value)))
    return ",".join(parts)


def decode_frame_words(text: object) -> list[int] | None:
    """The inverse of `encode_frame_words`; ``None`` for no alignment or anything malformed (never raises)."""
    if not isinstance(text, str) or not _WIRE.fullmatch(text):
        return None
    values = [int(part) for part in text.split(",")]
    if any(v < UNHEARD for v in values):
        return None
    return values


def scatter_frame_words(signals: Sequence[object], frame_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Place each response's frame words on its frame tokens.

    ``signals``: one encoded signal per row; ``frame_mask``: ``(B, T)`` bool, True at the codec-frame tokens of
    each (valid) response. Row i is *aligned* when its signal decodes and has exactly as many values as the row has
    frame tokens; then value k lands on the row's k-th frame token. Returns ``(words, aligned)``: ``words`` ``(B, T)``
    int64 holding the word index or `UNHEARD` on the frames of aligned rows, `UNALIGNED` on the frames of the other
    rows, `NOT_A_FRAME` on every other token; ``aligned`` ``(B,)`` bool.
    """
    if len(signals) != frame_mask.shape[0]:
        raise ValueError(f"{len(signals)} frame-word signals for {frame_mask.shape[0]} responses")
    decoded = [decode_frame_words(s) for s in signals]
    lengths = torch.tensor([-1 if d is None else len(d) for d in decoded], device=frame_mask.device)
    aligned = lengths == frame_mask.sum(dim=-1)
    words = torch.full(frame_mask.shape, NOT_A_FRAME, dtype=torch.int64, device=frame_mask.device)
    words[frame_mask & ~aligned.unsqueeze(-1)] = UNALIGNED
    values = [torch.tensor(d, dtype=torch.int64) for d, ok in zip(decoded, aligned.tolist()) if ok and d]
    if values:
        # row-major order of the mask's True entries is (row, frame k) order: exactly the concatenated signals
        words[frame_mask & aligned.unsqueeze(-1)] = torch.cat(values).to(frame_mask.device)
    return words, aligned
