"""XCodec2's encoder built offline (no w2v-bert download) from a checkpoint directory, tiny random weights."""

from __future__ import annotations

import json
import types

import numpy as np
import pytest
import torch

from maspo_base.xcodec2_compat import import_xcodec2_module
from maspo_base.xcodec2_decoder import XCodec2Decoder
from maspo_base.xcodec2_encoder import XCodec2Encoder
from reward_fns.testing.tiny_encoder import write_tiny_xcodec2_with_encoder


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_tiny_xcodec2_with_encoder(tmp_path_factory.mktemp("xcodec2_full_random"))


def test_random_weights_encode_matches_upstream_encode_code(checkpoint):
    """Same ids as ``XCodec2Model.encode_code`` of the xcodec2 package on the same modules."""
    encoder = XCodec2Encoder.from_pretrained(checkpoint)
    generator = XCodec2Decoder.from_pretrained(checkpoint).generator  # upstream quantizes through the generator
    upstream = import_xcodec2_module("xcodec2.modeling_xcodec2").XCodec2Model.encode_code
    modules = {
        name: getattr(encoder, name)
        for name in ("feature_extractor", "semantic_model", "SemanticEncoder_module", "CodecEnc", "fc_prior")
    }
    model = types.SimpleNamespace(**modules, generator=generator, device=torch.device("cpu"))
    wav = (0.1 * np.random.default_rng(0).standard_normal(12_345)).astype(np.float32)
    expected = upstream(model, torch.from_numpy(wav)[None]).reshape(-1).numpy()
    codes = encoder.encode(wav)
    np.testing.assert_array_equal(codes, expected)
    assert len(codes) == 12_345 // 320 + 1 and len(set(codes.tolist())) > 10


def test_decoding_the_codes_gives_320_samples_each(checkpoint):
    codes = XCodec2Encoder.from_pretrained(checkpoint).encode(np.zeros(3200, dtype=np.float32))
    audio = XCodec2Decoder.from_pretrained(checkpoint).decode([codes])[0]
    assert len(audio) == 320 * len(codes)


def test_a_decoder_only_checkpoint_is_named_as_lacking_the_encoder(tmp_path, tiny_codec_dir):
    config = json.loads((tiny_codec_dir / "config.json").read_text())
    assert "semantic_layers" not in config
    with pytest.raises(ValueError, match="semantic_hidden_size \\+ codec_encoder_hidden_size"):
        XCodec2Encoder.from_pretrained(tiny_codec_dir)  # a decoder-only dir: its vq_dim does not fit the defaults
