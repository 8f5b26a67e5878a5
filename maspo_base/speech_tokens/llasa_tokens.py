"""Llasa-1B's token layout (HKUSTAudio/Llasa-1B).

Llasa-1B extends the Llama-3.2 tokenizer (128,256 ids) with 8 tags and then one token per XCodec2 code::

    128256 <|TEXT_GENERATION_START|>      128260 <|SPEECH_GENERATION_START|>
    128257 <|TEXT_GENERATION_END|>        128261 <|SPEECH_GENERATION_END|>
    128258 <|TEXT_UNDERSTANDING_START|>   128262 <|SPEECH_UNDERSTANDING_START|>
    128259 <|TEXT_UNDERSTANDING_END|>     128263 <|SPEECH_UNDERSTANDING_END|>
    128264 + c  <|s_c|>   for codec id c in [0, 65536)

so ``vocab id = CODEC_OFFSET + codec id`` and the vocabulary has ``CODEC_OFFSET + CODEBOOK_SIZE = 193,800`` ids.
Every model here spells its speech with these tags and ``<|s_N|>`` tokens; where they sit is a model's layout
(`maspo_base.speech_tokens.layouts`: `LLASA_1B` carries the positions above as values, and a fine-tuned variant may
place the codes elsewhere). Every other id in a response (the end tag, stray text) is *non-speech*.
"""

from __future__ import annotations

import re

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
