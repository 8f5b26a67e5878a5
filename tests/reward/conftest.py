"""Fixtures of the speech reward tests (the tiny random checkpoints and the reward server: tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def random_weights_reward(tiny_codec_dir, tiny_paraformer_dir):
    """SpeechReward with the random tiny XCodec2 decoder and Paraformer (Chinese), built from plain values."""
    from reward_fns.pipeline import SpeechReward

    return SpeechReward.from_spec(
        codec=str(tiny_codec_dir), asr=f"zh=paraformer:{tiny_paraformer_dir}", default_language="zh"
    )
