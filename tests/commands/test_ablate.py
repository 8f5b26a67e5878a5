"""`maspo-verl ablate` without the trainer: method parsing and validation, the figures and the table."""

from __future__ import annotations

import math

import pytest

from maspo_verl.cli import main as cli
from maspo_verl.commands import ablate
from maspo_verl.data.synthetic_tts import DATA_SOURCE
from maspo_verl.methods import BUILTIN_METHODS, DEFAULT_GRID, MethodError, parse_method, parse_methods


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
    argv = ["ablate", "--method", "grpo", "--method", "oops:actor_rollout_ref.actor.clip_ratio_lowz=0.1"]
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
    assert cli(["ablate", "--method", bad_window, "--out", str(out), "--warm-start-steps", "0"]) == 2
    err = capsys.readouterr().err
    assert "'w0'" in err and "segmenter.window" in err
    assert cli(["ablate", "--method", "x:algorithm.adv_estimator=no_such", "--out", str(out)]) == 2
    assert "no_such" in capsys.readouterr().err


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
        ablate.RunKey("grpo", 0): _steps([0.2, 0.4, 0.6], [0.1, 0.2, 0.3]),
        ablate.RunKey("grpo", 1): _steps([0.2, 0.3, 0.4], [0.1, 0.1, 0.1]),
        ablate.RunKey("gspo", 0): _steps([0.1, 0.1, 0.2], [0.0, 0.0, 0.0], times=(9.0, 6.0, 8.0)),
    }
    rows = ablate.summarize(runs, parse_methods(["grpo", "gspo"]), threshold=0.5)
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
    table = ablate.summary_table(rows, 0.5)
    assert "| grpo | 2 | 0.500 +- 0.141 |" in table
    assert "- (0/1)" in table and "| 2.00 |" in table


def _with_evaluations(steps, before, after, samples=8):
    def validation(content):
        return {f"val-aux/{DATA_SOURCE}/content/mean@{samples}": content}

    return [{"step": 0, **validation(before)}, *steps[:-1], {**steps[-1], **validation(after)}]


def test_evaluation_figures_by_hand():
    runs = {
        ablate.RunKey("grpo", 0): _with_evaluations(_steps([0.2, 0.4, 0.6], [0.1, 0.2, 0.3]), 0.50, 0.60),
        ablate.RunKey("grpo", 1): _with_evaluations(_steps([0.2, 0.3, 0.4], [0.1, 0.1, 0.1]), 0.40, 0.60),
        ablate.RunKey("gspo", 0): _steps([0.1, 0.1, 0.2], [0.0, 0.0, 0.0]),  # a run without evaluations
    }
    grpo, gspo = ablate.summarize(runs, parse_methods(["grpo", "gspo"]), threshold=0.5, eval_samples=8)
    assert grpo["eval_content_after_mean"] == pytest.approx(0.6) and grpo["eval_content_after_std"] == 0.0
    assert grpo["eval_content_gain_mean"] == pytest.approx(0.15)
    assert grpo["eval_content_gain_std"] == pytest.approx(0.0707, abs=1e-4)
    # the step-0 evaluation is not a training step: the training figures are those without evaluations
    assert grpo["final_reward_mean"] == pytest.approx(0.5) and grpo["reward_auc"] == pytest.approx(0.35)
    assert grpo["s_per_step"] == pytest.approx(3.5)
    assert math.isnan(gspo["eval_content_gain_mean"])
    # another sample count is another metric: nothing is read
    assert math.isnan(ablate.summarize(runs, parse_methods(["grpo"]), 0.5, eval_samples=4)[0]["eval_content_gain_mean"])
    table = ablate.summary_table([grpo, gspo], 0.5)
    assert "| 0.600 +- 0.000 | +0.150 +- 0.071 |" in table
    assert "| - +- - | - +- - |" in table


def test_maspo_credit_method_selects_the_credit_estimator():
    method = parse_method("maspo-credit")
    assert "++algorithm.adv_estimator=maspo" in method.overrides
    assert "++algorithm.maspo.credit_weight=0.5" in method.overrides
    assert "maspo-credit" not in DEFAULT_GRID and "maspo-credit" in BUILTIN_METHODS


def test_maspo_credit_method_validates_and_a_bad_credit_setting_is_named():
    from maspo_verl.methods import validate_methods

    base = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"]
    validate_methods([parse_method("maspo-credit")], base)
    with pytest.raises(MethodError, match=r"algorithm.maspo.credit_weight must be a finite number"):
        validate_methods([parse_method("bad:algorithm.adv_estimator=maspo,++algorithm.maspo.credit_weight=nan")], base)
