"""`SpeechReward` end to end with the random tiny XCodec2 decoder and Paraformer: the plumbing, not the accuracy."""

import numpy as np
import pytest

from maspo_base.llasa_response import parse_response
from maspo_base.xcodec2_decoder import HOP_LENGTH
from reward_fns.asr import ASR_BACKEND_REGISTRY, AsrBackend, FunAsrBackend
from reward_fns.error_rate import error_rate
from reward_fns.pipeline import SpeechReward
from reward_fns.reward import intelligibility
from reward_fns.reward_settings import parse_asr_spec
from reward_fns.testing.tiny_models import random_codes, speech_response

KEYS = {
    "score", "speech_valid", "speech_reason", "speech_detail", "speech_error_rate", "speech_error_rate_raw",
    "speech_intelligibility", "speech_error_utility", "speech_rate", "speech_duration_score", "speech_duration_s",
    "speech_n_codes", "speech_transcript",
}  # fmt: skip


def test_random_weights_valid_responses_are_decoded_recognised_and_scored(random_weights_reward):
    reward = random_weights_reward
    codes = [random_codes(n, seed=n) for n in (30, 55)]
    requests = [{"solution_str": speech_response(c), "ground_truth": "你好世界", "language": "zh"} for c in codes]
    out = reward.score_batch(requests)
    audio = reward.codec.decode(codes)
    transcripts = reward.asr["zh"].transcribe(audio, ["zh", "zh"])
    for c, r, text in zip(codes, out, transcripts):
        assert set(r) == KEYS
        assert r["speech_valid"] == 1.0 and r["speech_reason"] == "ok"
        assert r["speech_transcript"] == text
        er = error_rate("你好世界", text, "zh").value
        assert r["speech_error_rate"] == pytest.approx(er)
        assert r["score"] == pytest.approx(intelligibility(er, 3.0))
        assert r["speech_n_codes"] == len(c) and r["speech_duration_s"] == pytest.approx(len(c) * HOP_LENGTH / 16000)
        assert r["speech_rate"] == pytest.approx(4 / r["speech_duration_s"])


def test_random_weights_bad_samples_score_low_with_a_reason_and_the_rest_still_scores(random_weights_reward):
    good = speech_response(random_codes(20, seed=1))
    requests = [
        {"solution_str": good, "ground_truth": "你好"},
        {"solution_str": speech_response(random_codes(20, seed=2), end=False), "ground_truth": "你好"},
        {"solution_str": "我不会说话", "ground_truth": "你好"},
        {"solution_str": "<|s_1|><|s_70000|><|SPEECH_GENERATION_END|>", "ground_truth": "你好"},
        {"solution_str": "<|s_1|>你好<|s_2|><|SPEECH_GENERATION_END|>", "ground_truth": "你好"},
        {"solution_str": good, "ground_truth": "。"},
        {"solution_str": good, "ground_truth": "hello", "language": "fr"},
        {"token_ids": [128264 + 5, 128264 + 6, 128261], "ground_truth": "你好"},
    ]
    out = random_weights_reward.score_batch(requests)
    reasons = [r["speech_reason"] for r in out]
    assert reasons == [
        "ok", "truncated", "no_speech_tokens", "code_out_of_range", "text_in_speech", "empty_reference",
        "no_asr_for_language", "empty_transcript",
    ]  # fmt: skip
    for r in out:
        assert set(r) == KEYS
        if r["speech_reason"] != "ok":
            assert r["score"] == 0.0 and r["speech_valid"] == 0.0
    assert "configured: ['zh']" in out[6]["speech_detail"]
    assert out[7]["speech_n_codes"] == 2


class _FailsOnShortAudio(FunAsrBackend):
    """Real tiny Paraformer that raises on audio under 0.2 s, as a recogniser might on a degenerate input."""

    def transcribe(self, audio, languages):
        if any(len(a) < 3200 for a in audio):
            raise RuntimeError("input too short for the encoder")
        return super().transcribe(audio, languages)


def test_random_weights_one_failing_sample_is_isolated_from_its_batch(tiny_codec_dir, tiny_paraformer_dir):
    ASR_BACKEND_REGISTRY["test_fails_short"] = _FailsOnShortAudio
    try:
        reward = SpeechReward.from_spec(
            codec=str(tiny_codec_dir), asr={"zh": f"test_fails_short:{tiny_paraformer_dir}"}, default_language="zh"
        )
    finally:
        del ASR_BACKEND_REGISTRY["test_fails_short"]
    lengths = (25, 3, 40)  # 3 tokens = 0.06 s
    out = reward.score_batch(
        [{"solution_str": speech_response(random_codes(n, seed=n)), "ground_truth": "你好"} for n in lengths]
    )
    assert [r["speech_reason"] for r in out] == ["ok", "asr_error", "ok"]
    assert "input too short" in out[1]["speech_detail"] and out[1]["score"] == 0.0


def test_asr_spec_forms_and_errors():
    assert parse_asr_spec("zh=paraformer:/m/p;en-US=faster_whisper:large-v3") == {
        "zh": ("paraformer", "/m/p"),
        "en": ("faster_whisper", "large-v3"),
    }
    assert parse_asr_spec({"zh": "sensevoice"}) == {"zh": ("sensevoice", None)}
    with pytest.raises(ValueError, match="lang=backend"):
        parse_asr_spec("paraformer")
    with pytest.raises(ValueError, match="unknown ASR backend 'whisper'"):
        parse_asr_spec("en=whisper:large-v3")


def test_unusable_request_fields_score_invalid_request_naming_the_field(random_weights_reward):
    out = random_weights_reward.score_batch([{"text": "x", "ground_truth": "y"}, {"solution_str": "x"}])
    assert [r["speech_reason"] for r in out] == ["invalid_request"] * 2
    assert "unknown request field" in out[0]["speech_detail"] and "'text'" in out[0]["speech_detail"]
    assert "ground_truth" in out[1]["speech_detail"]


GOOD = [speech_response(random_codes(n, seed=n)) for n in (21, 34, 21)]

BAD_SAMPLES = [
    # (request, reason, words the detail must hold)
    ({"solution_str": "<|s_1|><|s_99999999999999999999|><|SPEECH_GENERATION_END|>"}, "code_out_of_range", "position 1"),
    ({"token_ids": [128264 + 5, 2**63, 128261]}, "invalid_request", "token_ids[1]"),
    ({"token_ids": [128264 + 5, 2**64 + 1, 128261]}, "invalid_request", "token_ids[1]"),
    ({"solution_str": GOOD[0], "prompt_codes": [3, 2**63]}, "invalid_request", "prompt_codes[1]"),
    ({"solution_str": GOOD[0], "prompt_codes": ["a"]}, "invalid_request", "prompt_codes[0]"),
    ({"solution_str": GOOD[0], "prompt_codes": [5, 70000]}, "invalid_request", "prompt_codes[1]=70000"),
    ({"solution_str": GOOD[0], "language": "  "}, "invalid_request", "language is blank"),
    ({"solution_str": GOOD[0].encode()}, "invalid_request", "solution_str must be a string"),
    ({"solution_str": GOOD[0], "prompt_audio": [0.1, float("nan"), 0.2]}, "invalid_request", "prompt_audio[1]"),
    ({"solution_str": GOOD[0], "prompt_audio": [0.1, float("inf")]}, "invalid_request", "prompt_audio[1]"),
]


@pytest.fixture(scope="module")
def good_alone(random_weights_reward):
    good = [{"solution_str": g, "ground_truth": "你好世界"} for g in GOOD]
    return good, [random_weights_reward.score_batch([g])[0] for g in good]


@pytest.mark.parametrize("bad,reason,detail", BAD_SAMPLES, ids=[f"{r}:{d}" for _, r, d in BAD_SAMPLES])
def test_random_weights_one_bad_sample_scores_invalid_and_leaves_its_neighbours_as_scored_alone(
    random_weights_reward, good_alone, bad, reason, detail
):
    reward = random_weights_reward
    good, alone = good_alone
    out = reward.score_batch([good[0], {"ground_truth": "你好世界", **bad}, good[1], good[2]])
    assert out[1]["speech_reason"] == reason and detail in out[1]["speech_detail"], out[1]
    assert out[1]["score"] == 0.0 and out[1]["speech_valid"] == 0.0 and set(out[1]) == KEYS
    assert [out[0], out[2], out[3]] == alone


def test_random_weights_max_codes_defaults_to_30_seconds_of_speech(random_weights_reward):
    reward = random_weights_reward
    assert reward.gate.max_codes == 1500 == 30 * 16000 // HOP_LENGTH
    assert parse_response(speech_response(random_codes(1500, seed=1)), config=reward.gate).ok
    out = reward.score_batch([{"solution_str": speech_response(random_codes(1501, seed=1)), "ground_truth": "你好"}])
    assert out[0]["speech_reason"] == "too_long" and "1501 > max_codes=1500" in out[0]["speech_detail"]


@pytest.fixture(scope="module")
def reward_with_speaker(tiny_codec_dir, tiny_paraformer_dir):
    """Random tiny codec and Paraformer, and the real resemblyzer encoder as the speaker backend."""
    return SpeechReward.from_spec(
        codec=str(tiny_codec_dir),
        asr=f"zh=paraformer:{tiny_paraformer_dir}",
        default_language="zh",
        speaker="resemblyzer",
        reward_config={"w_similarity": 1.0},
    )


def test_random_weights_prompt_problems_with_a_speaker_backend_stay_with_their_sample(reward_with_speaker):
    reward = reward_with_speaker
    good = [
        {"solution_str": GOOD[0], "ground_truth": "你好世界", "prompt_codes": random_codes(40, seed=9).tolist()},
        {"solution_str": GOOD[1], "ground_truth": "你好世界", "prompt_audio": np.sin(np.arange(16000) / 9.0).tolist()},
    ]
    alone = [reward.score_batch([g])[0] for g in good]
    bad = [
        {"solution_str": GOOD[0], "ground_truth": "你好世界", "prompt_codes": [1, 65536]},
        {"solution_str": GOOD[0], "ground_truth": "你好世界", "prompt_audio": [0.0, float("nan")] * 100},
    ]
    out = reward.score_batch([good[0], bad[0], good[1], bad[1]])
    assert [out[1]["speech_reason"], out[3]["speech_reason"]] == ["invalid_request"] * 2
    assert "prompt_codes[1]=65536" in out[1]["speech_detail"] and "prompt_audio[1]" in out[3]["speech_detail"]
    assert [out[0], out[2]] == alone
    assert all(r["speech_reason"] == "ok" and "speech_similarity" in r for r in alone)


def test_random_weights_a_failing_prompt_decode_scores_similarity_error_for_that_sample(reward_with_speaker):
    reward = reward_with_speaker
    real_decode = reward.codec.decode

    def decode(codes, **kwargs):  # the real decoder, made to fail on one prompt's length
        if any(len(c) == 13 for c in codes):
            raise RuntimeError("out of memory")
        return real_decode(codes, **kwargs)

    reward.codec.decode = decode
    try:
        out = reward.score_batch(
            [
                {"solution_str": GOOD[0], "ground_truth": "你好", "prompt_codes": random_codes(n, seed=n).tolist()}
                for n in (20, 13, 30)
            ]
        )
    finally:
        del reward.codec.decode
    assert [r["speech_reason"] for r in out] == ["ok", "similarity_error", "ok"]
    assert "out of memory" in out[1]["speech_detail"] and out[1]["score"] == 0.0


def test_random_weights_with_codec_max_batch_1_batched_scoring_is_one_by_one_scoring_exactly(random_weights_reward):
    """docs/reward.md, "Batched and one-by-one scoring": every stage but the codec's batch is per sample."""
    reward = random_weights_reward
    requests = [
        {"solution_str": speech_response(random_codes(n, seed=i)), "ground_truth": "你好世界"}
        for i, n in enumerate([30, 30, 17, 30, 17, 44])
    ]
    reward.codec_max_batch = 1
    try:
        batched = reward.score_batch(requests)
        alone = [reward.score_batch([r])[0] for r in requests]
    finally:
        reward.codec_max_batch = 16
    assert batched == alone  # every key, bit for bit
    assert all(r["speech_reason"] == "ok" for r in batched)


class _Heard(AsrBackend):
    """A recogniser that hears a fixed transcript per language, whatever the audio."""

    HEARD = {"en": "helo world", "zh": "你好世"}

    def transcribe(self, audio, languages):
        return [self.HEARD[lang] for lang in languages]


@pytest.fixture(scope="module")
def mini_codec(tmp_path_factory):
    """A random mini codec (1,024 codes), saved as a checkpoint folder."""
    import torch

    from maspo_base.mel_codec import MelFsqCodec

    torch.manual_seed(0)
    return MelFsqCodec(channels=16, griffin_lim_iters=2).save_pretrained(tmp_path_factory.mktemp("mel") / "codec")


def test_error_unit_char_scores_cer_in_every_language_and_keeps_the_speech_rate_in_words(mini_codec):
    from maspo_base.mel_codec import MelFsqCodec
    from reward_fns.reward import RewardConfig

    codec = MelFsqCodec.from_pretrained(mini_codec)
    asr = {"en": _Heard(), "zh": _Heard()}
    codes = random_codes(50, seed=3) % 1024  # 1 s of the mini codec
    requests = [
        {"solution_str": speech_response(codes), "ground_truth": "Hello, world!", "language": "en"},
        {"solution_str": speech_response(codes), "ground_truth": "你好世界", "language": "zh"},
    ]
    chars, words = (
        SpeechReward(codec, asr, config=RewardConfig(error_unit=unit)).score_batch(requests)
        for unit in ("char", "language")
    )
    # "hello world" (11 characters, the space one of them) heard as "helo world": 1 deletion in 11; by words 1 in 2
    assert chars[0]["speech_error_rate"] == pytest.approx(1 / 11) and words[0]["speech_error_rate"] == 0.5
    assert chars[0]["score"] == pytest.approx(intelligibility(1 / 11, 3.0))
    assert chars[1]["speech_error_rate"] == words[1]["speech_error_rate"] == pytest.approx(1 / 4)  # Chinese: CER
    # the speech rate stays in the language's own unit: 2 words, 4 characters per second of audio
    assert chars[0]["speech_duration_s"] == pytest.approx(1.0)
    assert chars[0]["speech_rate"] == words[0]["speech_rate"] == pytest.approx(2.0)
    assert chars[1]["speech_rate"] == pytest.approx(4.0)


def test_the_gate_bounds_codes_by_the_codecs_codebook(mini_codec):
    """The mini codec has 1,024 codes: a response read with Llasa-1B's ids (the default) or mini-llasa's (layout)
    gates code 1024 before decoding; a layout whose codebook is not the codec's is refused, naming the key."""
    from maspo_base.mel_codec import MelFsqCodec
    from maspo_base.speech_tokens.layouts import MINI_LLASA
    from maspo_base.typed_settings import SettingsError

    codec = MelFsqCodec.from_pretrained(mini_codec)
    llasa_ids = SpeechReward(codec, {"en": _Heard()})
    assert llasa_ids.layout.codebook_size == 1024 and llasa_ids.layout.offset == 128264
    ok, wide = ([5, 1023, 7], [5, 1024, 7])
    out = llasa_ids.score_batch(
        [
            {"solution_str": speech_response(ok), "ground_truth": "hello world"},
            {"solution_str": speech_response(wide), "ground_truth": "hello world"},
            {"token_ids": [128264 + c for c in wide] + [128261], "ground_truth": "hello world"},
        ]
    )
    assert [r["speech_reason"] for r in out] == ["ok", "code_out_of_range", "code_out_of_range"]
    assert "code 1024 at position 1; valid: [0, 1024)" in out[1]["speech_detail"]

    mini = SpeechReward(codec, {"en": _Heard()}, layout="mini-llasa")
    assert mini.layout == MINI_LLASA
    start, end, offset = MINI_LLASA.start_id, MINI_LLASA.end_id, MINI_LLASA.offset  # 11, 12, 113
    out = mini.score_batch(
        [
            {"token_ids": [start, offset + 5, offset + 1023, end], "ground_truth": "hello world"},
            {"token_ids": [offset + 5, offset + 1024, end], "ground_truth": "hello world"},
            {"token_ids": [offset + 5, 40, offset + 6, end], "ground_truth": "hello world"},  # a character id
        ]
    )
    assert [r["speech_reason"] for r in out] == ["ok", "code_out_of_range", "text_in_speech"]
    assert out[0]["speech_n_codes"] == 2

    with pytest.raises(ValueError, match="layout 'llasa-1b' has 65536 codes but the codec has 1024"):
        SpeechReward(codec, {"en": _Heard()}, layout="llasa-1b")
    ASR_BACKEND_REGISTRY["test_heard"] = _Heard
    try:
        reward = SpeechReward.from_spec(codec=f"mel_fsq:{mini_codec}", asr="en=test_heard", layout="mini-llasa")
        assert reward.layout == MINI_LLASA and isinstance(reward.codec, MelFsqCodec)
        with pytest.raises(SettingsError, match="layout='llasa-1b': layout 'llasa-1b' has 65536 codes"):
            SpeechReward.from_spec(codec=str(mini_codec), asr="en=test_heard", layout="llasa-1b")
        with pytest.raises(SettingsError, match=r"layout='mini'; registered: \['llasa-1b', 'mini-llasa'\]"):
            SpeechReward.from_spec(codec=str(mini_codec), asr="en=test_heard", layout="mini")
    finally:
        del ASR_BACKEND_REGISTRY["test_heard"]


def test_prompt_codes_are_checked_against_the_codecs_codebook(mini_codec):
    """A voice-cloning prompt code the mini codec does not have is an unusable request field (invalid_request),
    named, before any decoding; its neighbour scores."""
    from maspo_base.mel_codec import MelFsqCodec

    reward = SpeechReward(MelFsqCodec.from_pretrained(mini_codec), {"en": _Heard()})
    out = reward.score_batch(
        [
            {"solution_str": speech_response([5, 6]), "ground_truth": "hello world", "prompt_codes": [1, 1023]},
            {"solution_str": speech_response([5, 6]), "ground_truth": "hello world", "prompt_codes": [1, 1024]},
        ]
    )
    assert [r["speech_reason"] for r in out] == ["ok", "invalid_request"]
    assert "prompt_codes" in out[1]["speech_detail"] and "1024" in out[1]["speech_detail"]
