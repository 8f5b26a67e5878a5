"""`maspo-verl ablate` without the trainer: method parsing and validation, the figures and the table (the synthetic
task here; the speech task in test_ablate_speech.py)."""

from __future__ import annotations

import math

import pytest

from maspo_lab.analysis import ablation
from maspo_lab.cli import main as cli
from maspo_lab.data.synthetic_tts import DATA_SOURCE
from maspo_lab.methods import BUILTIN_METHODS, DEFAULT_GRID, MethodError, parse_method, parse_methods
from maspo_lab.runs import grid

SYN = "synthetic"


def test_builtin_grid_and_user_methods_parse():
    assert [m.name for m in parse_methods(DEFAULT_GRID)] == ["grpo", "gspo", "maspo-fixed4", "maspo-fsq"]
    assert "++actor_rollout_ref.actor.clip_ratio_low=0.0003" in BUILTIN_METHODS["gspo"].overrides
    assert "++actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean" in BUILTIN_METHODS["gspo"].overrides
    user = parse_method(
        "lowclip:actor_rollout_ref.actor.clip_ratio_low=0.1, actor_rollout_ref.actor.clip_ratio_high=0.1"
    )
    assert user.name == "lowclip" and len(user.overrides) == 2
    for bad, named in (("nosuch", "nosuch"), ("x:novalue", "novalue"), (":a=1", "NAME")):
        with pytest.raises(MethodError, match=named):
            parse_method(bad)
    with pytest.raises(MethodError, match="grpo"):
        parse_methods(["grpo", "grpo"])


def test_bad_override_fails_before_anything_is_built_naming_the_method(tmp_path, capsys):
    out = tmp_path / "grid"
    argv = [
        "ablate",
        "--task",
        "synthetic",
        "--method",
        "grpo",
        "--method",
        "oops:actor_rollout_ref.actor.clip_ratio_lowz=0.1",
    ]
    assert cli([*argv, "--out", str(out), "--warm-start-steps", "0"]) == 2
    err = capsys.readouterr().err
    assert "'oops'" in err and "clip_ratio_lowz" in err
    assert not (out / "task").exists() and not (out / "runs").exists()
    # a typed error deep in MASPO's settings is named too
    bad_window = "w0:" + ",".join(
        [
            "actor_rollout_ref.actor.policy_loss._target_=maspo_verl.config.MaspoPolicyLossConfig",
            "actor_rollout_ref.actor.policy_loss.loss_mode=maspo",
            "+actor_rollout_ref.actor.policy_loss.maspo.segmenter.window=0",
        ]
    )
    assert (
        cli(["ablate", "--task", "synthetic", "--method", bad_window, "--out", str(out), "--warm-start-steps", "0"])
        == 2
    )
    err = capsys.readouterr().err
    assert "'w0'" in err and "segmenter.window" in err
    assert (
        cli(["ablate", "--task", "synthetic", "--method", "x:algorithm.adv_estimator=no_such", "--out", str(out)]) == 2
    )
    assert "no_such" in capsys.readouterr().err


@pytest.mark.parametrize("jobs", ["0", "-1"])
def test_jobs_below_one_fails_naming_jobs(tmp_path, capsys, jobs):
    with pytest.raises(SystemExit) as exit_info:
        cli(["ablate", "--jobs", jobs, "--out", str(tmp_path / "grid")])
    assert exit_info.value.code == 2
    assert f"--jobs {jobs}" in capsys.readouterr().err
    assert not (tmp_path / "grid").exists()


def _steps(rewards, contents, clip=0.1, kl=0.01, times=(9.0, 3.0, 4.0)):
    return [
        {
            "step": i + 1,
            "critic/score/mean": r,
            "reward/content/mean": c,
            "actor/pg_clipfrac": clip,
            "actor/ppo_kl": kl,
            "timing_s/step": times[i],
        }
        for i, (r, c) in enumerate(zip(rewards, contents))
    ]


def test_summary_figures_by_hand():
    runs = {
        grid.RunKey("grpo", 0): _steps([0.2, 0.4, 0.6], [0.1, 0.2, 0.3]),
        grid.RunKey("grpo", 1): _steps([0.2, 0.3, 0.4], [0.1, 0.1, 0.1]),
        grid.RunKey("gspo", 0): _steps([0.1, 0.1, 0.2], [0.0, 0.0, 0.0], times=(9.0, 6.0, 8.0)),
    }
    rows = ablation.summarize(runs, parse_methods(["grpo", "gspo"]), threshold=0.5, task=SYN)
    grpo, gspo = rows
    assert grpo["seeds"] == 2
    assert grpo["final_reward_mean"] == pytest.approx(0.5) and grpo["final_reward_std"] == pytest.approx(
        0.1414, abs=1e-4
    )
    assert grpo["final_content_mean"] == pytest.approx(0.2)
    assert grpo["reward_auc"] == pytest.approx((0.4 + 0.3) / 2)  # mean reward over steps, averaged over seeds
    assert grpo["steps_to_threshold"] == 3 and grpo["seeds_reaching_threshold"] == 1
    assert grpo["s_per_step"] == pytest.approx(3.5)  # median after the first step
    assert gspo["s_per_step_vs_grpo"] == pytest.approx(7.0 / 3.5)
    assert math.isnan(gspo["steps_to_threshold"]) and gspo["seeds_reaching_threshold"] == 0
    table = ablation.summary_table(rows, 0.5, task=SYN)
    assert "| default | grpo | 2 | 0.500 (sd 0.141) |" in table
    assert "- (0/1)" in table and "| 2.00 | 1 |" in table  # s/step x grpo, runs at a time


def test_step_times_compare_to_grpos_only_at_the_same_jobs():
    runs = {
        grid.RunKey("grpo", 0): _steps([0.2, 0.4, 0.6], [0.1, 0.2, 0.3]),
        grid.RunKey("gspo", 0): _steps([0.1, 0.1, 0.2], [0.0, 0.0, 0.0], times=(9.0, 6.0, 8.0)),
        grid.RunKey("gspo", 1): _steps([0.1, 0.1, 0.2], [0.0, 0.0, 0.0], times=(9.0, 6.0, 8.0)),
    }
    methods = parse_methods(["grpo", "gspo"])
    both_two = {key: 2 for key in runs}
    grpo, gspo = ablation.summarize(runs, methods, 0.5, jobs=both_two, task=SYN)
    assert (grpo["jobs"], gspo["jobs"]) == ("2", "2") and gspo["s_per_step_vs_grpo"] == pytest.approx(2.0)
    mixed = {**both_two, grid.RunKey("grpo", 0): 1}
    grpo, gspo = ablation.summarize(runs, methods, 0.5, jobs=mixed, task=SYN)
    assert (grpo["jobs"], gspo["jobs"]) == ("1", "2") and math.isnan(gspo["s_per_step_vs_grpo"])
    assert grpo["s_per_step_vs_grpo"] == 1.0
    within = {**both_two, grid.RunKey("gspo", 1): 1}  # one method's own runs disagree
    grpo, gspo = ablation.summarize(runs, methods, 0.5, jobs=within, task=SYN)
    assert gspo["jobs"] == "1,2" and math.isnan(gspo["s_per_step_vs_grpo"])
    assert "| - | 1,2 |" in ablation.summary_table([grpo, gspo], 0.5, task=SYN)


def _with_evaluations(steps, before, after, samples=8):
    def validation(content):
        return {f"val-aux/{DATA_SOURCE}/content/mean@{samples}": content}

    return [{"step": 0, **validation(before)}, *steps[:-1], {**steps[-1], **validation(after)}]


def test_evaluation_figures_by_hand():
    runs = {
        grid.RunKey("grpo", 0): _with_evaluations(_steps([0.2, 0.4, 0.6], [0.1, 0.2, 0.3]), 0.50, 0.60),
        grid.RunKey("grpo", 1): _with_evaluations(_steps([0.2, 0.3, 0.4], [0.1, 0.1, 0.1]), 0.40, 0.60),
        grid.RunKey("gspo", 0): _steps([0.1, 0.1, 0.2], [0.0, 0.0, 0.0]),  # a run without evaluations
    }
    grpo, gspo = ablation.summarize(runs, parse_methods(["grpo", "gspo"]), threshold=0.5, eval_samples=8, task=SYN)
    assert grpo["eval_content_after_mean"] == pytest.approx(0.6) and grpo["eval_content_after_std"] == 0.0
    assert grpo["eval_content_gain_mean"] == pytest.approx(0.15)
    assert grpo["eval_content_gain_std"] == pytest.approx(0.0707, abs=1e-4)
    # the step-0 evaluation is not a training step: the training figures are those without evaluations
    assert grpo["final_reward_mean"] == pytest.approx(0.5) and grpo["reward_auc"] == pytest.approx(0.35)
    assert grpo["s_per_step"] == pytest.approx(3.5)
    assert math.isnan(gspo["eval_content_gain_mean"])
    # another sample count is another metric: nothing is read
    four = ablation.summarize(runs, parse_methods(["grpo"]), 0.5, eval_samples=4, task=SYN)
    assert math.isnan(four[0]["eval_content_gain_mean"])
    table = ablation.summary_table([grpo, gspo], 0.5, task=SYN)
    assert "| 0.600 (sd 0.000) | +0.150 (sd 0.071) | reference | 0/2 |" in table
    assert "| - | - | - (0) |" in table  # gspo has no evaluation to pair with grpo's


def test_maspo_credit_method_selects_the_credit_estimator():
    method = parse_method("maspo-credit")
    assert "++algorithm.adv_estimator=maspo" in method.overrides
    assert "++algorithm.maspo.credit_weight=0.5" in method.overrides
    assert "maspo-credit" not in DEFAULT_GRID and "maspo-credit" in BUILTIN_METHODS


def test_maspo_credit_method_validates_and_a_bad_credit_setting_is_named():
    from maspo_lab.methods import validate_methods

    base = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"]
    validate_methods([parse_method("maspo-credit")], base)
    with pytest.raises(MethodError, match=r"algorithm.maspo.credit_weight must be a finite number"):
        validate_methods([parse_method("bad:algorithm.adv_estimator=maspo,++algorithm.maspo.credit_weight=nan")], base)


def test_regimes_parse_and_a_bad_one_fails_before_anything_is_built_naming_it(tmp_path, capsys):
    from maspo_lab.regimes import builtin_regimes, parse_regimes

    assert [r.name for r in parse_regimes(["default", "stale", "hot"], SYN)] == ["default", "stale", "hot"]
    synthetic = builtin_regimes(SYN)
    assert synthetic["stale"].overrides == ("actor_rollout_ref.actor.ppo_epochs=4",)
    assert synthetic["hot"].overrides == ("actor_rollout_ref.actor.optim.lr=2e-3",)
    assert parse_regimes(["big:data.train_batch_size=16"], SYN)[0].overrides == ("data.train_batch_size=16",)
    for bad, named in (("nosuch", "--regime 'nosuch'"), ("x:novalue", "novalue")):
        with pytest.raises(MethodError, match=named):
            parse_regimes([bad], SYN)
    with pytest.raises(MethodError, match="stale"):
        parse_regimes(["stale", "stale"], SYN)

    out = tmp_path / "grid"
    argv = ["ablate", "--task", "synthetic", "--method", "grpo", "--regime", "hot"]
    argv += ["--regime", "oops:actor_rollout_ref.actor.ppo_epochz=2"]
    assert cli([*argv, "--out", str(out), "--warm-start-steps", "0"]) == 2
    err = capsys.readouterr().err
    assert "--regime 'oops'" in err and "ppo_epochz" in err
    assert not (out / "task").exists() and not (out / "runs").exists()


def _entropy(steps, entropies):
    return [{**step, "actor/entropy": e} for step, e in zip(steps, entropies)]


def _evaluated(steps, before, after, samples=8):
    """Evaluations before the first step and with the last: (content, end-tag rate) each."""

    def validation(content, end):
        return {
            f"val-aux/{DATA_SOURCE}/content/mean@{samples}": content,
            f"val-aux/{DATA_SOURCE}/end/mean@{samples}": end,
        }

    return [{"step": 0, **validation(*before)}, *steps[:-1], {**steps[-1], **validation(*after)}]


def test_collapse_is_a_drop_of_content_or_end_tag_or_entropy_leaving_its_band():
    steps = _steps([0.2, 0.4, 0.6], [0.1, 0.2, 0.3])
    healthy = _evaluated(_entropy(steps, [2.8, 1.5, 5.5]), before=(0.70, 0.97), after=(0.51, 0.78))
    assert ablation.collapse_reasons(healthy, 8, task=SYN) == []  # drops of 0.19 and entropy within 0.5x-2x of 2.8
    content = _evaluated(_entropy(steps, [2.8, 2.8, 2.8]), before=(0.70, 0.97), after=(0.49, 0.97))
    assert ablation.collapse_reasons(content, 8, task=SYN) == ["content 0.70->0.49"]
    end_tag = _evaluated(_entropy(steps, [2.8, 2.8, 2.8]), before=(0.70, 0.97), after=(0.70, 0.22))
    assert ablation.collapse_reasons(end_tag, 8, task=SYN) == ["end tag 0.97->0.22"]
    hot = _entropy(steps, [2.8, 10.6, 3.0])
    assert ablation.collapse_reasons(hot, 8, task=SYN) == ["entropy 2.80->10.60"]
    assert ablation.collapse_reasons(_entropy(steps, [2.8, 1.3, 2.8]), 8, task=SYN) == ["entropy 2.80->1.30"]
    assert ablation.collapse_reasons(_entropy(steps, [2.8, math.nan, 2.8]), 8, task=SYN) == ["entropy 2.80->nan"]
    nan_content = _evaluated(steps, before=(0.70, 0.97), after=(math.nan, 0.97))
    assert ablation.collapse_reasons(nan_content, 8, task=SYN) == ["content 0.70->nan"]
    assert ablation.run_figures(hot, 0.5, 8, task=SYN)["collapsed"] == 1.0
    assert ablation.run_figures(healthy, 0.5, 8, task=SYN)["collapsed"] == 0.0


def test_regimes_are_summarised_apart_with_the_gain_paired_to_grpos_seed():
    from maspo_lab.regimes import parse_regimes

    steps = _steps([0.2, 0.4, 0.6], [0.1, 0.2, 0.3])

    def run(before, after, entropies=(1.5, 1.5, 1.5)):
        return _evaluated(_entropy(steps, entropies), (before, 1.0), (after, 1.0))

    runs = {
        grid.RunKey("grpo", 0, "default"): run(0.5, 0.6),
        grid.RunKey("grpo", 1, "default"): run(0.4, 0.6),
        grid.RunKey("maspo-fsq", 0, "default"): run(0.5, 0.65),  # gain 0.15 vs grpo's 0.10: +0.05
        grid.RunKey("maspo-fsq", 1, "default"): run(0.4, 0.55),  # 0.15 vs 0.20: -0.05
        grid.RunKey("maspo-fsq", 2, "default"): run(0.4, 0.9),  # no grpo seed 2: not paired
        grid.RunKey("grpo", 0, "hot"): run(0.5, 0.2, (1.5, 9.0, 9.0)),  # collapsed twice over
        grid.RunKey("maspo-fsq", 0, "hot"): run(0.5, 0.5),
    }
    regimes = parse_regimes(["default", "hot"], SYN)
    rows = ablation.summarize(runs, parse_methods(["grpo", "maspo-fsq"]), 0.5, 8, regimes, task=SYN)
    assert [(r["regime"], r["method"], r["seeds"]) for r in rows] == [
        ("default", "grpo", 2),
        ("default", "maspo-fsq", 3),
        ("hot", "grpo", 1),
        ("hot", "maspo-fsq", 1),
    ]
    default_fsq, hot_grpo, hot_fsq = rows[1], rows[2], rows[3]
    assert default_fsq["paired_seeds"] == 2
    assert default_fsq["gain_vs_grpo_mean"] == pytest.approx(0.0)
    assert default_fsq["gain_vs_grpo_std"] == pytest.approx(math.sqrt(2) * 0.05)
    # 95 % t interval: t(0.975, 1 dof) = 12.706 x std / sqrt(2)
    assert default_fsq["gain_vs_grpo_ci95"] == pytest.approx(12.7062 * 0.05, rel=1e-4)
    assert hot_grpo["collapsed"] == 1 and hot_fsq["collapsed"] == 0 and rows[0]["collapsed"] == 0
    assert hot_fsq["gain_vs_grpo_mean"] == pytest.approx(0.3) and hot_fsq["paired_seeds"] == 1
    table = ablation.summary_table(rows, 0.5, task=SYN)
    assert "| hot | grpo | 1 |" in table and "| reference | 1/1 |" in table
    assert "| +0.300 (sd 0.000; 1) | 0/1 |" in table and math.isnan(hot_fsq["gain_vs_grpo_ci95"])
    assert "| +0.000 (sd 0.071; 2; 95 % -0.64..+0.64) |" in table


def test_time_breakdown_by_hand_and_its_table():
    from pathlib import Path

    from maspo_lab.runs.launch import TrainerRun

    marks = {"ray_started": 4.0, "workers_ready": 40.0, "initial_validation_done": 55.0, "first_step_done": 65.0}
    records = [
        {"step": 0, "val-aux/x": 1.0},
        {"step": 1, "timing_s/step": 9.0},
        {"step": 2, "timing_s/step": 8.0, "timing_s/testing": 12.0},
    ]
    run = TrainerRun(0, records, Path("log"), wall_seconds=100.0, peak_rss_bytes=0, milestones=marks)
    run.last_step_seconds = 90.0
    got = ablation.time_breakdown(run, records)
    assert got == {
        "driver": 4.0,
        "workers": 36.0,
        "initial_validation": 15.0,
        "steps": 17.0,
        "final_validation": 12.0,
        "between_steps": 90.0 - 55.0 - 17.0 - 12.0,
        "teardown": 10.0,
        "total": 100.0,
    }
    assert sum(v for k, v in got.items() if k != "total") == pytest.approx(got["total"])
    # without a validation before training its part is 0 and the parts still add up
    no_validation = TrainerRun(
        0, records, Path("log"), 100.0, 0, milestones={"ray_started": 4.0, "workers_ready": 40.0}
    )
    no_validation.last_step_seconds = 90.0
    parts = ablation.time_breakdown(no_validation, records)
    assert parts["initial_validation"] == 0.0 and sum(parts.values()) == pytest.approx(200.0)
    # a run resumed from its step-1 checkpoint: the merged records hold step 1, its time only step 2
    resumed = TrainerRun(0, records, Path("log"), 100.0, 0, milestones=marks, resumed_from_step=1)
    resumed.last_step_seconds = 90.0
    parts = ablation.time_breakdown(resumed, records)
    assert parts["steps"] == 8.0 and parts["between_steps"] == 90.0 - 55.0 - 8.0 - 12.0
    # an attempt that found its checkpoint at the last step trained nothing: no time of its own to break down
    assert ablation.time_breakdown(TrainerRun(0, records, Path("log"), 0.0, 0, resumed_from_step=2), records) == {}
    table = ablation.time_table(
        [got, {**got, "workers": 50.0, "total": 114.0}, {**got, "workers": 20.0, "total": 84.0}]
    )
    assert "| workers: Ray workers: actor, rollout server, reward workers | 36.0 | 36 % |" in table
    assert "| total | 100.0 | 100 % |" in table


@pytest.mark.parametrize("command", ["ablate", "demo"])
def test_a_relative_out_is_made_absolute_before_the_trainer_runs_in_its_own_folder(tmp_path, monkeypatch, command):
    """veRL's trainer runs in each run's folder and reads the task's files from its overrides: `--out runs` must
    reach it as an absolute path (it failed with the task's parquet not found under the run's folder)."""
    import importlib

    monkeypatch.chdir(tmp_path)
    args = importlib.import_module(f"maspo_lab.commands.{command}").parse_args(["--out", "runs"])
    assert args.out == tmp_path / "runs"
