"""The `SpeechTokenLayout` type and the registry of layouts (`LAYOUTS`, `register_layout`).

What a layout holds, and the registered ones, are `maspo_base.speech_tokens.layouts`'s; this module is the type alone,
so that a model's module (`maspo_base.speech_tokens.mini_llasa_tokens`) declares and registers its layout without
importing the module that looks layouts up by name (which imports every built-in layout: no import circle).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..registry import Registry
from . import llasa_tokens as lt
from .fsq import FsqLattice


@dataclass(frozen=True)
class SpeechTokenLayout:
    """Where a model's speech tags and codec tokens sit: codec id c is vocabulary id ``offset + c``."""

    name: str
    offset: int
    codebook_size: int
    start_id: int
    end_id: int
    frame_rate: int = 50
    """Codes per second of audio (XCodec2 and the mini codec: 50, one per 20 ms)."""
    fsq_levels: tuple[int, ...] | None = None
    """Levels per dimension of the codec's FSQ lattice, dimension 0 least significant in the id; None when the
    codes are not FSQ digits (the ``fsq`` segmenter then refuses the layout)."""
    codec: str = ""
    """The codec backend that decodes these codes (`maspo_base.codecs`), for messages and defaults."""

    def __post_init__(self) -> None:
        if self.fsq_levels is not None and self.fsq.codebook_size != self.codebook_size:
            raise ValueError(
                f"layout {self.name!r}: FSQ levels {self.fsq_levels} give {self.fsq.codebook_size} codes, "
                f"codebook_size is {self.codebook_size}"
            )

    @property
    def fsq(self) -> FsqLattice | None:
        """The FSQ lattice of the codes, or None."""
        return None if self.fsq_levels is None else FsqLattice(self.fsq_levels)

    @property
    def vocab_size(self) -> int:
        """Ids up to the last code: the model's vocabulary when the codes come last (both layouts here)."""
        return self.offset + self.codebook_size

    def replace(self, **changes) -> SpeechTokenLayout:
        return dataclasses.replace(self, **changes)

    def expected_ids(self) -> dict[str, int]:
        """Token -> id for the 8 tags (a contiguous run around ``start_id``) and both ends of the code run.

        The codes are added in order, so the two ends pin the whole run."""
        first_tag = self.start_id - lt.TAGS.index(lt.SPEECH_GENERATION_START)
        last = self.codebook_size - 1
        return {
            **{tag: first_tag + i for i, tag in enumerate(lt.TAGS)},
            lt.SPEECH_GENERATION_END: self.end_id,
            "<|s_0|>": self.offset,
            f"<|s_{last}|>": self.offset + last,
        }

    def codec_ids(self, token_ids: torch.Tensor, zero_off_speech: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Map vocabulary ids to codec ids. Returns ``(codec_ids, is_speech)``; codec ids (int32) are 0 off speech,
        or ``token_id - offset`` there with ``zero_off_speech=False`` (one pass less, for callers that mask)."""
        codec = token_ids.to(torch.int32, copy=True).sub_(self.offset)
        size = self.codebook_size
        if size & (size - 1) == 0:  # a power of two: in range exactly when no bit at or above log2(size) is set
            is_speech = (codec >> (size.bit_length() - 1)) == 0
        else:
            is_speech = codec.ge(0).logical_and_(codec.lt(size))
        return (codec.mul_(is_speech) if zero_off_speech else codec), is_speech

    def check_tokenizer(self, tokenizer) -> None:
        """Raise ``ValueError`` unless ``tokenizer`` maps the 8 tags and the code run to this layout's ids."""
        problems = []
        for token, want in self.expected_ids().items():
            got = tokenizer.convert_tokens_to_ids(token)
            if got != want:
                where = (
                    f"codec.offset={self.offset} and codec.codebook_size={self.codebook_size} put it at {want}"
                    if token.startswith("<|s_")
                    else f"the {self.name} layout puts it at {want}"
                )
                problems.append(f"the tokenizer maps {token} to id {got}, but {where}")
        if problems:
            raise ValueError("; ".join(problems) + " (codec.offset must be the id of <|s_0|> in your tokenizer)")

    def from_tokenizer(self, tokenizer) -> SpeechTokenLayout:
        """This layout with the ids read off ``tokenizer`` (tags, ``<|s_0|>``), checked to be contiguous; the
        codebook, frame rate and lattice stay this layout's (a fine-tuned variant may place the codes elsewhere)."""
        unknown = getattr(tokenizer, "unk_token_id", None)
        ids = {
            token: tokenizer.convert_tokens_to_ids(token)
            for token in (lt.SPEECH_GENERATION_START, lt.SPEECH_GENERATION_END, "<|s_0|>")
        }
        missing = [token for token, i in ids.items() if i is None or i == unknown]
        if missing:
            raise ValueError(f"tokenizer lacks the speech token(s) {missing} of the {self.name} layout")
        layout = self.replace(
            offset=ids["<|s_0|>"], start_id=ids[lt.SPEECH_GENERATION_START], end_id=ids[lt.SPEECH_GENERATION_END]
        )
        layout.check_tokenizer(tokenizer)
        return layout


LAYOUTS = Registry("speech-token layout", hint=". A new model family registers its own with register_layout")


def register_layout(layout: SpeechTokenLayout) -> SpeechTokenLayout:
    """Register ``layout`` under its name (a different layout under a taken name raises); returns it."""
    LAYOUTS.add(layout.name, layout)
    return layout
