"""What a fidelity reference costs, route by route (`maspo_lab.analysis.reference_cost`): advantages, the count
sketch, the half-split and the sizing rule by hand, then ``maspo-verl fidelity --reference-pilot`` at its smallest
on the shipped mini-llasa, heard by the real reward (Whisper tiny.en, its likelihood of the text)."""

from __future__ import annotations

import csv
import json
import math
import random

import pytest
import torch

from maspo_lab.analysis.reference_cost import (
    BASELINES,
    REWARDS,
    CountSketch,
    Design,
    advantages,
    half_split,
    responses_for,
)


def test_advantages_by_hand():
    rewards = torch.tensor([[1.0, 0.0, 0.5], [0.2, 0.2, 0.2]], dtype=torch.float64)
    loo = advantages(rewards, "loo")
    assert loo[0].tolist() == pytest.approx([1.0 - 0.25, 0.0 - 0.75, 0.5 - 0.5])
    assert loo[1].tolist() == pytest.approx([0.0, 0.0, 0.0])
    grpo = advantages(rewards, "grpo")
    assert grpo[0].tolist() == pytest.approx([0.5 / (0.5 + 1e-6), -0.5 / (0.5 + 1e-6), 0.0])
    assert grpo[1].tolist() == pytest.approx([0.0, 0.0, 0.0], abs=1e-9)  # one reward for all: no advantage
    with pytest.raises(ValueError, match="valid"):
        advantages(rewards, "mean")


def test_the_count_sketch_is_linear_and_keeps_cosines():
    params = [torch.nn.Parameter(torch.zeros(30_000)), torch.nn.Parameter(torch.zeros(20, 500))]
    sketch = CountSketch(params, 1 << 14, seed=0)
    gen = torch.Generator().manual_seed(1)
    a = [torch.randn(p.shape, generator=gen, dtype=torch.float64) for p in params]
    b = [0.6 * x + 0.8 * torch.randn(x.shape, generator=gen) for x in a]
    sa, sb = sketch(a), sketch(b)
    assert torch.allclose(sketch([x + y for x, y in zip(a, b)]), sa + sb)
    flat_a, flat_b = torch.cat([x.reshape(-1) for x in a]), torch.cat([x.reshape(-1) for x in b])
    exact = float(flat_a @ flat_b / (flat_a.norm() * flat_b.norm()))
    assert float(sa @ sb / (sa.norm() * sb.norm())) == pytest.approx(exact, abs=0.03)
    assert torch.equal(sketch([None, a[1]]), sketch([torch.zeros(30_000, dtype=torch.float64), a[1]]))  # unused


def test_half_split_of_a_shared_signal_and_of_pure_noise():
    gen = torch.Generator().manual_seed(0)
    signal = torch.randn(1, 4096, generator=gen, dtype=torch.float64)
    alike = signal.repeat(16, 1)
    assert half_split(alike, random.Random(0), 5) == pytest.approx([1.0] * 5)
    noise = torch.randn(64, 4096, generator=gen, dtype=torch.float64)
    assert abs(sum(half_split(noise, random.Random(0), 20)) / 20) < 0.05
    # signal plus noise: the halves agree more with more prompts in them
    mixed = signal * 0.25 + noise
    assert sum(half_split(mixed, random.Random(0), 50)) > sum(half_split(mixed, random.Random(0), 50, prompts=16))


def test_the_sizing_rule():
    assert responses_for(0.5, 100) == pytest.approx(400.0)  # c/(1-c) = 1 -> 4
    assert responses_for(0.8, 100) == pytest.approx(100.0)
    assert responses_for(0.0, 100) == math.inf and responses_for(-0.1, 100) == math.inf
    assert Design.parse("128x4") == Design(128, 4) and str(Design(32, 16)) == "32x16"
    for bad in ("128", "4x4", "16x1", "ax4"):
        with pytest.raises(ValueError, match="design"):
            Design.parse(bad)


@pytest.mark.slow(60)
def test_the_reference_pilot_runs_every_route_on_the_shipped_model(tmp_path, capsys):
    from maspo_lab.commands import fidelity

    out = tmp_path / "pilot"
    argv = ["--reference-pilot", "8x2", "--splits", "4", "--response-length", "120", "--reward-threads", "1"]
    assert fidelity.main([*argv, "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "reference_cost.csv").open()))
    routes = {(r["reward"], r["baseline"], r["parameters"], r["responses"]) for r in rows}
    assert routes == {
        (w, b, p, n) for w in REWARDS for b in BASELINES for p in ("all", "head", "last") for n in ("16", "4")
    }
    for r in rows:
        assert -1 <= float(r["half_split"]) <= 1 or r["half_split"] == "nan"
    pilot = json.loads((out / "reference_cost.json").read_text())["pilots"][0]
    assert pilot["design"] == "8x2" and pilot["seconds_per_response"] > 0
    assert 0 < pilot["reward_means"]["likelihood"] < 1 and 0 <= pilot["reward_means"]["cer"] <= 1
    assert (out / "reference_cost.png").stat().st_size > 0
    assert "| 8x2 | composite | loo | last |" in capsys.readouterr().out


def test_a_bad_design_stops_the_command_naming_the_flag(capsys):
    from maspo_lab.commands import fidelity

    with pytest.raises(SystemExit):
        fidelity.parse_args(["--reference-pilot", "6000x4"])
    assert "--reference-pilot: 6000 prompts" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        fidelity.parse_args(["--reference-pilot", "8x1"])
    assert "groups of 2" in capsys.readouterr().err
