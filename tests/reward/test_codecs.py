"""Codec backends by name (`maspo_base.codecs`): how a spec picks a backend, loading the mini codec and its encoder
by spec, and the layout that reads responses for a codec."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from maspo_base.codecs import CODECS, ENCODERS, codec_layout, load_codec, load_encoder, split_codec_spec
from maspo_base.mel_codec import MelFsqCodec
from maspo_base.speech_tokens.layouts import LLASA_1B, MINI_LLASA


@pytest.fixture(scope="module")
def mini_codec(tmp_path_factory):
    torch.manual_seed(0)
    return MelFsqCodec(channels=16, griffin_lim_iters=2).save_pretrained(tmp_path_factory.mktemp("mel") / "codec")


def test_the_backends():
    assert sorted(CODECS) == sorted(ENCODERS) == ["mel_fsq", "xcodec2"]


def test_a_named_spec_is_that_backend_and_its_path():
    assert split_codec_spec("mel_fsq:/x") == ("mel_fsq", "/x")
    assert split_codec_spec("xcodec2:/x") == ("xcodec2", "/x")
    assert split_codec_spec("xcodec2:HKUSTAudio/xcodec2") == ("xcodec2", "HKUSTAudio/xcodec2")
    assert split_codec_spec("mel_fsq:/a:b") == ("mel_fsq", "/a:b")  # only the first colon separates


def test_a_bare_path_is_the_mini_codec_only_when_its_config_says_so(tmp_path):
    mel, other, broken, empty = (tmp_path / name for name in ("mel", "other", "broken", "empty"))
    for folder in (mel, other, broken, empty):
        folder.mkdir()
    (mel / "config.json").write_text(json.dumps({"model_type": "mel_fsq", "channels": 16}))
    (other / "config.json").write_text(json.dumps({"model_type": "xcodec2", "codec_decoder_hidden_size": 1024}))
    (broken / "config.json").write_text("{not json")
    assert split_codec_spec(str(mel)) == ("mel_fsq", str(mel))
    assert split_codec_spec(mel) == ("mel_fsq", str(mel))  # a Path too
    assert split_codec_spec(str(other)) == ("xcodec2", str(other))
    assert split_codec_spec(str(broken)) == ("xcodec2", str(broken))
    assert split_codec_spec(str(empty)) == ("xcodec2", str(empty))
    assert split_codec_spec("HKUSTAudio/xcodec2") == ("xcodec2", "HKUSTAudio/xcodec2")  # a hub id
    assert split_codec_spec("other:/x") == ("xcodec2", "other:/x")  # an unknown prefix is part of the path


def test_load_codec_by_bare_path_or_name_is_the_saved_model(mini_codec):
    saved = MelFsqCodec.from_pretrained(mini_codec)
    codes = [np.array([1, 2, 3, 1000]), np.array([682, 682])]
    for spec in (str(mini_codec), f"mel_fsq:{mini_codec}"):
        codec = load_codec(spec)
        assert isinstance(codec, MelFsqCodec) and codec.codebook_size == 1024
        for a, b in zip(codec.decode(codes), saved.decode(codes)):
            np.testing.assert_array_equal(a, b)
    with pytest.raises(FileNotFoundError, match="lacks config.json, model.safetensors"):
        load_codec(f"mel_fsq:{mini_codec.parent / 'absent'}")


def test_load_encoder_of_the_mini_codec(mini_codec):
    encoder = load_encoder(str(mini_codec))
    wav = 0.1 * np.random.default_rng(1).standard_normal(3200).astype(np.float32)
    assert encoder.codebook_size == 1024
    np.testing.assert_array_equal(
        encoder.encode(wav), MelFsqCodec.from_pretrained(mini_codec).encode_waveforms([wav])[0]
    )
    assert len(encoder.encode(wav)) == 10


class _Codec:
    def __init__(self, codebook_size=None):
        if codebook_size is not None:
            self.codebook_size = codebook_size


def test_the_layout_that_reads_responses_for_a_codec():
    assert codec_layout(_Codec(65536)) is LLASA_1B and codec_layout(_Codec()) is LLASA_1B
    llasa_ids = codec_layout(_Codec(1024))  # Llasa-1B's ids, the codec's codebook
    assert (llasa_ids.offset, llasa_ids.end_id, llasa_ids.codebook_size, llasa_ids.fsq) == (128264, 128261, 1024, None)
    assert codec_layout(_Codec(1024), "mini-llasa") is MINI_LLASA
    assert codec_layout(_Codec(1024), MINI_LLASA) is MINI_LLASA and codec_layout(_Codec(), MINI_LLASA) is MINI_LLASA
    with pytest.raises(ValueError, match="layout 'mini-llasa' has 1024 codes but the codec has 65536"):
        codec_layout(_Codec(65536), "mini-llasa")
    with pytest.raises(ValueError, match="unknown speech-token layout 'x'"):
        codec_layout(_Codec(1024), "x")


def test_load_codec_of_an_xcodec2_checkpoint(tiny_codec_dir):
    from maspo_base.xcodec2_decoder import XCodec2Decoder

    for spec in (str(tiny_codec_dir), f"xcodec2:{tiny_codec_dir}"):
        codec = load_codec(spec)
        assert isinstance(codec, XCodec2Decoder)
        assert (codec.codebook_size, codec.sample_rate, codec.hop_length) == (65536, 16000, 320)
        assert codec_layout(codec) is LLASA_1B
