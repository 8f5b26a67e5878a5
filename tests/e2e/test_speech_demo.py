"""`maspo-verl demo` as a user runs it, at the smallest shape: the shipped mini-llasa trained with its default method
(MASPO over the code ear's phonemes with per-phoneme credit) in veRL's real trainer, rewarded by the shipped code ear
reading the codes, evaluated on training and held-out sentences before and after by the ear, Whisper tiny.en and
PocketSphinx, and its samples page opened and played in headless Chromium.

What no cheaper test checks: the speech task's overrides, the speech reward with the code ear in veRL's reward
workers, the ear's alignment reaching the phoneme segmenter inside the actor and the per-phoneme credit in the
advantage, the validation dumps read back as evaluations by three ears, and audio on the listening page from a real
run whose training responses were never decoded."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from browser import read_samples_page

from maspo_lab.runs.launch import read_metrics

pytestmark = pytest.mark.e2e

SHAPE = ["--steps", "1", "--texts", "2", "--heldout", "2", "--eval-samples", "2", "--batch", "2", "--n", "2"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("speech_demo")
    command = [sys.executable, "-m", "maspo_lab.cli", "demo", *SHAPE, "--mini-batches", "2", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1500)
    return out, done


@pytest.mark.slow(110)
def test_the_demo_trains_mini_llasa_and_reports_cer_before_and_after(demo):
    out, done = demo
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    evaluations = json.loads((out / "evaluations.json").read_text())
    heard = {(e["source"], e["ear"], e["step"]): e for e in evaluations["heard"]}
    # both sets, before and after, read by the code ear (the reward) and heard by both audio ears
    assert sorted(heard) == sorted(
        (source, ear, step)
        for source in ("mini-llasa/heldout", "mini-llasa/train")
        for ear in ("ear", "second", "whisper")
        for step in (0, 1)
    )
    for e in heard.values():
        assert e["sentences"] == 2 and e["repeats"] == 2 and 0 <= e["mean"] <= 1
    assert len(evaluations["changes"]) == 6
    for where in ("training", "held-out"):
        for ear in ("CER on the {} sentences heard by Whisper tiny.en", "PER on the {} sentences heard by the code ear"):
            assert f"{ear.format(where)} " in done.stdout
    [step] = [r for r in read_metrics(out / "metrics.jsonl") if "critic/score/mean" in r]
    assert 0.0 <= step["critic/score/mean"] <= 1.0 and 0.0 <= step["reward/speech_ear_per/mean"] <= 1.0
    # no training response was decoded and heard: no CER on the step's batch
    assert not math.isfinite(step.get("reward/speech_error_rate/mean", math.nan))
    # the phoneme segmenter cut each response where the ear's alignment changes phoneme inside veRL's actor: several
    # segments per response, each shorter than the response
    assert 1 < step["actor/maspo/segments_per_response"] < step["response_length/mean"]
    assert (out / "demo.png").stat().st_size > 0


def test_the_samples_page_plays_the_speech_of_both_evaluations(demo):
    out, done = demo
    assert done.returncode == 0, done.stderr[-3000:]
    shown = read_samples_page(out, play=True)
    assert sorted({tuple(t) for t in shown["tables"]}) == [(0, "validation"), (1, "validation")]
    # every evaluated sentence once (one response each), before and after side by side, with its set
    pairs = shown["beforeAfter"]
    assert sorted(p["set"] for p in pairs) == ["held-out", "held-out", "training", "training"]
    assert all(p["players"] == 2 for p in pairs)
    assert shown["sources"] and all(s.endswith(".wav") for s in shown["sources"])
    assert all(d > 0.2 for d in shown["durations"]) and all(t >= 0.2 for t in shown["played"])
