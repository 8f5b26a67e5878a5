"""The hearing reports' error rates against hand-computed values."""

from __future__ import annotations

import pytest

from maspo_lab.speaking_model.hearing import heard

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


def test_sentence_cer_says_each_text_once_per_seed_as_the_check_does():
    """Row k is seed k's sample of every text, heard: seed 0's row is what `say_and_hear` gives for seed 0, and a
    repeated seed repeats its row (sampling is seeded, decoding and hearing deterministic)."""
    import json

    from maspo_base.mel_codec import MelFsqCodec
    from maspo_lab.speaking_model import SHIPPED, SHIPPED_CODEC, SHIPPED_MODEL
    from maspo_lab.speaking_model.hearing import Ear, say_and_hear, sentence_cer

    rows = [json.loads(line) for line in (SHIPPED / "heldout" / "sentences.jsonl").read_text().splitlines() if line]
    texts = [r["text"] for r in rows[:4]]
    codec, ear = MelFsqCodec.from_pretrained(SHIPPED_CODEC), Ear()
    cer = sentence_cer(SHIPPED_MODEL, codec, ear, texts, seeds=[0, 1, 0])
    assert cer.shape == (3, 4)
    _, transcripts = say_and_hear(SHIPPED_MODEL, codec, ear, texts, seed=0)
    assert cer[0] == pytest.approx(heard(texts, transcripts).utterance_cer)
    assert (cer[2] == cer[0]).all() and (cer[1] != cer[0]).any()
