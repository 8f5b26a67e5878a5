"""Where codec tokens sit in a speech LM's vocabulary, and what a codec id means.

Llasa-1B appends XCodec2's 65,536 codes to Llama-3.2's vocabulary as `<|s_0|>` ... `<|s_65535|>` right after its
eight tag tokens, so ``vocab_id = 128264 + codec_id``. Every other id in a response (the
`<|SPEECH_GENERATION_END|>` tag, stray text) is *non-speech*; segmenters give each non-speech token a segment of
its own.

XCodec2's codebook is a finite scalar quantiser with 8 dimensions of 4 levels each, so a codec id is a base-4
number: digit ``d_k = (id // 4**k) % 4`` is dimension k (k = 0 least significant) and the code value on that
dimension is ``c_k = (d_k - 2) / 2``. Distances between consecutive codes are measured on these digits, not on
the raw id (``|Δid| = 1`` moves dimension 0, ``|Δid| = 16384`` moves dimension 7).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from maspo_verl.llasa_tokens import CODEBOOK_SIZE as XCODEC2_CODEBOOK_SIZE
from maspo_verl.llasa_tokens import CODEC_OFFSET as LLASA_CODEC_OFFSET

XCODEC2_FSQ_LEVELS = 4
XCODEC2_FSQ_DIMS = 8


@dataclass(frozen=True)
class CodecVocabulary:
    """Codec ids occupy ``[offset, offset + codebook_size)`` of the LM vocabulary."""

    offset: int = LLASA_CODEC_OFFSET
    codebook_size: int = XCODEC2_CODEBOOK_SIZE

    def codec_ids(self, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Map vocabulary ids to codec ids. Returns ``(codec_ids, is_speech)``; codec ids (int32) are 0 off speech."""
        codec = token_ids.to(torch.int32) - self.offset
        is_speech = (codec >= 0) & (codec < self.codebook_size)
        return codec * is_speech, is_speech

    def check_tokenizer(self, tokenizer) -> None:
        """Raise if ``tokenizer`` places `<|s_0|>` or the last code anywhere but where this vocabulary says."""
        last = self.codebook_size - 1
        for token, expected in ((f"<|s_{0}|>", self.offset), (f"<|s_{last}|>", self.offset + last)):
            found = tokenizer.convert_tokens_to_ids(token)
            if found != expected:
                raise ValueError(
                    f"maspo.codec: the tokenizer maps {token} to id {found}, but codec.offset={self.offset} and "
                    f"codec.codebook_size={self.codebook_size} put it at {expected}; set maspo.codec.offset to the "
                    f"id of <|s_0|> in your tokenizer"
                )


def fsq_digits(codec_ids: torch.Tensor, levels: int = XCODEC2_FSQ_LEVELS, dims: int = XCODEC2_FSQ_DIMS):
    """Digits of each codec id on the FSQ lattice: ``(..., dims)`` with ``d_k = (id // levels**k) % levels``."""
    place_values = levels ** torch.arange(dims, device=codec_ids.device)
    return (codec_ids.long().unsqueeze(-1) // place_values) % levels


FSQ_METRICS = ("l1", "l2", "changed_dims")
_HALF_DIGITS = XCODEC2_FSQ_DIMS // 2  # a codec id splits into two bytes of 4 base-4 digits each
_HALF = XCODEC2_FSQ_LEVELS**_HALF_DIGITS
assert _HALF == 256, "fsq_step_distance splits a codec id into two bytes"


@functools.cache
def _half_distance_table(metric: str, device: str) -> torch.Tensor:
    """``table[a * 256 + b]``: the metric's contribution of 4 digits, between bytes a and b (float32, 65,536 entries).

    For ``l2`` it holds the squared distance, summed over both halves before the square root.
    """
    values = torch.arange(_HALF)
    digits = fsq_digits(values, dims=_HALF_DIGITS)
    step = (digits.unsqueeze(1) - digits.unsqueeze(0)).abs()
    if metric == "l1":
        table = step.sum(-1)
    elif metric == "l2":
        table = (step / 2).pow(2).sum(-1)
    elif metric == "changed_dims":
        table = (step > 0).sum(-1)
    else:
        raise ValueError(f"unknown FSQ metric {metric!r}; valid: {list(FSQ_METRICS)}")
    return table.reshape(-1).to(device=device, dtype=torch.float32)


def fsq_step_distance(previous: torch.Tensor, current: torch.Tensor, metric: str = "l1") -> torch.Tensor:
    """Distance between XCodec2 codes on the FSQ lattice, elementwise (float32).

    - ``l1``: ``sum_k |d_k(a) - d_k(b)|`` level steps (0..24)
    - ``l2``: ``sqrt(sum_k (c_k(a) - c_k(b))**2)`` with ``c_k = (d_k - 2) / 2`` (0..sqrt(18))
    - ``changed_dims``: dimensions whose level differs (0..8)

    Computed from two 65,536-entry tables over the low and high 4 digits, so no ``(..., 8)`` digit tensor is built.
    """
    table = _half_distance_table(metric, str(previous.device))
    previous, current = previous.int(), current.int()
    low = ((previous & 0xFF) << 8) | (current & 0xFF)
    high = (previous & 0xFF00) | (current >> 8)
    distance = (table.index_select(0, low.reshape(-1)) + table.index_select(0, high.reshape(-1))).view(low.shape)
    return distance.sqrt() if metric == "l2" else distance
