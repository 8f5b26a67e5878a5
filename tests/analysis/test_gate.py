"""The gate (`maspo_lab.analysis.gate`, ``maspo-verl fidelity --gate``) on the shipped mini-llasa: every route on
the same fresh responses, heard by the real audio reward and read by a small random code ear."""

import json
import math

import pytest
import torch

from maspo_lab.analysis.gate import CREDIT_ROUTES


@pytest.fixture(scope="module")
def ear_dir(tmp_path_factory):
    from maspo_lab.runs.speech_run import training_texts
    from reward_fns.code_ear import CodeEar, EarConfig
    from reward_fns.phonemes import phonemes_of

    torch.manual_seed(0)
    units = tuple(sorted({u for text in training_texts()[:64] for u in phonemes_of(text)}))
    config = EarConfig(codebook_size=1024, phonemes=units, width=16, dilations=(1, 2))
    return CodeEar(config).save_pretrained(tmp_path_factory.mktemp("ear") / "ear")


@pytest.mark.slow(50)
def test_the_gate_runs_every_route_on_the_same_responses(tmp_path, ear_dir, capsys):
    from maspo_lab.commands import fidelity

    out = tmp_path / "gate"
    argv = ["--gate", "8x2", "--splits", "4", "--response-length", "120", "--reward-threads", "1"]
    assert fidelity.main([*argv, "--ear", str(ear_dir), "--out", str(out)]) == 0
    (run,) = json.loads((out / "gate.json").read_text())
    routes = {(r["reward"], r["baseline"], r["parameters"]) for r in run["rows"] if r["responses"] == 16}
    scalar = {"whisper_cer", "ear_per", "ear_likelihood"}
    groups = ("all", "head", "last")
    expected = {(w, b, p) for w in scalar for b in ("grpo", "loo") for p in groups}
    assert routes == expected | {(c, "grpo", p) for c in CREDIT_ROUTES for p in groups}
    assert all(-1 <= r["half_split"] <= 1 for r in run["rows"] if r["half_split"] == r["half_split"])
    assert 0 < run["reward_means"]["ear_likelihood"] < 1 and run["aligned"]["ear"] > 0
    full = {(r["reward"], r["parameters"]): r["half_split"] for r in run["rows"] if r["responses"] == 16}
    # the credit moved the gradients: a random ear hears every response as wrong (PER clipped to 1), so the PER
    # route's advantages are all 0 (no gradient, NaN cosine) while per-phoneme credit still has one
    credit, outcome = full[("ear_phoneme_credit", "all")], full[("ear_per", "all")]
    assert math.isfinite(credit) and (math.isnan(outcome) or abs(credit - outcome) > 1e-6)
    assert run["seconds"]["ear"] < run["seconds"]["hearing"]
    printed = capsys.readouterr().out
    assert "| ear_phoneme_credit |" in printed and "| whisper_word_credit |" in printed


def test_the_gate_and_the_pilot_are_one_measurement_at_a_time(capsys):
    from maspo_lab.commands import fidelity

    with pytest.raises(SystemExit):
        fidelity.parse_args(["--gate", "8x2", "--reference-pilot", "8x2"])
    assert "one at a time" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        fidelity.parse_args(["--gate", "8x1"])
    assert "--gate" in capsys.readouterr().err
