"""Each stage of the speech reward on its own (`reward_fns.stages`): samples built by hand, scripted models (no
checkpoint loaded). What a stage learns of each sample, the failure it records for the one sample a model fails on
alone, and its neighbours untouched."""

from __future__ import annotations

import math

import numpy as np
import pytest

from maspo_base.frame_errors import NO_ALIGNMENT, decode_frame_errors
from maspo_base.frame_words import decode_frame_words
from maspo_base.llasa_response import GateConfig
from maspo_base.speech_tokens.layouts import LLASA_1B
from maspo_base.xcodec2_decoder import HOP_LENGTH, SAMPLE_RATE
from reward_fns.alignment import TimedWord
from reward_fns.asr import AsrBackend
from reward_fns.code_ear import Heard
from reward_fns.ear_scoring import score_with_ear
from reward_fns.likelihood import ReferenceLikelihood, WordLikelihood
from reward_fns.quality import QualityScore
from reward_fns.reward import RewardConfig
from reward_fns.score_record import RecordShape, ScoreRequest, unscored_record
from reward_fns.stages.admit import Admission
from reward_fns.stages.decode import decode_prompts, decode_responses
from reward_fns.stages.measure import measure_likelihood, measure_quality, measure_similarity
from reward_fns.stages.recognise import check_waveforms, recognise, require_transcript
from reward_fns.stages.sample import Failure, Sample, batched, per_model, through
from reward_fns.stages.score import add_frame_signals, score
from reward_fns.stages.second_ear import hear_again


def wave(n_codes: int, value: float = 0.1) -> np.ndarray:
    """A waveform of ``n_codes`` codec frames (``HOP_LENGTH`` samples each)."""
    return np.full(n_codes * HOP_LENGTH, value, dtype=np.float32)


def sample(text: str = "hello world", lang: str = "en", second_ear: bool = False, **known) -> Sample:
    return Sample(ScoreRequest(text, language=lang, second_ear=second_ear), lang, **known)


def fails_on(n_codes: int):
    """A batch function's guard: it raises when any item is ``n_codes`` long."""

    def check(lengths):
        if n_codes in lengths:
            raise RuntimeError(f"out of memory at {n_codes}")

    return check


# --- how a stage runs over a batch ---------------------------------------------------------------------------------


def test_through_gives_a_stage_the_live_samples_and_puts_its_answers_back_in_order():
    samples = [Sample(language="a"), Sample(language="b").failed("decode_error"), Sample(language="c")]
    seen = []

    def stage(batch):
        seen.append([s.language for s in batch])
        return [s.learnt(transcript=s.language * 2) for s in batch]

    out = through(stage, samples)
    assert seen == [["a", "c"]]
    assert [s.transcript for s in out] == ["aa", "", "cc"] and out[1] is samples[1]
    with pytest.raises(RuntimeError, match="answered 1 samples for 2"):
        through(lambda batch: batch[:1], samples)


def test_batched_retries_one_by_one_and_fails_only_the_sample_that_fails_alone():
    calls = []

    def run(batch):
        calls.append(len(batch))
        fails_on(7)([s.n_codes for s in batch])
        return [s.language.upper() for s in batch]

    samples = [Sample(language="x", codes=np.zeros(3)), Sample(language="b", codes=np.zeros(7)), Sample(language="y")]
    out = batched(samples, run, "test", "asr_error", lambda s, text: s.learnt(transcript=text), detail="no: {}")
    assert calls == [3, 1, 1, 1]
    assert [s.transcript for s in out] == ["X", "", "Y"]
    assert out[1].failure == Failure("asr_error", "no: RuntimeError: out of memory at 7", 7)
    assert out[0].live and out[2].live


def test_per_model_gives_each_model_one_batch_in_the_order_models_first_appear():
    a, b = object(), object()
    batches = []

    def stage(model, batch):
        batches.append((model, [s.language for s in batch]))
        return [s.learnt(transcript=s.language) for s in batch]

    out = per_model(stage, [Sample(language=x) for x in "pqrst"], [b, a, None, b, a])
    assert batches == [(b, ["p", "s"]), (a, ["q", "t"])]
    assert [s.transcript for s in out] == ["p", "q", "", "s", "t"]


def test_a_samples_length_is_its_codes_until_decoded_then_its_waveforms():
    coded = Sample(codes=np.zeros(5, np.int64))
    assert coded.n_codes == 5 and coded.failed("decode_error").failure.n_codes == 5
    decoded = coded.learnt(audio=np.zeros(3 * HOP_LENGTH + 100, np.float32))
    assert decoded.n_codes == 3 and coded.audio is None  # a copy: the sample a stage was given is unchanged
    assert decoded.failed("no_asr_for_language", n_codes=0).failure.n_codes == 0
    with pytest.raises(TypeError, match=r"no field\(s\) \['heard'\]"):
        coded.learnt(heard="x")


# --- admit ---------------------------------------------------------------------------------------------------------


def test_admission_parses_gates_and_refuses_what_no_model_can_score():
    admission = Admission(LLASA_1B, GateConfig(), "en", recognised=("en", "zh"))
    ids = [LLASA_1B.offset + 5, LLASA_1B.offset + 6, LLASA_1B.end_id]
    ok = admission.request({"token_ids": ids, "ground_truth": "你好", "language": "ZH_cn"})
    assert ok.live and ok.language == "zh" and ok.codes.tolist() == [5, 6]
    assert admission.request({"token_ids": ids, "ground_truth": "hi"}).language == "en"  # the default

    def why(raw, admit=admission):
        out = admit.request(raw)
        return out.failure.reason, out.failure.n_codes

    assert why({"token_ids": ids, "ground_truth": "hi", "speaker": 1}) == ("invalid_request", 0)
    assert why({"ground_truth": "hi"}) == ("no_speech_tokens", 0)
    assert why({"token_ids": ids, "ground_truth": "  "}) == ("empty_reference", 2)
    assert why({"token_ids": ids, "ground_truth": "salut", "language": "fr"}) == ("no_asr_for_language", 2)
    by_ear = Admission(LLASA_1B, GateConfig(), "en", recognised=("en", "zh"), ear_voice="en-us")
    assert why({"token_ids": ids, "ground_truth": "你好", "language": "zh"}, by_ear) == ("no_asr_for_language", 0)
    needs_likelihood = Admission(LLASA_1B, GateConfig(), "en", recognised=("en", "zh"), likelihood=("en",))
    refused = needs_likelihood.request({"token_ids": ids, "ground_truth": "你好", "language": "zh"})
    assert refused.failure == Failure("no_asr_for_language", "no likelihood model for 'zh'; configured: ['en']", 0)

    heard = admission.audio([0.0] * (2 * HOP_LENGTH), ScoreRequest("hi"))
    assert heard.live and heard.audio.dtype == np.float32 and heard.n_codes == 2
    blank = admission.audio([0.0] * (2 * HOP_LENGTH), ScoreRequest("hi", language=" "))
    assert (blank.failure.reason, blank.failure.n_codes) == ("invalid_request", 2)


# --- decode --------------------------------------------------------------------------------------------------------


class Codec:
    """Decodes n codes into n frames of 0.1; raises on a batch holding ``bad`` codes; records its calls."""

    def __init__(self, bad: int = -1):
        self.bad, self.calls = bad, []

    def decode(self, codes, **options):
        self.calls.append(([len(c) for c in codes], options))
        fails_on(self.bad)([len(c) for c in codes])
        return [wave(len(c)) for c in codes]


def test_decode_responses_gives_each_its_audio_and_decode_error_to_the_one_the_codec_fails_on():
    codec = Codec(bad=7)
    samples = [sample(codes=np.zeros(n, np.int64)) for n in (3, 7, 5)]
    out = decode_responses(samples, codec, max_batch=2, pad_multiple=4)
    assert codec.calls[0] == ([3, 7, 5], {"max_batch": 2, "pad_multiple": 4})
    assert [s.n_codes for s in out] == [3, 7, 5] and out[0].audio.shape == (3 * HOP_LENGTH,)
    assert out[1].failure == Failure("decode_error", "RuntimeError: out of memory at 7", 7)


def test_decode_prompts_takes_the_given_audio_else_decodes_the_prompt_codes():
    codec = Codec(bad=13)
    given = np.ones(800, np.float32)
    samples = [
        Sample(ScoreRequest("a", prompt_audio=given, prompt_codes=np.zeros(4, np.int64))),
        Sample(ScoreRequest("b", prompt_codes=np.zeros(4, np.int64))),
        Sample(ScoreRequest("c")),
        Sample(ScoreRequest("d", prompt_codes=np.zeros(13, np.int64))),
    ]
    out = decode_prompts(samples, codec, max_batch=3)
    assert codec.calls[0] == ([4, 13], {"max_batch": 3})  # the given prompt is not decoded; no padding asked
    assert out[0].prompt is given and out[1].prompt.shape == (4 * HOP_LENGTH,) and out[2].prompt is None
    assert out[3].failure.reason == "similarity_error"
    assert out[3].failure.detail == "decoding prompt_codes failed: RuntimeError: out of memory at 13"


# --- recognise -----------------------------------------------------------------------------------------------------


class Ear(AsrBackend):
    """Hears ``heard[lang]`` with one word per 0.04 s; raises on a waveform of ``bad`` frames; records its batches."""

    def __init__(self, heard: dict[str, str], bad: int = -1):
        super().__init__()
        self.heard, self.bad, self.batches = heard, bad, []

    def transcribe(self, audio, languages):
        return [text for text, _ in self.transcribe_timed(audio, languages)]

    def transcribe_timed(self, audio, languages):
        self.batches.append(list(languages))
        fails_on(self.bad)([len(a) // HOP_LENGTH for a in audio])
        out = []
        for lang in languages:
            words = self.heard[lang].split()
            out.append((self.heard[lang], [TimedWord(w, 0.04 * k, 0.04 * (k + 1)) for k, w in enumerate(words)]))
        return out


def test_check_waveforms_refuses_empty_and_non_finite_audio():
    nan = wave(4)
    nan[7] = math.nan
    out = check_waveforms([sample(audio=wave(0)), sample(audio=nan), sample(audio=wave(2))])
    assert out[0].failure == Failure("unscorable_audio", "empty waveform", 0)
    assert out[1].failure == Failure("unscorable_audio", "waveform has NaN/inf samples", 4)
    assert out[2].live


def test_recognise_hears_one_batch_per_recogniser_and_asr_error_only_where_it_fails():
    both = Ear({"en": "hello word", "zh": "你好"}, bad=9)
    other = Ear({"ja": "こんにちは"})
    samples = [sample(audio=wave(4)), sample("你好", "zh", audio=wave(9)), sample("x", "ja", audio=wave(2))]
    samples.append(sample("你好", "zh", audio=wave(3)))
    out = recognise(samples, {"en": both, "zh": both, "ja": other})
    assert both.batches[0] == ["en", "zh", "zh"] and other.batches == [["ja"]]  # one model, one batch
    assert [s.transcript for s in out] == ["hello word", "", "こんにちは", "你好"] and out[0].words is None
    assert out[1].failure == Failure("asr_error", "RuntimeError: out of memory at 9", 9)
    timed = recognise(samples[:1], {"en": both}, timed=True)[0]
    assert timed.words == [TimedWord("hello", 0.0, 0.04), TimedWord("word", 0.04, 0.08)]


def test_a_transcript_with_nothing_to_score_is_empty_transcript():
    out = require_transcript([sample(transcript="...!", audio=wave(2)), sample(transcript="hi", audio=wave(2))])
    assert out[0].failure == Failure("empty_transcript", "transcript '...!'", 2) and out[1].live


# --- measure -------------------------------------------------------------------------------------------------------


class Likelihood:
    def score(self, audio, references, languages):
        fails_on(6)([len(a) // HOP_LENGTH for a in audio])
        return [ReferenceLikelihood(0.5 * len(r.split()), (0.5,), ()) for r in references]


def test_measure_likelihood_scores_the_languages_with_a_model_and_fails_only_the_sample_it_fails_on():
    samples = [sample("a b c", audio=wave(2)), sample("你好", "zh", audio=wave(2)), sample(audio=wave(6))]
    out = measure_likelihood(samples, {"en": Likelihood()})
    assert out[0].likelihood.nll == 1.5 and out[1].likelihood is None and out[1].live
    assert out[2].failure == Failure("likelihood_error", "RuntimeError: out of memory at 6", 6)


def test_measure_quality_keeps_the_overall_mos():
    class Dnsmos:
        def score(self, audio):
            fails_on(5)([len(a) // HOP_LENGTH for a in audio])
            return [QualityScore(1.0 + len(a) // HOP_LENGTH, 0.0, 0.0, 0.0) for a in audio]

    out = measure_quality([sample(audio=wave(2)), sample(audio=wave(5))], Dnsmos())
    assert out[0].quality == 3.0 and out[1].failure.reason == "quality_error"


def test_measure_similarity_compares_each_audio_with_its_prompt():
    class Speaker:
        def similarity(self, audio, prompts):
            fails_on(5)([len(p) // HOP_LENGTH for p in prompts])
            return np.array([len(a) / len(p) for a, p in zip(audio, prompts)])

    samples = [sample(audio=wave(2), prompt=wave(4)), sample(audio=wave(2)), sample(audio=wave(2), prompt=wave(5))]
    out = measure_similarity(samples, Speaker())
    assert out[0].similarity == 0.5 and isinstance(out[0].similarity, float)
    assert out[1].similarity is None and out[1].live  # no prompt: nothing to compare (scored 0)
    assert out[2].failure == Failure("similarity_error", "similarity failed: RuntimeError: out of memory at 5", 2)


# --- score and its extras ------------------------------------------------------------------------------------------


def test_score_composes_the_error_rate_into_the_result():
    shape = RecordShape(speaker=True, invalid_score=-1.0)
    heard = sample(transcript="hello word", audio=wave(50))  # 1 s, 1 of 2 words wrong
    out = score([heard, sample("...", transcript="hi", audio=wave(5))], RewardConfig(), shape, speaker=True)
    result = out[0].result
    assert result["speech_error_rate"] == 0.5 and result["score"] == pytest.approx(1 - math.tanh(3 * 0.5))
    assert result["speech_duration_s"] == 50 * HOP_LENGTH / SAMPLE_RATE == 1.0 and result["speech_rate"] == 2.0
    assert result["speech_similarity"] == 0.0  # the reward compares voices; no prompt counts 0
    assert result["speech_reason"] == "ok" and result["speech_transcript"] == "hello word"
    assert out[1].failure.reason == "empty_reference"
    (broken,) = score([heard], RewardConfig(w_quality=1.0), shape)  # quality weighted, none measured
    assert broken.failure.reason == "scoring_error" and "w_quality > 0" in broken.failure.detail


def test_frame_signals_mark_the_frames_of_the_wrong_word_and_the_reference_words_surprise():
    config = RewardConfig(frame_errors=True, frame_words=True, frame_likelihood=True)
    shape = RecordShape(frame_errors=True, frame_words=True, frame_likelihood=True)
    likely = ReferenceLikelihood(
        0.3, (), (WordLikelihood("hello", 0.0, 0.04, 0.9), WordLikelihood("world", 0.04, 0.08, 0.5))
    )
    words = [TimedWord("hello", 0.0, 0.04), TimedWord("word", 0.04, 0.08)]  # 50 frames/s: frames 0-1 and 2-3
    heard = sample(transcript="hello word", words=words, likelihood=likely, audio=wave(4))
    untimed = heard.learnt(words=None)
    scored = score([heard, untimed, heard.learnt(likelihood=None)], config, shape)
    out = add_frame_signals(scored, config)
    assert decode_frame_errors(out[0].result["frame_errors"]) == [0.0, 0.0, 1.0, 1.0]
    assert decode_frame_words(out[0].result["frame_words"]) == [0, 0, 1, 1]
    assert decode_frame_errors(out[0].result["frame_likelihood"]) == pytest.approx([0.1, 0.1, 0.5, 0.5], abs=1e-3)
    assert out[1].result["frame_errors"] == out[1].result["frame_words"] == NO_ALIGNMENT  # no word times
    assert out[2].failure.reason == "scoring_error"


def test_the_second_ear_reports_where_asked_and_every_unit_wrong_where_it_cannot_hear():
    shape = RecordShape(second_ear=True)
    nan = wave(3)
    nan[0] = math.nan
    rows = [
        sample(second_ear=True, audio=wave(3)),  # heard: "hello word", 1 of 11 characters missing
        sample(audio=wave(3)),  # not asking
        sample("你好", "zh", second_ear=True, audio=wave(3)),  # no second model for Chinese
        sample(second_ear=True, audio=nan),  # not audible
        sample(second_ear=True).failed("decode_error"),  # no audio
        sample(second_ear=True, audio=wave(8)),  # the second ear fails on it
    ]
    rows = [s.learnt(result=unscored_record(shape, "ok")) for s in rows]
    out = hear_again(rows, {"en": Ear({"en": "hello word"}, bad=8)}, unit="char")
    heard = out[0].result
    assert (
        heard["speech_second_error_rate"] == pytest.approx(1 / 11) and heard["speech_second_transcript"] == "hello word"
    )
    assert math.isnan(out[1].result["speech_second_error_rate"])
    for unheard in out[2:]:
        parts = unheard.result
        assert (parts["speech_second_error_rate"], parts["speech_second_transcript"]) == (1.0, "")


def test_the_code_ear_scores_codes_and_fails_only_the_text_or_codes_it_cannot_hear():
    class CodeEar:
        def targets(self, text):
            if text == "xyz":
                raise ValueError("no phonemes for 'xyz'")
            return tuple(text.replace(" ", ""))

        def hear(self, codes, targets):
            fails_on(7)([len(c) for c in codes])
            return [
                Heard(0.25, 0.5, t, t, np.zeros(len(c)), np.ones(len(t)), np.ones(len(c)), True)
                for c, t in zip(codes, targets)
            ]

    shape = RecordShape(ear=True)
    samples = [sample(codes=np.zeros(n, np.int64)) for n in (50, 7)] + [sample("xyz", codes=np.zeros(5, np.int64))]
    out = score_with_ear(samples, CodeEar(), RewardConfig(), shape, frame_rate=50)
    result = out[0].result
    assert result["speech_ear_per"] == 0.25 and result["score"] == pytest.approx(1 - math.tanh(3 * 0.25))
    assert result["speech_duration_s"] == 1.0 and math.isnan(result["speech_error_rate"])
    assert out[1].failure == Failure("ear_error", "RuntimeError: out of memory at 7", 7)
    assert out[2].failure == Failure("unphonemisable_text", "no phonemes for 'xyz'", 5)
