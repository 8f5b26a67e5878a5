"""The shipped mini-llasa against the quality bar, heard live: its held-out sentences said at temperature 0.8 and
heard by Whisper tiny.en, against the shipped codec's resynthesis of the shipped recordings of the same sentences.

What the bar is (`maspo_verl.commands.build_model`): CER at most 2x the codec's resynthesis CER, median duration
within 20 % of the recordings'. The build checked the float32 model; this checks what ships (bfloat16 weights),
with the same sentences, seed and temperature."""

from __future__ import annotations

import json

import pytest

from maspo_verl.commands.build_model import CER_RATIO_BAR, DURATION_BAR, check_model
from maspo_verl.speaking_model import SHIPPED, SHIPPED_CODEC, SHIPPED_MODEL
from maspo_verl.speaking_model.model import layout_of_checkpoint


@pytest.fixture(scope="module")
def shipped_sentences():
    return [json.loads(line) for line in (SHIPPED / "heldout" / "sentences.jsonl").read_text().splitlines() if line]


def test_the_shipped_checkpoint_is_small_declares_its_layout_and_records_its_build(shipped_sentences):
    size = sum(p.stat().st_size for p in SHIPPED.rglob("*") if p.is_file())
    assert size <= 20 * 2**20
    assert layout_of_checkpoint(SHIPPED_MODEL).name == "mini-llasa"
    build = json.loads((SHIPPED / "build.json").read_text())
    assert "build-model" in build["command"] and build["machine"] and build["check"]["passes"]
    assert build["check"]["sentences"] == len(shipped_sentences) >= 32
    trained = set((SHIPPED / "train_sentences.txt").read_text().splitlines())
    assert not trained & {s["text"] for s in shipped_sentences}, "a held-out sentence is a training sentence"


def test_the_shipped_model_speaks_held_out_sentences_within_the_bar(shipped_sentences):
    import soundfile as sf

    report = check_model(
        SHIPPED_MODEL,
        SHIPPED_CODEC,
        [s["text"] for s in shipped_sentences],
        [sf.read(SHIPPED / "heldout" / s["audio"], dtype="float32")[0] for s in shipped_sentences],
        [s["seconds"] for s in shipped_sentences],
        seed=0,
    )
    model, codec = report["model"], report["codec_resynthesis"]
    assert model["cer"] <= CER_RATIO_BAR * codec["cer"], report
    assert abs(model["duration_ratio_median"] - 1) <= DURATION_BAR, report
    # room for RL: the model is not already perfect
    assert model["cer"] > report["source"]["cer"], report
