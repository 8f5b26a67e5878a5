"""Fixtures of the speech reward tests: tiny randomly initialised checkpoints written once per session."""

from __future__ import annotations

import pytest

from reward_fns.testing.tiny_models import write_tiny_paraformer, write_tiny_xcodec2


@pytest.fixture(scope="session")
def tiny_codec_dir(tmp_path_factory):
    return write_tiny_xcodec2(tmp_path_factory.mktemp("xcodec2_random"))


@pytest.fixture(scope="session")
def tiny_paraformer_dir(tmp_path_factory):
    return write_tiny_paraformer(tmp_path_factory.mktemp("paraformer_random"))


@pytest.fixture(scope="session")
def random_weights_reward(tiny_codec_dir, tiny_paraformer_dir):
    """SpeechReward with the random tiny XCodec2 decoder and Paraformer (Chinese), built from plain values."""
    from reward_fns.pipeline import SpeechReward

    return SpeechReward.from_spec(
        codec=str(tiny_codec_dir), asr=f"zh=paraformer:{tiny_paraformer_dir}", default_language="zh"
    )
