"""The speech reward heard by the code ear (``reward_config.recogniser="ear"``): the shipped codec's codes of real
recordings, a small random ear with the real class saved and loaded as a built one, Whisper tiny.en and PocketSphinx
hearing the evaluation rows."""

import math

import numpy as np
import pytest
import torch

from maspo_lab.runs.speech_run import heldout_texts
from maspo_lab.speaking_model import SHIPPED
from reward_fns.code_ear import CodeEar, EarConfig
from reward_fns.phonemes import phonemes_of
from reward_fns.testing.tiny_models import speech_response

HELD_OUT = heldout_texts()[:3]
SENTENCES = [h["text"] for h in HELD_OUT]


@pytest.fixture(scope="module")
def codes():
    from faster_whisper.audio import decode_audio

    from maspo_base.mel_codec import MelFsqCodec

    speech = [decode_audio(str(SHIPPED / "heldout" / h["audio"]), 16000) for h in HELD_OUT]
    return MelFsqCodec.from_pretrained(SHIPPED / "codec").encode_waveforms(speech)


@pytest.fixture(scope="module")
def ear_dir(tmp_path_factory):
    torch.manual_seed(0)
    units = sorted({u for s in SENTENCES for u in phonemes_of(s)})
    ear = CodeEar(EarConfig(codebook_size=1024, phonemes=tuple(units), width=16, dilations=(1, 2)))
    return ear.save_pretrained(tmp_path_factory.mktemp("ear") / "ear")


def _reward(ear_dir, **config):
    from maspo_lab.speaking_model.hearing import whisper_asr_spec
    from reward_fns.pipeline import SpeechReward

    return SpeechReward.from_spec(
        codec=f"mel_fsq:{SHIPPED / 'codec'}",
        asr=whisper_asr_spec(),
        second_asr={"en": "pocketsphinx"},
        ear=str(ear_dir),
        reward_config={"recogniser": "ear", "error_unit": "char", **config},
        num_threads=1,
    )


@pytest.fixture(scope="module")
def reward(ear_dir):
    return _reward(ear_dir, frame_errors=True, frame_words=True)


def test_the_ear_scores_training_rows_from_their_codes_without_decoding_them(reward, ear_dir, codes, monkeypatch):
    decoded = []
    decode = reward.codec.decode
    monkeypatch.setattr(reward.codec, "decode", lambda c, **kw: decoded.append(len(c)) or decode(c, **kw))
    results = reward.score_batch(
        [{"solution_str": speech_response(c), "ground_truth": s} for c, s in zip(codes, SENTENCES)]
    )
    assert decoded == []  # no audio: nothing decoded, nothing transcribed
    heard = CodeEar.from_pretrained(ear_dir).hear(list(codes), [phonemes_of(s) for s in SENTENCES])
    for result, h, c in zip(results, heard, codes):
        assert result["speech_reason"] == "ok" and result["speech_valid"] == 1.0
        assert result["speech_ear_per_raw"] == pytest.approx(h.per) and result["speech_ear_per"] == min(h.per, 1)
        assert result["score"] == pytest.approx(1 - math.tanh(3 * min(h.per, 1.0)))
        assert result["speech_ear_nll"] == pytest.approx(h.nll, rel=1e-5)
        assert math.isnan(result["speech_error_rate"]) and result["speech_transcript"] == ""
        assert result["speech_ear_transcript"] == " ".join(h.transcript)
        errors = [float(v) for v in result["frame_errors"].split(",")]
        assert len(errors) == len(c)
        np.testing.assert_allclose(errors, np.nan_to_num(1 - h.frame_scores, nan=0.0), atol=1e-4)
        assert [int(v) for v in result["frame_words"].split(",")] == h.frame_units.tolist()


def test_evaluation_rows_are_also_heard_by_both_audio_ears_and_keep_the_ears_score(reward, ear_dir, codes):
    from maspo_lab.speaking_model.hearing import whisper_asr_spec
    from reward_fns.pipeline import SpeechReward

    audio_only = SpeechReward.from_spec(
        codec=f"mel_fsq:{SHIPPED / 'codec'}",
        asr=whisper_asr_spec(),
        second_asr={"en": "pocketsphinx"},
        reward_config={"error_unit": "char"},
        num_threads=1,
    )
    requests = [
        {"solution_str": speech_response(c), "ground_truth": s, "second_ear": True} for c, s in zip(codes, SENTENCES)
    ]
    by_ear, by_audio = reward.score_batch(requests), audio_only.score_batch(requests)
    alone = reward.score_batch([{**r, "second_ear": False} for r in requests])
    for ear_result, audio_result, plain in zip(by_ear, by_audio, alone):
        for key in ("speech_error_rate", "speech_error_rate_raw", "speech_transcript", "speech_second_error_rate"):
            assert ear_result[key] == audio_result[key]
        assert ear_result["score"] == plain["score"] and ear_result["speech_ear_per"] == plain["speech_ear_per"]


def test_one_bad_response_is_scored_with_its_reason_and_leaves_its_neighbours_alone(reward, codes):
    good = {"solution_str": speech_response(codes[0]), "ground_truth": SENTENCES[0]}
    batch = [
        {"solution_str": "<|SPEECH_GENERATION_START|><|SPEECH_GENERATION_END|>", "ground_truth": SENTENCES[1]},
        {"solution_str": speech_response(np.array([5, 2000])), "ground_truth": SENTENCES[1]},
        {"solution_str": speech_response(codes[1]), "ground_truth": "..."},
        {"solution_str": speech_response(codes[1]), "ground_truth": "Quixotic zephyrs jumble."},
        good,
    ]
    results = reward.score_batch(batch)
    assert results[0]["speech_reason"] == "no_speech_tokens"
    assert results[1]["speech_reason"] == "code_out_of_range"
    assert results[2]["speech_reason"] == "unphonemisable_text" and "no phonemes" in results[2]["speech_detail"]
    assert results[3]["speech_reason"] == "unphonemisable_text" and "not among the ear's" in results[3]["speech_detail"]
    for bad in results[:4]:
        assert bad["score"] == 0.0 and bad["speech_ear_per"] == 1.0 and bad["frame_errors"] == ""
    assert results[4] == reward.score_batch([good])[0]
    assert {frozenset(r) for r in results} == {frozenset(results[4])}  # every result has the same keys


def test_the_ears_likelihood_scores_with_intelligibility_likelihood(ear_dir, codes):
    reward = _reward(ear_dir, intelligibility="likelihood")
    (result,) = reward.score_batch([{"solution_str": speech_response(codes[0]), "ground_truth": SENTENCES[0]}])
    assert result["score"] == pytest.approx(math.exp(-result["speech_ear_nll"] / 3.0))


def test_ear_settings_are_checked_before_any_model_loads(ear_dir):
    from maspo_base.typed_settings import SettingsError, build
    from reward_fns.reward_settings import ModelSettings

    with pytest.raises(SettingsError, match=r"ear: .*needs ear"):
        build(ModelSettings, {"reward_config": {"recogniser": "ear"}}, "reward settings")
    with pytest.raises(SettingsError, match=r"likelihood: .*no audio"):
        build(
            ModelSettings,
            {"ear": str(ear_dir), "likelihood": "en=tiny", "reward_config": {"recogniser": "ear"}},
            "reward settings",
        )
    with pytest.raises(SettingsError, match="recogniser is 'audio'"):
        build(ModelSettings, {"ear": str(ear_dir)}, "reward settings")
    with pytest.raises(SettingsError, match="recogniser='cochlea' is not valid"):
        build(ModelSettings, {"reward_config": {"recogniser": "cochlea"}}, "reward settings")


def test_audio_alone_cannot_be_scored_by_the_code_ear(reward):
    with pytest.raises(ValueError, match="scores codes"):
        reward.score_audio([np.zeros(16000, np.float32)], [SENTENCES[0]])
