"""Speech-token layouts: where a TTS language model's vocabulary holds its codec's codes, declared per model.

Every model here spells its speech as Llasa does (`maspo_base.speech_tokens.llasa_tokens`: the 8 tags, one
``<|s_N|>`` token per codec id N); what differs between models is where those tokens sit and what the codes are::

    vocab id = offset + codec id,   codec id in [0, codebook_size)
    start_id = id of <|SPEECH_GENERATION_START|>,   end_id = id of <|SPEECH_GENERATION_END|>
    frame_rate: codes per second of audio;   fsq_levels: the codec's FSQ lattice (None: codes have no digits)

A `SpeechTokenLayout` (the type and the registry: `maspo_base.speech_tokens.speech_token_layout`) carries these
values; the segmenters, the reward's parser, segment credit and the listening page read them from it and from nothing
else. Layouts are registered by name (`register_layout`, `get_layout`); importing this module registers the built-in
ones, ``llasa-1b`` (Llasa-1B with XCodec2, here) and ``mini-llasa`` (the small model that speaks,
`maspo_base.speech_tokens.mini_llasa_tokens`). A third model family is a third layout: register it in a module of
your own and name it in ``maspo.codec.layout``.
"""

from __future__ import annotations

from . import llasa_tokens as lt
from .mini_llasa_tokens import MINI_LLASA
from .speech_token_layout import LAYOUTS, SpeechTokenLayout, register_layout

__all__ = ["LAYOUTS", "LLASA_1B", "MINI_LLASA", "SpeechTokenLayout", "get_layout", "register_layout"]


def get_layout(name: str) -> SpeechTokenLayout:
    """The registered layout ``name`` (``ValueError`` listing the registered ones otherwise)."""
    return LAYOUTS.lookup(name)


LLASA_1B = register_layout(
    SpeechTokenLayout(
        name="llasa-1b",
        offset=lt.CODEC_OFFSET,
        codebook_size=lt.CODEBOOK_SIZE,
        start_id=lt.SPEECH_GENERATION_START_ID,
        end_id=lt.SPEECH_GENERATION_END_ID,
        frame_rate=50,
        fsq_levels=(4,) * 8,
        codec="xcodec2",
    )
)
"""Llasa-1B (Llama-3.2 ids, 8 tags, 65,536 XCodec2 codes: FSQ 8 dimensions x 4 levels, 50 per second)."""
