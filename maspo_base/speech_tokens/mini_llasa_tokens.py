"""The vocabulary of mini-llasa, the small model that speaks (`maspo_lab.speaking_model`), and its layout.

Llasa-1B's prompt format and token spelling in 1,137 ids instead of 193,800, in this order::

    0..6      Llama-3.2's special tokens the prompt uses, and an unknown-character token (`SPECIAL_TOKENS`)
    7..14     Llasa's 8 tags (<|SPEECH_GENERATION_START|> 11, <|SPEECH_GENERATION_END|> 12)
    15, 16    the prompt's two fixed texts, one token each (`PROMPT_PIECES`)
    17..112   one token per character (`CHARACTERS`: newline and printable ASCII)
    113..1136 <|s_0|> .. <|s_1023|>: the mini codec's codes (`maspo_base.mel_codec`, FSQ 5 dimensions x 4 levels)

Text is read one character at a time; the fixed texts of Llasa's prompt (the system block's dates, "Convert the text
to speech:") are single tokens so that a prompt costs about 20 tokens plus one per character.
"""

from __future__ import annotations

import string

from . import llasa_tokens as lt
from .llasa_prompt import SYSTEM_HEADER_TEXT, USER_PROMPT
from .speech_token_layout import SpeechTokenLayout, register_layout

SPECIAL_TOKENS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|finetune_right_pad_id|>",
    "<|unk|>",
)
BOS, EOS, _, _, EOT, PAD, UNK = SPECIAL_TOKENS
PROMPT_PIECES = (SYSTEM_HEADER_TEXT, USER_PROMPT.split(lt.TEXT_UNDERSTANDING_START)[0])
CHARACTERS = "\n" + "".join(chr(c) for c in range(32, 127))
assert set(string.printable) - set(CHARACTERS) <= set("\t\r\x0b\x0c")

FSQ_LEVELS = (4, 4, 4, 4, 4)
CODEBOOK_SIZE = 4**5
TAG_START = len(SPECIAL_TOKENS)
CODEC_OFFSET = TAG_START + len(lt.TAGS) + len(PROMPT_PIECES) + len(CHARACTERS)  # 113
VOCAB_SIZE = CODEC_OFFSET + CODEBOOK_SIZE  # 1137


def vocabulary() -> list[str]:
    """Every token in id order."""
    codes = [lt.speech_token(c) for c in range(CODEBOOK_SIZE)]
    return [*SPECIAL_TOKENS, *lt.TAGS, *PROMPT_PIECES, *CHARACTERS, *codes]


MINI_LLASA = register_layout(
    SpeechTokenLayout(
        name="mini-llasa",
        offset=CODEC_OFFSET,
        codebook_size=CODEBOOK_SIZE,
        start_id=TAG_START + lt.TAGS.index(lt.SPEECH_GENERATION_START),
        end_id=TAG_START + lt.TAGS.index(lt.SPEECH_GENERATION_END),
        frame_rate=50,
        fsq_levels=FSQ_LEVELS,
        codec="mel_fsq",
    )
)
"""mini-llasa with the mini codec: 1,024 codes at 50 per second."""
