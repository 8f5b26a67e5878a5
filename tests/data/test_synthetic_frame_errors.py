"""Where the synthetic ASR heard errors: hand cases of substitution, insertion, deletion and noise."""

from __future__ import annotations

import pytest

from maspo_base.frame_errors import decode_frame_errors
from maspo_lab.data import synthetic_tts as tts

NOISE = next(c for c in range(65536) if tts.label(c) is None)


def speech(*runs: tuple[str | None, int]) -> list[int]:
    """Codes: ``(unit, frames)`` runs at the unit's centre; ``None`` is a noise frame."""
    return [NOISE if unit is None else tts.code_of(tts.CENTRES[unit]) for unit, n in runs for _ in range(n)]


def test_heard_units_carry_their_frame_spans():
    codes = speech(("a", 2), (None, 2), ("a", 3), ("b", 3))
    assert tts.hear(codes) == [tts.HeardUnit("a", 0, 2), tts.HeardUnit("a", 4, 7), tts.HeardUnit("b", 7, 10)]
    assert tts.transcribe(codes) == ["a", "a", "b"]


def test_a_one_frame_blip_is_not_heard():
    assert tts.MIN_UNIT_FRAMES == 2
    # a unit of one frame is not heard at all
    assert tts.hear(speech(("a", 1), ("b", 3))) == [tts.HeardUnit("b", 1, 4)]
    # a one-frame blip (another unit, or noise) inside a unit: the unit is heard once, across it
    for blip in ("k", None):
        codes = speech(("a", 2), (blip, 1), ("a", 2), ("b", 2))
        assert tts.hear(codes) == [tts.HeardUnit("a", 0, 5), tts.HeardUnit("b", 5, 7)]
        assert tts.frame_errors(codes, "ab") == [0, 0, 1, 0, 0, 0, 0]
    # two frames between them are heard: a, k, a
    assert tts.transcribe(speech(("a", 2), ("k", 2), ("a", 2))) == ["a", "k", "a"]
    # so blips cost content only where they cut a unit short of MIN_UNIT_FRAMES
    clean = tts.score_response("".join(f"<|s_{c}|>" for c in speech(("a", 3), ("b", 3))), "ab")
    blipped = tts.score_response("".join(f"<|s_{c}|>" for c in speech(("a", 2), ("m", 1), ("b", 3))), "ab")
    assert clean.content == blipped.content == 1.0


def test_correct_speech_has_no_errors():
    assert tts.frame_errors(speech(("a", 2), ("b", 3), ("d", 2)), "abd") == [0.0] * 7


def test_substituted_unit_flags_its_frames():
    # "abd" spoken as a, k, d
    assert tts.frame_errors(speech(("a", 2), ("k", 3), ("d", 2)), "abd") == [0, 0, 1, 1, 1, 0, 0]


def test_inserted_unit_flags_its_frames():
    # "ab" spoken as a, m, b
    assert tts.frame_errors(speech(("a", 2), ("m", 2), ("b", 3)), "ab") == [0, 0, 1, 1, 0, 0, 0]


def test_deleted_unit_flags_the_frames_around_where_it_is_missing():
    # "abd" spoken as a, d: b is missing between frame 1 (last of a) and frame 2 (first of d)
    assert tts.frame_errors(speech(("a", 2), ("d", 3)), "abd") == [0, 1, 1, 0, 0]
    # at the start only the first frame of the next unit, at the end only the last frame of the previous one
    assert tts.frame_errors(speech(("b", 3), ("d", 2)), "abd") == [1, 0, 0, 0, 0]
    assert tts.frame_errors(speech(("a", 2), ("b", 3)), "abd") == [0, 0, 0, 0, 1]
    # nothing heard: every frame stands where the units should be
    assert tts.frame_errors(speech((None, 3)), "ab") == [1, 1, 1]


def test_noise_frames_are_errors_even_inside_a_correct_transcript():
    # a, noise, b: the transcript "ab" is right, the noise frames are still errors
    assert tts.frame_errors(speech(("a", 2), (None, 1), ("b", 2)), "ab") == [0, 0, 1, 0, 0]
    assert tts.frame_errors(speech(("a", 2), (None, 3), ("b", 2)), "ab") == [0, 0, 1, 1, 1, 0, 0]


def test_alignment_is_a_minimal_edit_script():
    for heard, target in (("axc", "abc"), ("ac", "abc"), ("abxc", "abc"), ("", "ab"), ("ba", "ab"), ("kkk", "")):
        ops = tts.align_units(list(heard), list(target))
        assert sum(op.op != "match" for op in ops) == tts.edit_distance(list(heard), list(target))
        assert [op.i for op in ops if op.op != "del"] == list(range(len(heard)))
        assert [op.j for op in ops if op.op != "ins"] == list(range(len(target)))


@pytest.mark.parametrize("end", [True, False])
def test_reward_reports_the_errors_per_frame(end):
    codes = speech(("a", 2), ("k", 3), ("d", 2))
    response = "".join(f"<|s_{c}|>" for c in codes) + ("<|SPEECH_GENERATION_END|>" if end else "")
    result = tts.compute_score(tts.DATA_SOURCE, response, "abd")
    assert decode_frame_errors(result["frame_errors"]) == [0, 0, 1, 1, 1, 0, 0]
    assert result["score"] == tts.score_response(response, "abd").score
    # no codes: nothing to align
    assert tts.compute_score(tts.DATA_SOURCE, "<|SPEECH_GENERATION_END|>", "abd")["frame_errors"] == ""
