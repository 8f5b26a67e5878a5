"""Codec backends by name: what turns a response's codec ids into a 16 kHz waveform.

- ``xcodec2``: XCodec2's decoder (`reward_fns.codec.XCodec2Decoder`), Llasa-1B's codec; a checkpoint directory or a
  hub id;
- ``mel_fsq``: the mini codec (`reward_fns.mel_codec.MelFsqCodec`), the small speaking model's; a checkpoint
  directory.

A codec spec, wherever one is given (``reward_kwargs.codec``, ``--codec``, ``trainer.samples.codec``), is
``NAME:PATH`` or a bare ``PATH``: a directory whose ``config.json`` says ``"model_type": "mel_fsq"`` is the mini
codec, anything else XCodec2 (as before there was a choice). Every backend has XCodec2's decoding interface::

    codec.decode(codes: list[np.ndarray], max_batch, pad_multiple) -> list[np.ndarray]   # 16 kHz, 320 samples/code
    codec.codebook_size, codec.sample_rate, codec.hop_length
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from .registry import Registry

CODECS = Registry("codec backend")
"""Name -> ``loader(path, device, dtype)``."""


@CODECS.register("xcodec2")
def _load_xcodec2(path: str, device: str = "cpu", dtype: torch.dtype = torch.float32):
    from .codec import XCodec2Decoder

    return XCodec2Decoder.from_pretrained(path, device=device, dtype=dtype)


@CODECS.register("mel_fsq")
def _load_mel_fsq(path: str, device: str = "cpu", dtype: torch.dtype = torch.float32):
    from .mel_codec import MelFsqCodec

    return MelFsqCodec.from_pretrained(path, device=device)


def split_codec_spec(spec: str) -> tuple[str, str]:
    """``(backend name, path)`` of a codec spec (module docstring); an unknown ``NAME:`` prefix is part of a path."""
    name, sep, rest = str(spec).partition(":")
    if sep and name in CODECS:
        return name, rest
    from .mel_codec import MODEL_TYPE

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
