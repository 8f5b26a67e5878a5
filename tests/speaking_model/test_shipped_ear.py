"""The shipped code ear, read live: the shipped held-out recordings encoded by the shipped codec and read by the
shipped ear must give the phoneme error rate ``build-ear --ship`` recorded in ``check.json``, so the documented
figure is the shipped ear's; and it must read the recordings far better than the same codes under another text."""

from __future__ import annotations

import json

import numpy as np
import pytest

from maspo_lab.analysis.ear_check import read_recordings
from maspo_lab.runs.speech_run import heldout_texts
from maspo_lab.speaking_model import SHIPPED, SHIPPED_CODEC, SHIPPED_EAR
from reward_fns.code_ear import CodeEar


@pytest.fixture(scope="module")
def check():
    return json.loads((SHIPPED_EAR / "check.json").read_text())


def test_the_shipped_ear_is_small_reads_the_shipped_codecs_codes_and_records_its_build():
    ear = CodeEar.from_pretrained(SHIPPED_EAR)
    codec = json.loads((SHIPPED_CODEC / "config.json").read_text())
    assert ear.config.codebook_size == int(np.prod(codec["levels"]))
    assert sum(p.stat().st_size for p in SHIPPED_EAR.iterdir()) < 10_000_000
    training = json.loads((SHIPPED_EAR / "training.json").read_text())
    best = next(h for h in training["history"] if h["step"] == training["best_step"])
    report = json.loads((SHIPPED_EAR / "report.json").read_text())
    assert report["all"]["per"] == pytest.approx(best["per"], abs=1e-4)  # the report is the kept ear's


def test_the_shipped_ear_reads_the_shipped_recordings_as_its_build_recorded(check):
    sentences = heldout_texts()
    live = read_recordings(SHIPPED_EAR, SHIPPED_CODEC, sentences, SHIPPED / "heldout")
    assert live == check["recordings"]
    shuffled = [{**s, "text": t["text"]} for s, t in zip(sentences, sentences[1:] + sentences[:1])]
    wrong = read_recordings(SHIPPED_EAR, SHIPPED_CODEC, shuffled, SHIPPED / "heldout")
    assert wrong["per"] > 2 * live["per"]  # it hears what was said, not what it is told
