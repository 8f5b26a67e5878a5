"""A tiny build of the speaking testbed, once per session: a corpus of a few real flite sentences, a codec and a
mini-llasa trained for a few steps on it (the real commands' code, at sizes that take seconds)."""

from __future__ import annotations

import pytest

TINY_SIZE = dict(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=64, max_positions=512)


@pytest.fixture(scope="session")
def tiny_fortunes(tmp_path_factory):
    root = tmp_path_factory.mktemp("fortunes")
    (root / "cookie").write_text(
        "Keep away from fire or flame.\n%\nWhy do we have two eyes?\n%\nThe secret of success is sincerity.\n%\n"
        "Nobody knows what goes on in these places.\n%\nStay away from flying saucers today.\n"
    )
    return root


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory, tiny_fortunes):
    from maspo_lab.speaking_model.corpus import build_corpus

    return build_corpus(
        tmp_path_factory.mktemp("corpus"),
        sentences=5,
        voices=("rms", "slt"),
        heldout_fraction=0.3,
        source=tiny_fortunes,
        log=lambda _: None,
    )


@pytest.fixture(scope="session")
def tiny_codec(tmp_path_factory, tiny_corpus):
    from maspo_lab.speaking_model.codec_training import CodecSettings, train_codec

    settings = CodecSettings(steps=3, batch=2, crop_frames=32, channels=8, threads=1)
    return train_codec(tiny_corpus, tmp_path_factory.mktemp("codec"), settings, log=lambda _: None)


@pytest.fixture(scope="session")
def tiny_mini_llasa(tmp_path_factory, tiny_corpus, tiny_codec):
    from maspo_lab.speaking_model.model import ModelSize
    from maspo_lab.speaking_model.training import TrainSettings, train_model

    settings = TrainSettings(
        voices=("rms",), steps=3, tokens_per_batch=512, warmup_steps=1, eval_every=2, threads=1, dropout=0.0
    )
    out = tmp_path_factory.mktemp("mini_llasa")
    return train_model(tiny_corpus, tiny_codec, out, settings, ModelSize(**TINY_SIZE), log=lambda _: None)
