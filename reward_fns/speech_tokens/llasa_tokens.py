"""Llasa-1B's token layout (HKUSTAudio/Llasa-1B).

Llasa-1B extends the Llama-3.2 tokenizer (128,256 ids) with 8 tags and then one token per XCodec2 code::

    128256 <|TEXT_GENERATION_START|>      128260 <|SPEECH_GENERATION_START|>
    128257 <|TEXT_GENERATION_END|>        128261 <|SPEECH_GENERATION_END|>
    128258 <|TEXT_UNDERSTANDING_START|>   128262 <|SPEECH_UNDERSTANDING_START|>
    128259 <|TEXT_UNDERSTANDING_END|>     128263 <|SPEECH_UNDERSTANDING_END|>
    128264 + c  <|s_c|>   for codec id c in [0, 65536)

so ``vocab id = CODEC_OFFSET + codec id`` and the vocabulary has ``CODEC_OFFSET + CODEBOOK_SIZE = 193,800`` ids.
`LlasaVocabulary` carries these positions as values (a fine-tuned variant may place the codes elsewhere): it maps
vocabulary ids to codec ids, reads the layout off a tokenizer (`LlasaVocabulary.from_tokenizer`) and checks a
tokenizer against it (`LlasaVocabulary.check_tokenizer`). Every other id in a response (the end tag, stray text) is
*non-speech*.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

LLAMA3_VOCAB_SIZE = 128_256
"""Ids of the Llama-3.2 tokenizer Llasa-1B starts from (text and Llama special tokens)."""

TAGS = (
    "<|TEXT_GENERATION_START|>",
    "<|TEXT_GENERATION_END|>",
    "<|TEXT_UNDERSTANDING_START|>",
    "<|TEXT_UNDERSTANDING_END|>",
    "<|SPEECH_GENERATION_START|>",
    "<|SPEECH_GENERATION_END|>",
    "<|SPEECH_UNDERSTANDING_START|>",
    "<|SPEECH_UNDERSTANDING_END|>",
)
"""Llasa's 8 tags, in id order from `LLAMA3_VOCAB_SIZE`."""

TEXT_UNDERSTANDING_START = "<|TEXT_UNDERSTANDING_START|>"
TEXT_UNDERSTANDING_END = "<|TEXT_UNDERSTANDING_END|>"
SPEECH_GENERATION_START = "<|SPEECH_GENERATION_START|>"
SPEECH_GENERATION_END = "<|SPEECH_GENERATION_END|>"

TAG_IDS = {tag: LLAMA3_VOCAB_SIZE + i for i, tag in enumerate(TAGS)}
SPEECH_GENERATION_START_ID = TAG_IDS[SPEECH_GENERATION_START]  # 128260
SPEECH_GENERATION_END_ID = TAG_IDS[SPEECH_GENERATION_END]  # 128261

CODEC_OFFSET = LLAMA3_VOCAB_SIZE + len(TAGS)  # 128264: id of <|s_0|>
CODEBOOK_SIZE = 65_536  # XCodec2: FSQ with 8 dimensions of 4 levels, 4**8 codes
VOCAB_SIZE = CODEC_OFFSET + CODEBOOK_SIZE  # 193800


SPEECH_TOKEN_RE = re.compile(r"<\|s_(\d+)\|>")
"""A codec token as a decoded response spells it, ``<|s_N|>`` (group 1: N, any digits; range checks are the
caller's)."""
SPECIAL_TOKEN_RE = re.compile(r"<\|[^|]*\|>")
"""Any of Llasa's added tokens as decoded text, ``<|...|>``: a tag or a codec token."""


def speech_token(code: int) -> str:
    """The token string of codec id ``code``: ``<|s_{code}|>``."""
    if not 0 <= code < CODEBOOK_SIZE:
        raise ValueError(f"codec id {code} out of range [0, {CODEBOOK_SIZE})")
    return f"<|s_{code}|>"


@dataclass(frozen=True)
class LlasaVocabulary:
    """Where Llasa's speech tags and codec tokens sit: codec id c is vocabulary id ``offset + c``."""

    offset: int = CODEC_OFFSET
    codebook_size: int = CODEBOOK_SIZE
    start_id: int = SPEECH_GENERATION_START_ID
    end_id: int = SPEECH_GENERATION_END_ID

    def expected_ids(self) -> dict[str, int]:
        """Token -> id for Llasa's 8 tags (a contiguous run around ``start_id``) and both ends of the code run.

        The codes are added in order, so the two ends pin the whole run."""
        first_tag = self.start_id - TAGS.index(SPEECH_GENERATION_START)
        last = self.codebook_size - 1
        return {
            **{tag: first_tag + i for i, tag in enumerate(TAGS)},
            SPEECH_GENERATION_END: self.end_id,
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
                    else f"the Llasa layout puts it at {want}"
                )
                problems.append(f"the tokenizer maps {token} to id {got}, but {where}")
        if problems:
            raise ValueError("; ".join(problems) + " (codec.offset must be the id of <|s_0|> in your tokenizer)")

    @classmethod
    def from_tokenizer(cls, tokenizer, codebook_size: int = CODEBOOK_SIZE) -> LlasaVocabulary:
        """Read the layout off ``tokenizer`` (tag ids, ``<|s_0|>``) and check that the codes are contiguous."""
        unknown = getattr(tokenizer, "unk_token_id", None)
        ids = {
            token: tokenizer.convert_tokens_to_ids(token)
            for token in (SPEECH_GENERATION_START, SPEECH_GENERATION_END, "<|s_0|>")
        }
        missing = [token for token, i in ids.items() if i is None or i == unknown]
        if missing:
            raise ValueError(f"tokenizer lacks Llasa's token(s) {missing}")
        vocabulary = cls(
            offset=ids["<|s_0|>"],
            codebook_size=codebook_size,
            start_id=ids[SPEECH_GENERATION_START],
            end_id=ids[SPEECH_GENERATION_END],
        )
        vocabulary.check_tokenizer(tokenizer)
        return vocabulary


LLASA_1B = LlasaVocabulary()
"""Llasa-1B's layout (the constants above)."""
