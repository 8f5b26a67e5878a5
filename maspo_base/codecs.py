"""Codec backends by name: what turns a response's codec ids into a 16 kHz waveform.

- ``xcodec2``: XCodec2's decoder (`maspo_base.xcodec2_decoder.XCodec2Decoder`), Llasa-1B's codec; a checkpoint
  directory or a hub id;
- ``mel_fsq``: the mini codec (`maspo_base.mel_codec.MelFsqCodec`), the small speaking model's; a checkpoint
  directory.

A codec spec, wherever one is given (``reward_kwargs.codec``, ``--codec``, ``trainer.samples.codec``), is
``NAME:PATH`` or a bare ``PATH``: a directory whose ``config.json`` says ``"model_type": "mel_fsq"`` is the mini
codec, anything else XCodec2 (as before there was a choice). Every backend has XCodec2's decoding interface::

    codec.decode(codes: list[np.ndarray], max_batch, pad_multiple) -> list[np.ndarray]   # 16 kHz, 320 samples/code
    codec.codebook_size, codec.sample_rate, codec.hop_length

Prompt speech (voice cloning) is encoded by the same spec's encoder (`load_encoder`): XCodec2's
(`maspo_base.xcodec2_encoder.XCodec2Encoder`, from a checkpoint that holds the encoder's weights) or the mini codec's
(`maspo_base.mel_codec.MelFsqCodec.encode_waveforms`).

A response's token ids are read with a speech-token layout whose codebook is the codec's (`codec_layout`): codes
at or above ``codec.codebook_size`` are gated as ``code_out_of_range`` before the codec sees them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from maspo_base.registry import Registry
from maspo_base.speech_tokens.layouts import LLASA_1B, SpeechTokenLayout, get_layout


class Codec(Protocol):
    """What the reward, the listening page and ``eval`` use of a codec backend."""

    codebook_size: int
    sample_rate: int
    hop_length: int

    def decode(self, codes: Any, max_batch: int = 16, pad_multiple: int = 1) -> list[np.ndarray]: ...


CODECS = Registry("codec backend")
"""Name -> ``loader(path, device, dtype)``."""


@CODECS.register("xcodec2")
def _load_xcodec2(path: str, device: str = "cpu", dtype: torch.dtype = torch.float32):
    from maspo_base.xcodec2_decoder import XCodec2Decoder

    return XCodec2Decoder.from_pretrained(path, device=device, dtype=dtype)


@CODECS.register("mel_fsq")
def _load_mel_fsq(path: str, device: str = "cpu", dtype: torch.dtype = torch.float32):
    from maspo_base.mel_codec import MelFsqCodec

    return MelFsqCodec.from_pretrained(path, device=device)


@dataclass(frozen=True)
class Encoder:
    """A codec's encoder: ``encode(wav)`` maps 16 kHz mono float audio to codec ids in ``[0, codebook_size)``."""

    encode: Callable[[np.ndarray], np.ndarray]
    codebook_size: int


ENCODERS = Registry("codec encoder")
"""Name (as in `CODECS`) -> ``loader(path, device) -> Encoder``."""


@ENCODERS.register("xcodec2")
def _xcodec2_encoder(path: str, device: str = "cpu") -> Encoder:
    from maspo_base.xcodec2_decoder import XCodec2Decoder
    from maspo_base.xcodec2_encoder import XCodec2Encoder

    return Encoder(XCodec2Encoder.from_pretrained(path, device=device).encode, XCodec2Decoder.codebook_size)


@ENCODERS.register("mel_fsq")
def _mel_fsq_encoder(path: str, device: str = "cpu") -> Encoder:
    from maspo_base.mel_codec import MelFsqCodec

    codec = MelFsqCodec.from_pretrained(path, device=device)
    return Encoder(lambda wav: codec.encode_waveforms([wav])[0], codec.codebook_size)


def split_codec_spec(spec: str) -> tuple[str, str]:
    """``(backend name, path)`` of a codec spec (module docstring); an unknown ``NAME:`` prefix is part of a path."""
    name, sep, rest = str(spec).partition(":")
    if sep and name in CODECS:
        return name, rest
    from maspo_base.mel_codec import MODEL_TYPE

    config = Path(spec).expanduser() / "config.json"
    if config.is_file():
        try:
            model_type = json.loads(config.read_text()).get("model_type")
        except (OSError, ValueError, AttributeError):
            model_type = None
        if model_type == MODEL_TYPE:
            return "mel_fsq", str(spec)
    return "xcodec2", str(spec)


def load_codec(spec: str, device: str = "cpu", dtype: torch.dtype = torch.float32) -> Any:
    """The codec a spec names, loaded on ``device`` (``dtype``: XCodec2's compute dtype)."""
    name, path = split_codec_spec(spec)
    return CODECS.lookup(name)(path, device=device, dtype=dtype)


def load_encoder(spec: str, device: str = "cpu") -> Encoder:
    """The encoder of the codec a spec names, loaded on ``device``."""
    name, path = split_codec_spec(spec)
    return ENCODERS.lookup(name)(path, device=device)


def codec_layout(codec: Codec, layout: str | SpeechTokenLayout | None = None) -> SpeechTokenLayout:
    """The speech-token layout that reads responses for ``codec``.

    ``layout`` (a registered name or a layout) must have the codec's codebook; None is Llasa-1B's ids with the
    codec's codebook (Llasa-1B's own when the codec declares none). ``ValueError`` naming both sizes otherwise."""
    size = getattr(codec, "codebook_size", None)
    if layout is None:
        if size is None or size == LLASA_1B.codebook_size:
            return LLASA_1B
        return LLASA_1B.replace(codebook_size=int(size), fsq_levels=None)
    chosen = get_layout(layout) if isinstance(layout, str) else layout
    if size is not None and chosen.codebook_size != size:
        raise ValueError(
            f"layout {chosen.name!r} has {chosen.codebook_size} codes but the codec has {size}: "
            "choose the layout of the model that speaks with this codec"
        )
    return chosen
