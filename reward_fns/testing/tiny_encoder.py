"""A tiny, randomly initialised full XCodec2 checkpoint (encoder and decoder) in XCodec2's on-disk layout."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from maspo_base.xcodec2_decoder import XCodec2Decoder
from maspo_base.xcodec2_encoder import XCodec2Encoder
from reward_fns.testing.tiny_models import TINY_CODEC

TINY_ENCODER = {
    "semantic_hidden_size": 32,
    "codec_encoder_hidden_size": 224,
    "semantic_layers": 16,
    "semantic_heads": 2,
    "semantic_intermediate_size": 64,
    "encoder_ngf": 4,
}


def write_tiny_xcodec2_with_encoder(directory: str | Path, seed: int = 0) -> Path:
    """A full XCodec2 checkpoint (encoder + decoder, random, about 1M parameters) in XCodec2's layout."""
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    decoder = XCodec2Decoder(**TINY_CODEC)
    config = {**decoder.config, **TINY_ENCODER}
    encoder = XCodec2Encoder(config)
    encoder.generator.quantizer.load_state_dict(decoder.generator.quantizer.state_dict())
    # default init leaves the FSQ inputs near 0 (every frame the zero code); wider weights spread the codes
    nn.init.normal_(encoder.fc_prior.weight, std=1.0)
    state = {**decoder.state_dict(), **encoder.state_dict()}
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({"model_type": "xcodec", **config}, indent=2))
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(root / "model.safetensors"))
    return root
