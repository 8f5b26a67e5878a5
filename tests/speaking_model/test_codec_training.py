"""Training the mini codec on a tiny corpus: the checkpoint a bare path loads as the mini codec, and its record."""

from __future__ import annotations

import json

import numpy as np

from maspo_base.codecs import load_codec, split_codec_spec
from maspo_base.mel_codec import MelFsqCodec


def test_a_trained_codec_is_the_mini_codec_by_its_folder_and_codes_its_corpus(tiny_codec, tiny_corpus):
    from maspo_lab.speaking_model.corpus import load_audio, read_manifest

    assert split_codec_spec(str(tiny_codec)) == ("mel_fsq", str(tiny_codec))
    codec = load_codec(str(tiny_codec))
    assert isinstance(codec, MelFsqCodec) and codec.codebook_size == 1024
    record = json.loads((tiny_codec / "training.json").read_text())
    assert record["codebook_size"] == 1024 and record["history"][-1]["step"] == 3
    assert np.isfinite(record["history"][-1]["loss"])
    utterance = read_manifest(tiny_corpus, split="train")[0]
    audio = load_audio(tiny_corpus, utterance)
    (codes,) = codec.encode_waveforms([audio])
    (decoded,) = codec.decode([codes])
    assert len(decoded) == 320 * len(codes) == 320 * (len(audio) // 320) and np.isfinite(decoded).all()
    # the normalisation was measured on the corpus, not left at its initial values
    assert not np.allclose(codec.mel_mean.numpy(), 0.0) and not np.allclose(codec.mel_std.numpy(), 1.0)
