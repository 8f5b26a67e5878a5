"""`SpeechReward` end to end with the random tiny XCodec2 decoder and Paraformer: the plumbing, not the accuracy."""

import pytest

from reward_fns.asr import ASR_BACKEND_REGISTRY, FunAsrBackend
from reward_fns.codec import HOP_LENGTH
from reward_fns.error_rate import error_rate
from reward_fns.pipeline import SpeechReward, parse_asr_spec
from reward_fns.reward import intelligibility
from reward_fns.testing.tiny_models import random_codes, speech_response

KEYS = {
    "score", "speech_valid", "speech_reason", "speech_detail", "speech_error_rate", "speech_error_rate_raw",
    "speech_intelligibility", "speech_rate", "speech_duration_score", "speech_duration_s", "speech_n_codes",
    "speech_transcript",
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
        "no_asr_for_language", "ok",
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


def test_request_errors_name_the_field(random_weights_reward):
    with pytest.raises(ValueError, match="unknown request field.*'text'"):
        random_weights_reward.score_batch([{"text": "x", "ground_truth": "y"}])
    with pytest.raises(ValueError, match="ground_truth"):
        random_weights_reward.score_batch([{"solution_str": "x"}])
