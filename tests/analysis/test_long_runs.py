"""Long runs (`maspo_lab.analysis.long_runs`): per evaluated step both ears' CERs and the training figures since the
last evaluation, the curves over seeds, the paired comparison with GRPO and what counts as degrading, by hand."""

from __future__ import annotations

import math

import pytest

from maspo_lab.analysis import long_runs, paired_runs
from maspo_lab.analysis.evaluations import paired_change
from maspo_lab.runs.speech_run import HELDOUT_SOURCE, TRAIN_SOURCE

SOURCES = {"a": TRAIN_SOURCE, "h": HELDOUT_SOURCE}


def _dump(folder, step, whisper, second, codes=100, valid=1.0):
    """veRL's ``_write_generations`` of an evaluation: one training and one held-out response."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    infos = {
        "speech_error_rate": [whisper, whisper],
        "speech_second_error_rate": [second, second],
        "speech_valid": [valid, valid],
        "speech_n_codes": [codes, codes],
    }
    RayPPOTrainer._write_generations(["a", "h"], ["..."] * 2, ["a", "h"], [0.5, 0.5], infos, str(folder), step)


def _steps(n, entropy=2.0, clip=0.1):
    return [
        {"step": s, "critic/score/mean": 0.5, "actor/ppo_kl": 0.01 * s, "actor/pg_clipfrac": clip,
         "actor/entropy": entropy, "response_length/mean": 100.0, "reward/speech_error_rate/mean": 0.1 * s}
        for s in range(1, n + 1)
    ]  # fmt: skip


def test_records_per_evaluated_step_with_the_training_since_the_last(tmp_path):
    for step, (w, s) in {0: (0.3, 0.4), 2: (0.2, 0.35), 4: (0.25, 0.3)}.items():
        _dump(tmp_path, step, w, s)
    records = long_runs.evaluated_records(_steps(4), tmp_path, SOURCES)
    assert [r["step"] for r in records] == [0, 2, 4]
    assert records[1]["heldout_whisper"] == pytest.approx(0.2) and records[1]["train_second"] == pytest.approx(0.35)
    assert records[2]["ppo_kl"] == pytest.approx(0.035)  # the mean over steps 3 and 4
    assert records[1]["batch_cer"] == pytest.approx(0.15) and records[2]["batch_cer"] == pytest.approx(0.35)
    assert math.isnan(records[0]["ppo_kl"]) and records[0]["eval_length"] == pytest.approx(101.0)
    assert records[0]["valid"] == 1.0
    assert list(records[1]["heldout_whisper_per_sentence"].values()) == [pytest.approx(0.2)]  # one sentence each


def _record(
    step, cer, length=100.0, valid=1.0, entropy=2.0, clip=0.1, spread=(-0.02, 0.02, -0.01, 0.01), batch=math.nan
):
    """An evaluated step whose held-out sentences' CERs are ``cer`` + ``spread`` (by both ears), its rollouts' CER
    since the last evaluation ``batch``."""
    sentences = {f"s{i}": cer + d for i, d in enumerate(spread)}
    return {"step": step, "heldout_whisper": cer, "heldout_second": cer, "eval_length": length, "valid": valid,
            "entropy": entropy, "clipfrac": clip, "heldout_whisper_per_sentence": sentences,
            "heldout_second_per_sentence": sentences, "batch_cer": batch}  # fmt: skip


def test_degradation_is_named_with_the_step_it_first_holds():
    steady = [_record(0, 0.25), _record(25, 0.22), _record(50, 0.24)]
    assert long_runs.degradation(steady, 2.0) == []  # 0.02 above its best: within CER_RISE
    rising = [_record(0, 0.25), _record(25, 0.20), _record(50, 0.27), _record(75, 0.40)]
    reasons = long_runs.degradation(rising, 2.0)
    rise = "paired rise +0.200 +- 0.000, Bonferroni over 3"
    assert f"held-out CER (whisper) 0.200 at step 25 -> 0.400 (from step 50; {rise})" in reasons
    # the same means, but two sentences got better and two much worse: the paired rise's interval holds 0 (noise)
    noisy = [_record(0, 0.25), _record(25, 0.20), _record(50, 0.30, spread=(-0.25, -0.25, 0.25, 0.25))]
    assert long_runs.degradation(noisy, 2.0) == []
    # the best of 3 later evaluations is a low draw: a rise whose 95 % interval alone would exclude 0 (t = 3.46 on 4
    # sentences, rises 0.04, 0.12, 0.04, 0.12) does not count at 1 - 0.05 / 3 (t quantile 4.86)
    selected = [
        _record(0, 0.25),
        _record(25, 0.20),
        _record(50, 0.22),
        _record(75, 0.28, spread=(-0.06, 0.06, -0.05, 0.05)),
    ]
    rise, half, _ = paired_change(
        selected[1]["heldout_whisper_per_sentence"], selected[3]["heldout_whisper_per_sentence"]
    )
    assert rise == pytest.approx(0.08) and rise - half > 0
    assert long_runs.degradation(selected, 2.0) == []
    broken = [_record(0, 0.25), _record(25, 0.25, length=160, valid=0.8, entropy=0.9, clip=0.6)]
    assert long_runs.degradation(broken, 2.0) == [
        "responses 100 -> 160 tokens at step 25",
        "only 80% of responses end and decode at step 25",
        "entropy 2.00 -> 0.90 by step 25",
        "clip fraction 0.60 by step 25",
    ]


def test_curves_and_the_summary_pair_each_seed_with_grpo():
    runs = {
        ("hot", "grpo", 0): [_record(0, 0.25), _record(25, 0.40, batch=0.30), _record(50, 0.40, batch=0.36)],
        ("hot", "grpo", 1): [_record(0, 0.25), _record(25, 0.31, batch=0.28), _record(50, 0.31, batch=0.30)],
        ("hot", "maspo-fsq", 0): [_record(0, 0.25), _record(25, 0.30, batch=0.26), _record(50, 0.30, batch=0.31)],
        ("hot", "maspo-fsq", 1): [_record(0, 0.25), _record(25, 0.26, batch=0.30), _record(50, 0.26, batch=0.27)],
    }
    curve = {(r["method"], r["step"]): r for r in long_runs.curves(runs)}
    assert curve[("grpo", 25)]["heldout_whisper"] == pytest.approx(0.355) and curve[("grpo", 25)]["seeds"] == 2
    assert curve[("grpo", 25)]["heldout_whisper_ci95"] > 0
    assert not any(key.endswith("_per_sentence") for key in curve[("grpo", 25)])  # pairing data, not a curve
    cers = {  # each step's rollouts' CER, what the whole run is paired by
        ("hot", "grpo", 0): {1: 0.30, 2: 0.36},
        ("hot", "grpo", 1): {1: 0.28, 2: 0.30},
        ("hot", "maspo-fsq", 0): {1: 0.26, 2: 0.31},
        ("hot", "maspo-fsq", 1): {1: 0.30, 2: 0.27},
        ("hot", paired_runs.CONTROL, 0): {1: 0.30, 2: 0.30},
    }
    paired = paired_runs.paired_by_step(cers)
    rows = {r["method"]: r for r in long_runs.summary_rows(runs, {k: 2.0 for k in runs}, paired)}
    fsq = rows["maspo-fsq"]
    assert fsq["whisper_vs_grpo"] == pytest.approx(-0.075) and fsq["paired_seeds"] == 2  # -0.10 and -0.05
    assert (fsq["whisper_best_step"], fsq["whisper_best"]) == (0, pytest.approx(0.25))
    # the rollouts' CER: the first window after step 0 (0.26, 0.30) and the last (0.31, 0.27); against grpo's last
    # (0.36, 0.30) of the same seed: -0.05 and -0.03
    assert (fsq["batch_first"], fsq["batch_last"]) == (pytest.approx(0.28), pytest.approx(0.29))
    assert fsq["batch_vs_grpo"] == pytest.approx(-0.04) and fsq["batch_vs_grpo_ci95"] > 0
    assert rows["grpo"]["degraded"] == 2 and rows["maspo-fsq"]["degraded"] == 0
    table = long_runs.summary_table(list(rows.values()))
    assert "| hot | grpo | 2 |" in table and "reference" in table and "| 2/2 |" in table
    # the whole run, step by step: seed 0 (-0.04, -0.05) -> -0.045, seed 1 (+0.02, -0.03) -> -0.005; over the
    # seeds -0.025; against the control, seed 0 only (-0.04, +0.01) -> -0.015, no interval from one seed
    assert fsq["batch_run_vs_grpo"] == pytest.approx(-0.025)
    assert fsq["batch_run_vs_frozen"] == pytest.approx(-0.015) and math.isnan(fsq["batch_run_vs_frozen_ci95"])
    # a paired figure resting on fewer seeds than its row says so
    assert (
        "0.280 +- 0.254 -> 0.290 +- 0.254 | -0.040 +- 0.127 | -0.025 +- 0.254 | -0.015 (1 of 2 seeds) | 0/2 |" in table
    )
    assert "whole run - frozen" in table and rows["grpo"]["batch_run_vs_frozen"] == pytest.approx(0.03)


def test_an_unfinished_run_is_compared_with_grpo_at_the_last_step_both_reached():
    runs = {
        ("d", "grpo", 0): [_record(0, 0.25), _record(25, 0.40, batch=0.30)],
        ("d", "maspo-fsq", 0): [_record(0, 0.25), _record(25, 0.30, batch=0.26), _record(50, 0.90, batch=0.80)],
    }
    fsq = {r["method"]: r for r in long_runs.summary_rows(runs, {k: 2.0 for k in runs})}["maspo-fsq"]
    assert fsq["whisper_vs_grpo"] == pytest.approx(-0.10) and fsq["batch_vs_grpo"] == pytest.approx(-0.04)
    assert fsq["whisper_last"] == pytest.approx(0.90)  # its own last evaluation stays its own


def test_held_out_cer_over_the_evaluations_after_step_0_is_paired_with_each_reference_of_the_seed():
    runs = {
        ("d", "grpo", 0): [_record(0, 0.10), _record(25, 0.30), _record(50, 0.30)],
        ("d", "grpo", 1): [_record(0, 0.25), _record(25, 0.20), _record(50, 0.20)],
        ("d", "maspo-fsq", 0): [_record(0, 0.90), _record(25, 0.20), _record(50, 0.40), _record(75, 0.90)],
        ("d", "maspo-fsq", 1): [_record(0, 0.25), _record(25, 0.30), _record(50, 0.30)],
        ("d", paired_runs.CONTROL, 0): [_record(0, 0.25), _record(25, 0.25), _record(50, 0.25)],
    }
    rows = {r["method"]: r for r in long_runs.summary_rows(runs, {k: 2.0 for k in runs})}
    fsq = rows["maspo-fsq"]
    # seed 0: steps 25 and 50 only (step 0 is before training, step 75 grpo never reached): (-0.10 + 0.10) / 2 = 0,
    # where the last evaluation both made says +0.10; seed 1: +0.10 at both. Over the seeds +0.05.
    assert fsq["whisper_evaluations_vs_grpo"] == pytest.approx(0.05) and fsq["whisper_vs_grpo"] == pytest.approx(0.10)
    assert fsq["second_evaluations_vs_grpo_seeds"] == 2 and fsq["whisper_evaluations_vs_grpo_ci95"] > 0
    # the control ran seed 0 only: (-0.05 + 0.15) / 2
    assert fsq["whisper_evaluations_vs_frozen"] == pytest.approx(0.05)
    assert fsq["whisper_evaluations_vs_frozen_seeds"] == 1 and math.isnan(fsq["whisper_evaluations_vs_frozen_ci95"])
    table = long_runs.evaluations_table(list(rows.values()))
    seeds = "+0.050 +- 0.635 | +0.050 (1 of 2 seeds)"  # the t interval of +0.00 and +0.10, 1 degree of freedom
    assert f"| d | maspo-fsq | 2 | {seeds} | {seeds} |" in table
    assert "| d | grpo | 2 | reference | +0.050 (1 of 2 seeds) | reference |" in table  # 0.30 against 0.25


def test_held_out_cer_is_paired_by_sentence_within_a_seed_over_the_evaluations_after_step_0_and_at_the_last():
    runs = {
        ("d", "grpo", 0): [_record(0, 0.10), _record(25, 0.30), _record(50, 0.30)],
        # spread: the sentences' differences from grpo at step 25 are -0.10 + (0, +0.02, -0.02, +0.04)
        ("d", "maspo-fsq", 0): [
            _record(0, 0.90),  # before training: left out
            _record(25, 0.20, spread=(-0.02, 0.04, -0.03, 0.05)),
            _record(50, 0.30),
            _record(75, 0.90),  # grpo never reached it: left out
        ],
        ("d", "maspo-fsq", 1): [_record(0, 0.25), _record(25, 0.30)],  # no reference of its seed: not paired
    }
    rows = {(r["method"], r["reference"], r["ear"]): r for r in paired_runs.paired_by_sentence(runs)}
    assert set(rows) == {("maspo-fsq", "grpo", ear) for ear in ("whisper", "second")}
    fsq = rows[("maspo-fsq", "grpo", "whisper")]
    assert (fsq["evaluations"], fsq["sentences"], fsq["last_step"]) == (2, 4, 50)
    # per sentence, averaged over steps 25 and 50: (-0.10, -0.08, -0.12, -0.06) / 2 + (0, 0, 0, 0) / 2
    # = -0.05, -0.04, -0.06, -0.03: mean -0.045, sd 0.012910, t(0.975, 3) = 3.1824
    assert fsq["averaged"] == pytest.approx(-0.045)
    assert fsq["averaged_ci95"] == pytest.approx(3.1824 * 0.012910 / 2, rel=1e-4)
    assert (fsq["last"], fsq["last_ci95"]) == (pytest.approx(0.0), pytest.approx(0.0))  # step 50: the same CERs
    table = paired_runs.sentence_table(paired_runs.paired_by_sentence(runs))
    cells = "-0.045 +- 0.021 | +0.000 +- 0.000 (50)"
    assert f"| d | maspo-fsq | 0 | grpo | 2, 4 | {cells} | {cells} |" in table


def test_the_rollouts_cer_is_paired_step_by_step_with_grpo_and_the_frozen_control():
    pattern = (0.0, 0.05, -0.05, -0.10)  # maspo-fsq minus grpo, repeated over 20 steps
    cers = {
        ("d", "grpo", 0): {s: 0.3 for s in range(1, 21)},
        ("d", paired_runs.CONTROL, 0): {s: 0.3 for s in range(1, 21)},
        ("d", "maspo-fsq", 0): {s: 0.3 + pattern[(s - 1) % 4] for s in range(1, 21)},
        ("d", "maspo-fsq", 1): {1: 0.3},  # no reference of its seed: not paired
        ("d", "gspo", 0): {1: 0.35, 25: 0.3},  # one step in common: a difference without an interval
        ("d", "gspo-late", 0): {25: 0.3},  # no step in common: no difference
    }
    rows = {(r["method"], r["reference"], r["from_step"]): r for r in paired_runs.paired_by_step(cers)}
    assert len(rows) == 12  # frozen - grpo, grpo - frozen, fsq - each: whole run and second half; gspo(-late) - each
    fsq = rows[("maspo-fsq", "grpo", 1)]
    # 10 batches of 2 steps: batch means +0.025, -0.075 alternating (mean -0.025, sd 0.052705), t(0.975, 9) = 2.2622
    assert (fsq["difference"], fsq["steps"]) == (pytest.approx(-0.025), 20)
    assert fsq["ci95"] == pytest.approx(2.2622 * 0.052705 / math.sqrt(10), rel=1e-4)
    second_half = rows[("maspo-fsq", "grpo", 11)]  # steps 11-20: 10 steps, and a batch of one step is no batch
    assert second_half["difference"] == pytest.approx(-0.035) and math.isnan(second_half["ci95"])  # -0.35 / 10
    assert rows[("maspo-fsq", paired_runs.CONTROL, 1)]["difference"] == pytest.approx(-0.025)
    assert rows[("grpo", paired_runs.CONTROL, 1)]["difference"] == pytest.approx(0.0)
    table = paired_runs.paired_table(paired_runs.paired_by_step(cers))
    assert "| d | maspo-fsq | 0 | grpo | 1-, 20 | -0.0250 +- 0.0377 |" in table
    assert "batch means of 10 blocks of steps" in table
    assert "| d | gspo | 0 | grpo | 1-, 1 | +0.0500 |" in table
    assert "| d | gspo-late | 0 | grpo | 1-, 0 | - |" in table


def test_the_plot_draws_each_seed_beside_the_mean_over_seeds(tmp_path, monkeypatch):
    import maspo_lab.figures

    runs = {
        ("hot", "grpo", 0): [_record(0, 0.25), _record(25, 0.40)],
        ("hot", "grpo", 1): [_record(0, 0.25), _record(25, 0.30)],
        ("hot", "maspo-fsq", 0): [_record(0, 0.25), _record(25, 0.50)],
    }
    drawn = []
    monkeypatch.setattr(maspo_lab.figures, "save", lambda fig, path, title: drawn.append(fig))
    long_runs.plot(long_runs.curves(runs), tmp_path / "curves.png", "t", runs)
    heldout = drawn[0].axes[0]  # the first panel: held-out CER by Whisper
    lines = [(list(line.get_xdata()), list(line.get_ydata())) for line in heldout.get_lines()]
    # grpo: its mean, then each seed thin; maspo-fsq's one seed is its mean, not drawn twice
    assert lines == [([0, 25], [0.25, pytest.approx(0.35)]), ([0, 25], [0.25, 0.40]), ([0, 25], [0.25, 0.30]),
                     ([0, 25], [0.25, 0.50])]  # fmt: skip
