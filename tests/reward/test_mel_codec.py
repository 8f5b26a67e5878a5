"""The mini codec (`maspo_base.mel_codec.MelFsqCodec`) with random weights: its checkpoint format, the decoding
interface the reward relies on (XCodec2Decoder's), and the encoder's frames."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from maspo_base.mel_codec import HOP_LENGTH, MelFsqCodec

CODES = [np.array([0, 1023, 682, 682, 5, 17, 900, 3]), np.array([1, 2, 3, 4, 5, 6, 7, 8]), np.array([682] * 3)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    torch.manual_seed(0)
    codec = MelFsqCodec(channels=16, griffin_lim_iters=4)
    with torch.no_grad():  # non-trivial normalisation statistics, which the checkpoint must keep too
        codec.mel_mean.uniform_(-8, -2)
        codec.mel_std.uniform_(1, 3)
    return codec, codec.save_pretrained(tmp_path_factory.mktemp("mel") / "codec")


def test_the_codec_interface():
    codec = MelFsqCodec(levels=(8, 5, 5, 5), channels=8)
    assert (codec.codebook_size, codec.sample_rate, codec.hop_length) == (1000, 16000, 320)
    assert MelFsqCodec(channels=8).codebook_size == 1024


def test_from_pretrained_gives_the_same_model(saved):
    codec, path = saved
    config = json.loads((path / "config.json").read_text())
    assert config == {"model_type": "mel_fsq", **codec.config}
    assert config["channels"] == 16 and config["levels"] == [4] * 5 and config["griffin_lim_iters"] == 4
    loaded = MelFsqCodec.from_pretrained(path)
    assert not loaded.training
    original, again = codec.state_dict(), loaded.state_dict()
    assert original.keys() == again.keys() and all(torch.equal(original[k], again[k]) for k in original)
    for a, b in zip(codec.decode(CODES), loaded.decode(CODES)):
        np.testing.assert_array_equal(a, b)


def test_loading_is_strict_and_names_what_is_wrong(saved, tmp_path):
    from safetensors.torch import load_file, save_file

    _, path = saved
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((path / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match=r"mini codec checkpoint .*broken lacks model.safetensors"):
        MelFsqCodec.from_pretrained(broken)
    weights = load_file(str(path / "model.safetensors"))
    del weights["decoder.0.weight"]
    save_file(weights, str(broken / "model.safetensors"))
    with pytest.raises(ValueError, match=r"broken does not match its config.json: missing \['decoder.0.weight'\]"):
        MelFsqCodec.from_pretrained(broken)
    config = json.loads((path / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "model_type": "xcodec2"}))
    with pytest.raises(ValueError, match="config.json has model_type 'xcodec2'; a mini codec's is 'mel_fsq'"):
        MelFsqCodec.from_pretrained(broken)


def test_decode_gives_320_samples_a_code_in_input_order(saved):
    codec, _ = saved
    codes = [*CODES, np.array([7]), np.array([7, 7])]  # a single code: too short for the STFT's reflection
    audio = codec.decode(codes, max_batch=2)
    assert [len(a) for a in audio] == [320 * len(c) for c in codes] == [2560, 2560, 960, 320, 640]
    for wav in audio:
        assert wav.dtype == np.float32 and np.isfinite(wav).all() and np.abs(wav).max() > 0


def test_a_sequence_sounds_the_same_whatever_is_decoded_with_it_and_call_after_call(saved):
    """Bit for bit: a response's audio (and so what Whisper hears of it) must not depend on its batch mates; batched
    convolutions and Griffin-Lim gave differences of 1e-5 here and 1e-3 on mini-llasa's codec."""
    codec, _ = saved
    rng = np.random.default_rng(0)
    one_length = [rng.integers(0, 1024, 150) for _ in range(6)]
    alone = [codec.decode([c])[0] for c in one_length]
    for together in (codec.decode(one_length), codec.decode(one_length[::-1])[::-1], codec.decode(one_length)):
        for a, b in zip(alone, together):
            np.testing.assert_array_equal(a, b)
    assert not np.allclose(alone[0], alone[1], atol=1e-3)  # different codes, different audio


def test_decode_refuses_padding_an_empty_sequence_and_no_batch(saved):
    codec, _ = saved
    with pytest.raises(ValueError, match="pad_multiple 1, got 16, 50"):
        codec.decode(CODES, max_batch=16, pad_multiple=50)
    with pytest.raises(ValueError, match="max_batch must be >= 1"):
        codec.decode(CODES, max_batch=0)
    with pytest.raises(ValueError, match=r"codes\[1\] is empty: gate empty responses before decoding"):
        codec.decode([CODES[0], np.array([], dtype=np.int64)])


def test_encode_gives_one_code_per_whole_frame(saved):
    codec, _ = saved
    rng = np.random.default_rng(0)
    lengths = [16000, 16319, 640, 320, 319]
    wavs = [0.1 * rng.standard_normal(n).astype(np.float32) for n in lengths]
    encoded = codec.encode_waveforms(wavs)
    assert [len(c) for c in encoded] == [n // HOP_LENGTH for n in lengths] == [50, 50, 2, 1, 0]
    for codes in encoded:
        assert codes.dtype == np.int64 and ((0 <= codes) & (codes < 1024)).all()
    assert len(set(encoded[0].tolist())) > 1  # noise is not one code
    # the encoder reads whole frames only: the 319 samples past the 50th frame change nothing
    np.testing.assert_array_equal(codec.encode_waveforms([wavs[1][:16000]])[0], encoded[1])
    # the codes decode back to audio of the frames' length
    assert len(codec.decode([encoded[0]])[0]) == 16000
