"""Which word the recogniser heard where: timed words -> frame word ids (hand cases), their wire format, their place
on the response tokens, and the speech reward's ``frame_words`` extra (a scripted recogniser, no model)."""

import numpy as np
import pytest
import torch

from maspo_base.frame_words import (
    NOT_A_FRAME,
    UNALIGNED,
    UNHEARD,
    decode_frame_words,
    encode_frame_words,
    scatter_frame_words,
)
from reward_fns.alignment import TimedWord, frame_words_from_words

W = TimedWord
_ = UNHEARD


def test_each_frame_carries_the_word_whose_span_covers_it():
    # 50 frames/s: "call" 0.04-0.10 s = frames 2..4, "me" 0.10-0.14 s = frames 5..6 (they meet at 0.10 s: no shared
    # frame), silence 0.14-0.20 s, "now" 0.20-0.22 s = frame 10
    words = [W("Call", 0.04, 0.10), W("me,", 0.10, 0.14), W("now.", 0.20, 0.22)]
    assert frame_words_from_words(words, "en", 12) == [_, _, 0, 0, 0, 1, 1, _, _, _, 2, _]


def test_edges_a_float_puts_just_past_a_boundary_lie_on_it():
    # 0.34 * 50 = 17.000000000000004 and 0.58 * 50 = 28.999999999999996: still the boundaries of frames 17 and 29
    words = [W("a", 0.30, 0.34), W("b", 0.34, 0.58), W("c", 0.58, 0.60)]
    ids = frame_words_from_words(words, "en", 30)
    assert ids[15:30] == [0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2]


def test_overlapping_spans_give_a_frame_to_the_word_covering_more_of_it():
    # "one" 0.00-0.05 s touches frames 0..2, "two" 0.03-0.08 s frames 1..3. Frame 1 ([0.02, 0.04)): one covers
    # 0.02 s of it, two 0.01 s -> one; frame 2 ([0.04, 0.06)): one 0.01 s, two 0.02 s -> two
    words = [W("one", 0.00, 0.05), W("two", 0.03, 0.08)]
    assert frame_words_from_words(words, "en", 5) == [0, 0, 1, 1, _]
    # equal parts: the earlier word keeps the frame
    words = [W("one", 0.00, 0.03), W("two", 0.03, 0.06)]
    assert frame_words_from_words(words, "en", 4) == [0, 0, 1, _]
    # a word inside another's span loses every frame to it: its index appears nowhere
    words = [W("long", 0.00, 0.10), W("inner", 0.04, 0.04)]
    assert frame_words_from_words(words, "en", 6) == [0, 0, 0, 0, 0, _]


def test_zero_length_punctuation_and_out_of_range_words():
    # a zero-length word keeps the frame holding its start; "..." is no word (no scoring unit): its frames stay
    # unheard; a word past the audio's end lands on the last frame; nothing heard: every frame unheard
    words = [W("ah", 0.02, 0.02), W("...", 0.04, 0.08), W("late", 0.20, 0.30)]
    assert frame_words_from_words(words, "en", 6) == [_, 0, _, _, _, 2]
    assert frame_words_from_words([], "en", 3) == [_, _, _]
    assert frame_words_from_words(words, "en", 0) == []


def test_chinese_characters_are_words():
    words = [W("你", 0.0, 0.04), W("好", 0.04, 0.08)]
    assert frame_words_from_words(words, "zh", 5) == [0, 0, 1, 1, _]


def test_wire_format_round_trip_and_malformed_input_decodes_to_none():
    assert encode_frame_words([-1, 0, 0, 12]) == "-1,0,0,12"
    assert decode_frame_words("-1,0,0,12") == [-1, 0, 0, 12]
    assert encode_frame_words(None) == "" and decode_frame_words("") is None
    assert encode_frame_words(np.array([3, -1])) == "3,-1"
    for bad in ("1,x", "1,,2", "1,-2", "1.5", " 1", "1,", "+1", "١", None, 3, ["1"], b"1"):
        assert decode_frame_words(bad) is None, bad
    for bad in ([-2], [1.5], [True]):
        with pytest.raises(ValueError, match="frame word 0"):
            encode_frame_words(bad)


def test_scatter_places_frame_k_on_the_kth_frame_token():
    # row 0: frames at tokens 0, 1, 3 (token 2 a text token), end tag at 4; row 1: unaligned (bad signal); row 2:
    # its signal has 2 values for 3 frames (mismatch: unaligned); row 3: padded after 2 tokens, aligned
    frame_mask = torch.tensor(
        [
            [True, True, False, True, False],
            [True, True, True, False, False],
            [True, True, True, False, False],
            [True, False, False, False, False],
        ]
    )
    words, aligned = scatter_frame_words(["0,-1,1", "0,x", "0,0", "-1"], frame_mask)
    n, u = NOT_A_FRAME, UNALIGNED
    assert words.tolist() == [[0, -1, n, 1, n], [u, u, u, n, n], [u, u, u, n, n], [-1, n, n, n, n]]
    assert aligned.tolist() == [True, False, False, True]
    with pytest.raises(ValueError, match="2 frame-word signals for 4 responses"):
        scatter_frame_words(["", ""], frame_mask)


class _ScriptedAsr:
    """A recogniser that hears the same timed words in every waveform."""

    def __init__(self, words):
        self.words = words

    def transcribe(self, audio, languages):
        return [" ".join(w.text for w in self.words) for _ in audio]

    def transcribe_timed(self, audio, languages):
        return [(" ".join(w.text for w in self.words), list(self.words)) for _ in audio]


def _reward(words, **config):
    from reward_fns.pipeline import SpeechReward
    from reward_fns.reward import RewardConfig

    return SpeechReward(None, {"en": _ScriptedAsr(words)}, config=RewardConfig(**config))


def test_the_speech_reward_reports_frame_words_when_asked():
    words = [W("call", 0.02, 0.06), W("me", 0.08, 0.10)]
    audio = np.full(320 * 6, 0.1, dtype=np.float32)  # 6 codec frames
    reward = _reward(words, frame_words=True)
    (scored, unscored) = reward.score_audio([audio, audio], ["call me", ""])
    assert decode_frame_words(scored["frame_words"]) == [_, 0, 0, _, 1, _]
    assert unscored["speech_reason"] == "empty_reference" and unscored["frame_words"] == ""
    assert set(scored) == set(unscored)  # every result has the same keys
    # with frame errors too, one timed transcription serves both; without the option the key is absent
    both = _reward(words, frame_words=True, frame_errors=True).score_audio([audio], ["call me"])[0]
    assert both["frame_words"] == scored["frame_words"] and both["frame_errors"] == "0,0,0,0,0,0"
    assert "frame_words" not in _reward(words).score_audio([audio], ["call me"])[0]


def test_a_recogniser_without_timestamps_reports_no_alignment():
    class Untimed(_ScriptedAsr):
        def transcribe_timed(self, audio, languages):
            return [(text, None) for text in self.transcribe(audio, languages)]

    from reward_fns.pipeline import SpeechReward
    from reward_fns.reward import RewardConfig

    reward = SpeechReward(None, {"en": Untimed([W("call", 0.0, 0.1)])}, config=RewardConfig(frame_words=True))
    (result,) = reward.score_audio([np.full(320 * 4, 0.1, dtype=np.float32)], ["call"])
    assert result["speech_valid"] == 1.0 and result["frame_words"] == ""


def test_the_record_shape_follows_the_settings():
    from maspo_base.typed_settings import build
    from reward_fns.reward_settings import ModelSettings
    from reward_fns.score_record import RecordShape, unscored_record

    settings = build(ModelSettings, {"reward_config": {"frame_words": True}}, "reward_kwargs")
    shape = RecordShape.from_settings(settings)
    assert shape.frame_words and unscored_record(shape, "reward_unavailable")["frame_words"] == ""
