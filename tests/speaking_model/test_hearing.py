"""The hearing reports' error rates against hand-computed values."""

from __future__ import annotations

import pytest

from maspo_verl.speaking_model.hearing import heard

TEXTS = ["Ab cd.", "ef", "gh"]  # characters of the normalised words joined by spaces: 5, 2, 2


def test_pooled_and_median_cer_by_hand_and_a_runaway_transcript_moves_only_the_pooled_one():
    # edits: 0; 1 substitution; "gx" for "gh": 1 substitution
    wrong = heard(TEXTS, ["ab, cd", "eg", "gx"])
    assert wrong.utterance_cer == pytest.approx((0.0, 0.5, 0.5))
    assert wrong.cer == pytest.approx(2 / 9) and wrong.median_cer == pytest.approx(0.5)
    # the same mistake in a repetition loop: "gx gx gx gx" is 1 substitution and 9 inserted characters
    looping = heard(TEXTS, ["ab, cd", "eg", "gx gx gx gx"])
    assert looping.utterance_cer == pytest.approx((0.0, 0.5, 5.0))
    assert looping.cer == pytest.approx(11 / 9) and looping.median_cer == pytest.approx(0.5)
    assert looping.summary() == {
        "cer": 1.2222,
        "wer": pytest.approx((0 + 1 + 4) / 4),  # words: 4; 1 substitution; 1 substitution and 3 insertions
        "median_cer": 0.5,
        "utterances": 3,
    }
