"""README's evidence figure (`maspo_lab.analysis.evidence_figure`): the rows it plots, gathered from tiny hand-made
copies of the files that own them, by hand; the csv beside the figure holds exactly those rows."""

from __future__ import annotations

import csv
import json

import pytest

from maspo_lab.analysis import evidence_figure, long_runs


def _record(regime, method, seed, step, whisper, second):
    """A long run's evaluated step as `long_runs.write` stores it, held-out CER by both ears."""
    return {"regime": regime, "method": method, "seed": seed, "step": step, "heldout_whisper": whisper,
            "heldout_second": second, "batch_cer": 0.2, "eval_length": 150.0, "valid": 1.0, "entropy": 1.9,
            "clipfrac": 0.0}  # fmt: skip


def _checkout(root):
    """The three sources under ``root``: long runs (``default``: `grpo`, `maspo-fsq` and the control, seeds 0 and 1,
    evaluated at steps 0, 25, 50; ``lr5e-5``: one seed), the 8-step grid's summary, the side by side's lines."""
    folder = root / evidence_figure.LONG_RUNS
    folder.mkdir(parents=True)
    mine = {0: [(0.50, 0.50), (0.22, 0.25), (0.24, 0.25)], 1: [(0.50, 0.50), (0.20, 0.25), (0.22, 0.25)]}
    records = []
    for seed in (0, 1):
        for step, (whisper, second) in zip((0, 25, 50), mine[seed]):
            records.append(_record("default", "maspo-fsq", seed, step, whisper, second))
            records.append(_record("default", "grpo", seed, step, 0.20, 0.20))
            records.append(_record("default", "frozen", seed, step, 0.30, 0.30))
    records += [_record("lr5e-5", m, 0, step, 0.2, 0.2) for m in ("grpo", "maspo-fsq") for step in (0, 25)]
    (folder / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    header = ["regime", "method", "seed", "step", *long_runs.STEP_FIGURES]
    (folder / "steps.csv").write_text(",".join(header) + "\n")

    grid = root / evidence_figure.GRID
    grid.parent.mkdir(parents=True)
    grid.write_text(
        "regime,method,seeds,heldout_gain_vs_grpo_mean,heldout_gain_vs_grpo_ci95,heldout_paired_seeds\n"
        "stale,grpo,3,0.0,0.0,3\nstale,maspo-fsq,3,0.02,0.05,3\n"
    )
    paired = root / evidence_figure.SIDE_BY_SIDE
    paired.parent.mkdir(parents=True)
    paired.write_text(
        "after 15 steps, method minus grpo, paired by sentence (mean over 4 samples each), 95 % t interval\n"
        "speech_error_rate maspo-fsq mini-llasa/heldout 48 +0.176 (+0.135 .. +0.217)\n"
        "speech_error_rate maspo-fsq mini-llasa/train 16 +0.217 (+0.126 .. +0.309)\n"
        "speech_second_error_rate gspo mini-llasa/heldout 48 -0.010 (-0.050 .. +0.030)\n"
    )


def test_the_rows_of_every_source_by_hand(tmp_path):
    _checkout(tmp_path)

    rows = evidence_figure.gather(tmp_path)

    assert [(r["setting"], r["method"], r["ear"]) for r in rows] == [
        ("50 steps: default (lr 2e-5)", "maspo-fsq", "whisper"),
        ("50 steps: default (lr 2e-5)", "maspo-fsq", "second"),
        ("8 steps: stale-16", "maspo-fsq", "whisper"),
        ("15 steps: lr3e-4 (one seed)", "gspo", "second"),
        ("15 steps: lr3e-4 (one seed)", "maspo-fsq", "whisper"),
    ]  # no grpo, no control, no regime of one seed, no training sentences
    whisper, second, grid, gspo, side = rows
    # Whisper, minus grpo averaged over steps 25 and 50 (not step 0): seed 0 +0.03, seed 1 +0.01; over the 2 seeds
    # mean +0.02, sd 0.01 * sqrt(2), t_{0.975, 1} = 12.706: half-width 12.706 * 0.01
    assert whisper["change"] == pytest.approx(0.02)
    assert (whisper["low"], whisper["high"]) == pytest.approx((0.02 - 0.12706, 0.02 + 0.12706), abs=1e-5)
    assert whisper["over"] == "2 seeds" and whisper["source"] == "docs/long-runs/runs.jsonl"
    assert (second["change"], second["low"], second["high"]) == pytest.approx((0.05, 0.05, 0.05))  # +0.05 in each
    # the grid's content gain is 1 - CER: its CER change is the negative, the half-width the same
    assert (grid["change"], grid["low"], grid["high"]) == pytest.approx((-0.02, -0.07, 0.03))
    assert grid["over"] == "3 seeds" and grid["source"] == "docs/ablation-speech/summary.csv"
    assert (side["change"], side["low"], side["high"], side["over"]) == (0.176, 0.135, 0.217, "48 sentences")
    assert (gspo["change"], gspo["low"], gspo["high"]) == (-0.010, -0.050, 0.030)


def test_the_csv_beside_the_figure_holds_what_it_plots(tmp_path):
    _checkout(tmp_path)
    out = tmp_path / "figure"

    evidence_figure.main(["--root", str(tmp_path), "--out", str(out)])

    with open(out / f"{evidence_figure.STEM}.csv", newline="") as f:
        written = list(csv.DictReader(f))
    expected = evidence_figure.gather(tmp_path)
    assert [(r["setting"], r["method"], r["ear"], r["over"]) for r in written] == [
        (r["setting"], r["method"], r["ear"], r["over"]) for r in expected
    ]
    assert [float(r["change"]) for r in written] == pytest.approx([r["change"] for r in expected])
    assert (out / f"{evidence_figure.STEM}.png").stat().st_size > 10_000
