"""The synthetic TTS task: speaking, the synthetic ASR, and the reward's parts."""

from __future__ import annotations

import random

import pandas as pd
import pytest

from maspo_base.speech_tokens.xcodec2_fsq import code_of, digits_of
from maspo_lab.data import synthetic_tts as tts

END = "<|SPEECH_GENERATION_END|>"


def _response(codes, end=True):
    return "".join(f"<|s_{c}|>" for c in codes) + (END if end else "")


def test_fsq_digits_round_trip():
    assert digits_of(43690) == (2,) * 8
    assert code_of([1, 0, 0, 0, 0, 0, 0, 3]) == 1 + 3 * 4**7
    assert all(code_of(digits_of(c)) == c for c in (0, 1, 4095, 65535))


def test_reference_speech_is_runs_of_neighbouring_codes_heard_back():
    rng = random.Random(0)
    for text in tts.make_texts(20, seed=3):
        codes = tts.speak(text, rng)
        assert tts.transcribe(codes) == tts.units_of_text(text)
        # neighbouring frames: within a run the codes differ by at most 2 digit steps
        labels = [tts.label(c) for c in codes]
        for a, b, la, lb in zip(codes, codes[1:], labels, labels[1:]):
            if la == lb:
                assert sum(abs(x - y) for x, y in zip(digits_of(a), digits_of(b))) <= 2


def test_reward_parts():
    rng = random.Random(1)
    text = "bad"
    codes = tts.speak(text, rng, durations=(3,))
    perfect = tts.score_response(_response(codes), text)
    assert perfect.content == 1.0 and perfect.end == 1.0 and perfect.duration == pytest.approx(1.0)
    assert perfect.score == pytest.approx(1.0)
    # no end tag: the end part is lost, the rest stays
    assert tts.score_response(_response(codes, end=False), text).score == pytest.approx(0.8)
    # units in the wrong order: content drops (edit distance 2 of 3)
    swapped = tts.speak("dab", random.Random(1), durations=(3,))
    assert tts.score_response(_response(swapped), text).content == pytest.approx(1 - 2 / 3)
    assert tts.score_response(_response(swapped), text).unit_error_rate == pytest.approx(2 / 3)
    # a unit error rate above 1 (many wrong units) floors content at 0 and is reported as it is
    babble = tts.speak("kikikiki", random.Random(1), durations=(3,))
    assert tts.score_response(_response(babble), text).unit_error_rate == pytest.approx(8 / 3)
    assert tts.score_response(_response(babble), text).content == 0.0
    assert perfect.expected_frames == 3 * tts.FRAMES_PER_UNIT
    # twice the expected length: duration exp(-ln 2) = 0.5
    assert tts.score_response(_response(codes + codes[-1:] * 9), text).duration == pytest.approx(0.5)
    # text tokens inside the speech: no proper end
    assert tts.score_response("hello" + _response(codes), text).end == 0.0
    assert tts.score_response("", text).score == 0.0


def test_compute_score_checks_data_source_and_text():
    result = tts.compute_score(tts.DATA_SOURCE, _response([43690]), "ab")
    assert set(result) >= {"score", "content", "duration", "end", "unit_error_rate", "expected_frames"}
    with pytest.raises(ValueError, match="data_source"):
        tts.compute_score("openai/gsm8k", "", "ab")
    with pytest.raises(ValueError, match="outside the task alphabet"):
        tts.units_of_text("xyz")


def test_dataset_rows_are_rlhf_dataset_shaped(tmp_path):
    train, val = tts.write_dataset(tmp_path, n_train=6, n_val=2)
    frame = pd.read_parquet(train)
    assert len(frame) == 6 and len(pd.read_parquet(val)) == 2
    row = frame.iloc[0]
    assert row["data_source"] == tts.DATA_SOURCE
    text = row["reward_model"]["ground_truth"]
    assert list(row["prompt"])[0]["content"] == (
        f"Convert the text to speech:<|TEXT_UNDERSTANDING_START|>{text}<|TEXT_UNDERSTANDING_END|>"
    )
    assert not set(frame["reward_model"].map(lambda r: r["ground_truth"])) & set(
        pd.read_parquet(val)["reward_model"].map(lambda r: r["ground_truth"])
    )


def test_long_texts_have_their_word_counts_and_about_four_times_the_units():
    from maspo_lab.data.synthetic_tts import WORDS_PER_TEXT, make_texts, units_of_text

    default, long = (make_texts(200, seed=1, words=WORDS_PER_TEXT[key]) for key in ("default", "long"))
    assert {len(text.split(" ")) for text in long} == set(WORDS_PER_TEXT["long"])
    assert make_texts(5, seed=1) == default[:5]  # the default texts are unchanged
    mean_units = [sum(len(units_of_text(t)) for t in texts) / len(texts) for texts in (default, long)]
    assert 3.0 < mean_units[1] / mean_units[0] < 5.0
