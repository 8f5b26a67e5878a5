"""build-ear's check (`maspo_lab.analysis.ear_check`): within-sentence agreement by hand, and the real pipeline on
the shipped model's responses with a small random ear."""

import json

import numpy as np
import pytest
import torch

from maspo_lab.analysis.ear_check import agreement, hear_responses, within_correlation, write_check


def test_within_sentence_correlation_ignores_what_differs_between_sentences():
    rng = np.random.default_rng(0)
    rows = []
    for s in range(30):
        level = 10.0 * s  # sentence means far apart, unrelated between the two columns' signs
        for _ in range(4):
            noise = rng.standard_normal()
            rows.append({"text": f"s{s}", "x": level + noise, "y": -level + 2 * noise, "z": rng.standard_normal()})
    same = within_correlation(rows, "x", "y", resamples=200)
    assert same["r"] == pytest.approx(1.0) and same["ci95"][0] > 0.99 and same["sentences"] == 30
    unrelated = within_correlation(rows, "x", "z", resamples=200)
    assert abs(unrelated["r"]) < 0.3 and unrelated["ci95"][0] < 0 < unrelated["ci95"][1]
    # a sentence said once says nothing within a sentence
    assert within_correlation([*rows, {"text": "once", "x": 1e6, "y": 1e6, "z": 0}], "x", "y", 50)["sentences"] == 30


@pytest.mark.slow(45)
def test_the_check_scores_the_shipped_models_responses_by_all_three_ears(tmp_path):
    from maspo_lab.runs.speech_run import heldout_texts
    from maspo_lab.speaking_model import SHIPPED_CODEC, SHIPPED_MODEL
    from reward_fns.code_ear import CodeEar, EarConfig
    from reward_fns.phonemes import phonemes_of

    texts = [h["text"] for h in heldout_texts()[:2]]
    torch.manual_seed(0)
    units = tuple(sorted({u for t in texts for u in phonemes_of(t)}))
    CodeEar(EarConfig(codebook_size=1024, phonemes=units, width=16, dilations=(1,))).save_pretrained(tmp_path)
    rows, cost = hear_responses(SHIPPED_MODEL, SHIPPED_CODEC, tmp_path, texts, samples=2, log=lambda _: None)
    assert 2 <= len(rows) <= 4 and {r["text"] for r in rows} <= set(texts)
    for row in rows:
        assert 0 <= row["whisper_cer"] <= 1 and 0 <= row["pocketsphinx_cer"] <= 1 and 0 <= row["ear_per"] <= 1
        assert row["ear_reason"] == "ok" and row["codes"] > 0
    assert cost["audio_over_ear"] > 1 and len(cost["seconds"]["ear"]) == cost["rounds"] == 3
    report = write_check(tmp_path, rows, cost)
    assert json.dumps(json.loads((tmp_path / "check.json").read_text())) == json.dumps(report)  # NaN: no spread
    assert set(report["agreement"]) == set(agreement(rows)) and (tmp_path / "check.png").stat().st_size > 0
