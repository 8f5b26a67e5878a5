"""The second ear: PocketSphinx's bundled US English models hearing real speech (flite's voices, the shipped
mini-llasa's held-out recordings), offline."""

import numpy as np
import pytest

from maspo_lab.runs.speech_run import heldout_texts
from maspo_lab.speaking_model import SHIPPED
from reward_fns.asr import get_asr_backend_cls
from reward_fns.error_rate import error_rate

HELD_OUT = heldout_texts()[:3]
SENTENCES = [h["text"] for h in HELD_OUT]


@pytest.fixture(scope="module")
def sphinx():
    return get_asr_backend_cls("pocketsphinx")()


@pytest.fixture(scope="module")
def speech():
    from faster_whisper.audio import decode_audio

    return [decode_audio(str(SHIPPED / "heldout" / h["audio"]), 16000) for h in HELD_OUT]


def test_pocketsphinx_hears_espeak_speech_and_not_noise(sphinx, speech):
    heard = sphinx.transcribe(speech, ["en"] * len(speech))
    errors = [error_rate(s, h, "en", "char").raw for s, h in zip(SENTENCES, heard)]
    assert np.mean(errors) < 0.2, heard
    # against another sentence the same audio is mostly wrong
    assert all(error_rate(s, h, "en", "char").raw > 0.5 for s, h in zip(SENTENCES[1:] + SENTENCES[:1], heard))


def test_a_transcript_does_not_depend_on_what_was_heard_before(sphinx, speech):
    noise = np.random.default_rng(0).standard_normal(3 * 16000).astype(np.float32) * 0.3
    forward = sphinx.transcribe([noise, *speech], ["en"] * 4)[1:]
    backward = sphinx.transcribe([*speech[::-1], noise], ["en"] * 4)[:3][::-1]
    alone = [sphinx.transcribe([a], ["en"])[0] for a in speech]
    assert forward == backward == alone


def test_pocketsphinx_refuses_other_languages(sphinx, speech):
    with pytest.raises(ValueError, match="English only.*zh"):
        sphinx.transcribe(speech[:1], ["zh"])


@pytest.fixture(scope="module")
def codes(speech):
    """The shipped mini codec's codes of the recordings (its resynthesis is what the rewards below hear)."""
    from maspo_base.mel_codec import MelFsqCodec

    return MelFsqCodec.from_pretrained(SHIPPED / "codec").encode_waveforms(speech)


def _reward(**settings):
    from maspo_lab.speaking_model.hearing import whisper_asr_spec
    from reward_fns.pipeline import SpeechReward

    return SpeechReward.from_spec(
        codec=f"mel_fsq:{SHIPPED / 'codec'}",
        asr=whisper_asr_spec(),
        reward_config={"error_unit": "char"},
        num_threads=1,
        **settings,
    )


def test_the_second_ear_hears_the_rows_that_ask_and_never_enters_the_score(sphinx, codes):
    from reward_fns.testing.tiny_models import speech_response

    twice = _reward(second_asr={"en": "pocketsphinx"})
    once = _reward()
    requests = [
        {"solution_str": speech_response(codes[0]), "ground_truth": SENTENCES[0], "second_ear": True},
        {"solution_str": speech_response(codes[1]), "ground_truth": SENTENCES[1]},
        {"solution_str": speech_response(codes[2], end=False), "ground_truth": SENTENCES[2], "second_ear": True},
    ]
    heard, plain = twice.score_batch(requests), once.score_batch(requests)
    for a, b in zip(heard, plain):  # the reward's own parts are the same with or without a second ear
        assert {k: a[k] for k in b} == b
    audio = twice.codec.decode([codes[0]])
    expected = error_rate(SENTENCES[0], sphinx.transcribe(audio, ["en"])[0], "en", "char").raw
    assert heard[0]["speech_second_error_rate_raw"] == pytest.approx(expected)
    assert heard[0]["speech_second_transcript"] and heard[0]["speech_second_error_rate"] == min(expected, 1.0)
    assert np.isnan(heard[1]["speech_second_error_rate_raw"]) and heard[1]["speech_second_transcript"] == ""
    # a response the reward cannot score (no end tag) is every character wrong to the second ear too
    assert heard[2]["speech_reason"] == "truncated" and heard[2]["speech_second_error_rate_raw"] == 1.0


def test_second_ear_settings_and_requests_are_checked():
    from maspo_base.typed_settings import SettingsError, build
    from reward_fns.reward_settings import ModelSettings
    from reward_fns.score_record import ScoreRequest
    from reward_fns.verl_reward import build_request

    with pytest.raises(SettingsError, match="second_asr.*registered"):
        build(ModelSettings, {"second_asr": {"en": "sphinx3"}}, "reward settings")
    with pytest.raises(ValueError, match="second_ear must be true or false"):
        ScoreRequest.from_dict({"ground_truth": "hi", "second_ear": "yes"})
    assert build_request("x", "hi", {"second_ear": True})["second_ear"] is True
    assert "second_ear" not in build_request("x", "hi", {"language": "en"})
