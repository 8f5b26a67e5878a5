"""XCodec2's real decoder classes with tiny random weights, loaded from a directory the test writes."""

import json
import sys
import types

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from maspo_base.xcodec2_compat import import_xcodec2_module
from maspo_base.xcodec2_decoder import HOP_LENGTH, XCodec2Decoder
from reward_fns.testing.tiny_models import random_codes


@pytest.fixture(scope="module")
def decoder(tiny_codec_dir):
    return XCodec2Decoder.from_pretrained(tiny_codec_dir)


def test_random_weights_decoder_loads_the_saved_weights_from_its_directory(tiny_codec_dir, decoder):
    saved = load_file(str(tiny_codec_dir / "model.safetensors"))
    loaded = decoder.state_dict()
    assert set(saved) == set(loaded)
    for key in ("fc_post_a.weight", "generator.quantizer.project_out.weight", "generator.head.out.weight"):
        torch.testing.assert_close(loaded[key], saved[key], rtol=0, atol=0)
    assert not decoder.training  # dropout off


def test_random_weights_decode_gives_320_samples_per_token(decoder):
    audio = decoder.decode([random_codes(n, seed=n) for n in (1, 7, 50)])
    assert [a.shape for a in audio] == [(HOP_LENGTH,), (7 * HOP_LENGTH,), (50 * HOP_LENGTH,)]
    assert all(a.dtype == np.float32 and np.isfinite(a).all() and np.abs(a).max() > 0 for a in audio)


def test_random_weights_batched_decode_equals_one_by_one(decoder):
    codes = [random_codes(n, seed=i) for i, n in enumerate([40, 13, 40, 27, 13, 40])]
    batched = decoder.decode(codes, max_batch=2)
    for c, b in zip(codes, batched):
        np.testing.assert_allclose(b, decoder.decode([c])[0], rtol=0, atol=1e-5)  # measured: <= 1.4e-7
    # and the outputs really differ by input: no row mix-up
    assert np.abs(batched[0] - batched[2]).max() > 1e-3


def test_random_weights_decode_matches_upstream_decode_code(decoder):
    """Same numbers as ``XCodec2Model.decode_code`` of the xcodec2 package on the same modules."""
    upstream = import_xcodec2_module("xcodec2.modeling_xcodec2").XCodec2Model.decode_code
    codes = torch.from_numpy(np.stack([random_codes(30, seed=1), random_codes(30, seed=2)]))
    expected = upstream(types.SimpleNamespace(generator=decoder.generator, fc_post_a=decoder.fc_post_a), codes[:, None])
    torch.testing.assert_close(decoder.decode_codes(codes), expected[:, 0], rtol=0, atol=1e-6)
    assert "torchaudio" not in sys.modules  # the import stand-in did not leak


def test_padded_batching_keeps_lengths_but_is_approximate(decoder):
    codes = [random_codes(37, seed=3), random_codes(40, seed=4)]
    padded = decoder.decode(codes, pad_multiple=8)
    assert [len(a) for a in padded] == [37 * HOP_LENGTH, 40 * HOP_LENGTH]
    np.testing.assert_allclose(padded[1], decoder.decode([codes[1]])[0], atol=1e-5)  # 40 needs no padding
    assert np.abs(padded[0] - decoder.decode([codes[0]])[0]).max() > 0  # 37 was padded to 40


def test_full_checkpoint_keys_are_ignored_and_mismatches_are_named(tmp_path, tiny_codec_dir, decoder):
    # A real XCodec2 checkpoint also holds the encoders: they must not be needed or read.
    state = load_file(str(tiny_codec_dir / "model.safetensors"))
    state["semantic_model.encoder.w"] = torch.zeros(3)
    state["CodecEnc.conv.weight"] = torch.zeros(3)
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((tiny_codec_dir / "config.json").read_text())
    assert XCodec2Decoder.from_pretrained(tmp_path).decode([random_codes(5, 0)])[0].shape == (5 * HOP_LENGTH,)

    config = json.loads((tiny_codec_dir / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "decoder_depth": 2}))
    with pytest.raises(ValueError, match="missing .*transformers.1"):
        XCodec2Decoder.from_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        XCodec2Decoder.from_pretrained(tmp_path / "nowhere")
