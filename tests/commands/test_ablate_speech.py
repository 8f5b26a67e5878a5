"""`maspo-verl ablate --task speech` (the default) without the trainer: task selection, the speech evaluation read
from veRL's own validation metrics, collapse and the paired table per sentence set, and the command's run on a
stand-in trainer."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from maspo_lab.analysis import ablation
from maspo_lab.commands import ablate
from maspo_lab.methods import parse_methods
from maspo_lab.regimes import HOT_LR, builtin_regimes
from maspo_lab.runs import grid, speech_run, synthetic_run
from maspo_lab.runs.speech_run import HELDOUT_SOURCE, TRAIN_SOURCE

SPEECH = "speech"
TEXTS = speech_run.training_texts()
HELD = [h["text"] for h in speech_run.heldout_texts()]


def test_speech_is_the_default_task_with_its_own_defaults_options_and_refinements(capsys):
    args = ablate.parse_args([])
    assert args.task == SPEECH
    d = speech_run.TASK_DEFAULTS
    assert (args.steps, args.batch, args.eval_samples, args.texts, args.heldout) == (
        d["steps"],
        d["batch"],
        d["eval_samples"],
        d["texts"],
        d["heldout"],
    )
    # the code ear's learning setting: the ear rewards, every shipped sentence, groups of 16, 2 updates, lr 1e-4, KL
    assert args.task_settings == {"texts": 5204, "heldout": 48, "eval_texts": 16, "recogniser": "ear"}
    assert (args.n, args.mini_batches) == (16, 2)
    paths = speech_run.heard_by(speech_run.TaskPaths(Path("/m"), Path("/c"), Path("/t"), Path("/v")), "ear")
    run = speech_run.task_overrides(paths, steps=d["steps"], seed=0)
    for key in (
        "actor_rollout_ref.rollout.n=16",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.optim.lr=0.0001",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.1",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "+reward.custom_reward_function.reward_kwargs.reward_config.recogniser=ear",
    ):
        assert key in run, key
    assert "actor_rollout_ref.actor.use_kl_loss=False" not in run
    assert ablate.parse_args(["--recogniser", "audio"]).task_settings == {
        "texts": 5204,
        "heldout": 48,
        "eval_texts": 16,
    }
    assert args.timeout == speech_run.TIMEOUT_S
    # a longer run, or runs sharing the cores, get longer: 30 steps are 3 of the default 10, at 2 runs at a time
    longer = ablate.parse_args(["--task", "speech", "--steps", str(3 * d["steps"]), "--jobs", "2"])
    assert longer.timeout == speech_run.TIMEOUT_S * 3 * 2
    assert ablate.parse_args(["--task", "speech", "--timeout", "60"]).timeout == 60
    # the methods as the speech task runs them: mini-llasa's layout (trainer_config/task/speech.yaml)
    fsq = next(m for m in args.methods if m.name == "maspo-fsq")
    assert "++actor_rollout_ref.actor.policy_loss.maspo.codec.layout=mini-llasa" in fsq.overrides
    synthetic = ablate.parse_args(["--task", "synthetic"])
    assert synthetic.eval_samples == synthetic_run.TASK_DEFAULTS["eval_samples"]
    assert synthetic.task_settings == {"task_seed": 0, "warm_start_steps": 100, "texts": 16}
    # each task's own options: a synthetic option on speech, more sentences than are shipped
    for argv, named in (
        (["--warm-start-steps", "0"], "--warm-start-steps"),
        (["--heldout", str(len(HELD) + 1)], f"n_heldout={len(HELD) + 1}"),
        (["--task", "synthetic", "--heldout", "2"], "--heldout"),
        (["--task", "nope"], "invalid choice: 'nope'"),
    ):
        with pytest.raises(SystemExit):
            ablate.parse_args(argv)
        assert named in capsys.readouterr().err, argv


def test_regimes_mean_the_same_on_both_tasks():
    for task, run in (("speech", speech_run), ("synthetic", synthetic_run)):
        regimes = builtin_regimes(task)
        assert regimes["default"].overrides == ()
        # 4 epochs over the task's 4 mini-batches: 16 updates per rollout batch
        assert regimes["stale"].overrides == ("actor_rollout_ref.actor.ppo_epochs=4",)
        updates = 4 * run.TASK_DEFAULTS["mini_batches"]
        assert f"{updates} updates per batch" in regimes["stale"].description, task
        # a learning rate far above the task's own, and its description says how far
        assert regimes["hot"].overrides == (f"actor_rollout_ref.actor.optim.lr={HOT_LR[task]}",)
        times = float(HOT_LR[task]) / run.TASK_DEFAULTS["lr"]
        assert times >= 4 and f"{times:.0f}x the task's" in regimes["hot"].description, task


def _validation(samples: list[tuple[str, str, float, float]], step: int, tmp_path: Path, second_ear=None):
    """Hand-written validation samples ``(data source, sentence, clipped CER, valid)`` through veRL's own code: its
    metrics (``_val_metrics_update``, as ``_validate`` logs them) and its dump (``_write_generations``);
    ``second_ear``: the second ear's CER, that value plus the reward's."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    sources = [s for s, *_ in samples]
    uids = [f"{s}:{t}" for s, t, *_ in samples]
    infos = {
        "reward": [1 - math.tanh(3 * cer) if valid else 0.0 for *_, cer, valid in samples],
        "speech_error_rate": [cer for *_, cer, _ in samples],
        "speech_error_rate_raw": [cer * 1.5 for *_, cer, _ in samples],
        "speech_valid": [valid for *_, valid in samples],
        "speech_reason": ["ok" if valid else "not_ended" for *_, valid in samples],
    }
    if second_ear is not None:
        infos["speech_second_error_rate"] = [cer + second_ear for *_, cer, _ in samples]
    metrics = RayPPOTrainer._val_metrics_update(None, sources, uids, infos, [])
    texts = [t for _, t, *_ in samples]
    RayPPOTrainer._write_generations(texts, ["..."] * len(samples), texts, infos["reward"], infos, str(tmp_path), step)
    return {"step": step, **metrics}


def test_the_evaluation_per_sentence_set_from_a_hand_written_validation(tmp_path):
    a, b, h = TEXTS[0], TEXTS[1], HELD[0]
    samples = [  # 2 responses per sentence: 2 training sentences, 1 held-out
        (TRAIN_SOURCE, a, 0.2, 1.0),
        (TRAIN_SOURCE, a, 0.4, 1.0),
        (TRAIN_SOURCE, b, 1.0, 0.0),
        (TRAIN_SOURCE, b, 0.6, 1.0),
        (HELDOUT_SOURCE, h, 0.9, 1.0),
        (HELDOUT_SOURCE, h, 1.0, 0.0),
    ]
    record = _validation(samples, 0, tmp_path)
    got = {e["set"]: e for e in speech_run.evaluation_figures([record], samples=2)}
    assert got["train"]["content"] == pytest.approx(1 - (0.2 + 0.4 + 1.0 + 0.6) / 4)
    assert got["train"]["valid"] == pytest.approx(0.75)
    assert got["train"]["cer"] == pytest.approx(1.5 * 0.55)
    assert got["train"]["score"] == pytest.approx(sum(1 - math.tanh(3 * c) for c in (0.2, 0.4, 0.6)) / 4)
    assert got["heldout"]["content"] == pytest.approx(0.05) and got["heldout"]["valid"] == pytest.approx(0.5)
    assert {e["step"] for e in got.values()} == {0}
    # another sample count is another metric: nothing is read
    assert speech_run.evaluation_figures([record], samples=4) == []
    # the dump of the same validation, read per sentence (the demo's lines), agrees
    sources = {a: TRAIN_SOURCE, b: TRAIN_SOURCE, h: HELDOUT_SOURCE}
    dumped = {e["source"]: e for e in speech_run.evaluations(tmp_path, sources, key="speech_error_rate")}
    assert 1 - dumped[TRAIN_SOURCE]["mean"] == pytest.approx(got["train"]["content"])
    assert dumped[HELDOUT_SOURCE]["per_sentence"] == {h: pytest.approx(0.95)}


def _steps(errors, entropies=None):
    """Training steps: batch CER (clipped) per step, reward 1 - CER, entropy."""
    entropies = entropies or [1.5] * len(errors)
    return [
        {
            "step": i + 1,
            "critic/score/mean": 1 - e,
            "reward/speech_error_rate/mean": e,
            "response_length/mean": 120.0,
            "actor/pg_clipfrac": 0.1,
            "actor/ppo_kl": 0.01,
            "timing_s/step": 30.0,
            "actor/entropy": h,
        }
        for i, (e, h) in enumerate(zip(errors, entropies))
    ]


def _evaluation(train, heldout, samples=4):
    """veRL's logged validation metrics of an evaluation: (content, valid) on each set."""
    out = {}
    for source, (content, valid) in ((TRAIN_SOURCE, train), (HELDOUT_SOURCE, heldout)):
        out[f"val-aux/{source}/speech_error_rate/mean@{samples}"] = 1 - content
        out[f"val-aux/{source}/speech_valid/mean@{samples}"] = valid
    return out


def _run(before, after, errors=(0.6, 0.5, 0.4), entropies=None, samples=4):
    """A speech run's records: the evaluation before step 1, the steps, the last one with the evaluation after."""
    steps = _steps(list(errors), entropies)
    return [
        {"step": 0, **_evaluation(*before, samples)},
        *steps[:-1],
        {**steps[-1], **_evaluation(*after, samples)},
    ]


def test_speech_collapse_is_a_drop_of_content_or_valid_rate_on_either_set_or_entropy_leaving_its_band():
    def reasons(records):
        return ablation.collapse_reasons(records, 4, task=SPEECH)

    healthy = ((0.40, 0.95), (0.10, 0.90))
    assert reasons(_run(healthy, ((0.25, 0.80), (0.10, 0.75)))) == []  # drops of 0.15
    assert reasons(_run(healthy, ((0.15, 0.95), (0.10, 0.90)))) == ["train content 0.40->0.15"]
    assert reasons(_run(healthy, ((0.40, 0.95), (0.10, 0.60)))) == ["heldout valid 0.90->0.60"]
    hot = _run(healthy, healthy, entropies=[2.0, 4.5, 2.0])
    assert reasons(hot) == ["entropy 2.00->4.50"]
    assert ablation.run_figures(hot, 0.5, 4, task=SPEECH)["collapsed"] == 1.0
    # the figures: content on each set after training and its gain; the step batches' content is 1 - CER
    figures = ablation.run_figures(_run(healthy, ((0.55, 1.0), (0.05, 0.9))), 0.5, 4, task=SPEECH)
    assert figures["eval_content_after"] == pytest.approx(0.55) and figures["eval_content_gain"] == pytest.approx(0.15)
    assert figures["heldout_content_after"] == pytest.approx(0.05)
    assert figures["heldout_content_gain"] == pytest.approx(-0.05)
    assert figures["final_content"] == pytest.approx(0.6) and figures["final_reward"] == pytest.approx(0.6)
    assert figures["steps_to_threshold"] == 2.0  # reward 0.5 at step 2


def test_speech_table_reports_each_sentence_set_with_its_gain_paired_to_grpos_seed():
    runs = {
        grid.RunKey("grpo", 0): _run(((0.40, 1.0), (0.10, 1.0)), ((0.50, 1.0), (0.10, 1.0))),
        grid.RunKey("grpo", 1): _run(((0.30, 1.0), (0.20, 1.0)), ((0.50, 1.0), (0.20, 1.0))),
        # train gains 0.15, 0.10 against grpo's 0.10, 0.20: +0.05, -0.10; held-out 0.05, 0.10 against 0, 0
        grid.RunKey("maspo-fsq", 0): _run(((0.40, 1.0), (0.10, 1.0)), ((0.55, 1.0), (0.15, 1.0))),
        grid.RunKey("maspo-fsq", 1): _run(((0.30, 1.0), (0.20, 1.0)), ((0.40, 1.0), (0.30, 1.0))),
    }
    grpo, fsq = ablation.summarize(runs, parse_methods(["grpo", "maspo-fsq"]), 0.5, 4, task=SPEECH)
    assert grpo["eval_content_gain_mean"] == pytest.approx(0.15)
    assert grpo["heldout_content_gain_mean"] == pytest.approx(0.0)
    assert fsq["gain_vs_grpo_mean"] == pytest.approx(-0.025) and fsq["paired_seeds"] == 2
    assert fsq["heldout_gain_vs_grpo_mean"] == pytest.approx(0.075) and fsq["heldout_paired_seeds"] == 2
    assert fsq["heldout_gain_vs_grpo_std"] == pytest.approx(math.sqrt(2) * 0.025)
    # 95 % t interval over 2 seeds: t(0.975, 1) = 12.706 x std / sqrt(2)
    assert fsq["heldout_gain_vs_grpo_ci95"] == pytest.approx(12.7062 * 0.025, rel=1e-4)
    table = ablation.summary_table([grpo, fsq], 0.5, task=SPEECH)
    header = table.splitlines()[0]
    assert "eval gain (training sentences)" in header and "gain - grpo (held-out sentences) (paired)" in header
    assert table.splitlines()[1].count("---|") == header.count("|") - 1
    assert "| +0.075 (sd 0.035; 2; 95 % -0.24..+0.39) |" in table
    fields = ablation.summary_fields(SPEECH)
    assert set(grpo) == set(fields) and "heldout_gain_vs_grpo_ci95" in fields
    assert ablation.summary_fields("synthetic") == ablation.SUMMARY_FIELDS


def _fake_trainer(calls: list, evaluated_steps=(0, 2)):
    """A stand-in for `run_trainer`: records the overrides, writes veRL's metrics file and its validation dumps (CER
    0.5 at the first evaluation, 0.3 at the last), returns a finished run."""
    from maspo_lab.runs.launch import TrainerRun

    def run_trainer(overrides, workdir, timeout, cancel, threads=1, resume=False):
        calls.append(list(overrides))
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        dumps = next(o.split("=", 1)[1] for o in overrides if o.startswith("trainer.validation_data_dir="))
        cers = [0.5 - 0.2 * i / (len(evaluated_steps) - 1) for i in range(len(evaluated_steps))]
        for step, cer in zip(evaluated_steps, cers):  # veRL's dumps of the evaluations: both sets, both ears
            rows = [(TRAIN_SOURCE, TEXTS[0], cer, 1.0), (HELDOUT_SOURCE, HELD[0], cer + 0.1, 1.0)]
            _validation(rows, step, Path(dumps), second_ear=0.2)
        records = _run(((0.40, 1.0), (0.10, 1.0)), ((0.45, 1.0), (0.10, 1.0)), errors=(0.6, 0.55), samples=1)
        with open(workdir / "metrics.jsonl", "w") as f:
            for r in records:
                f.write(json.dumps({"step": r["step"], "data": {k: v for k, v in r.items() if k != "step"}}) + "\n")
        (workdir / "trainer.log").write_text("")
        run = TrainerRun(0, records, workdir / "trainer.log", 100.0, 0, milestones={"ray_started": 5.0})
        run.last_step_seconds = 95.0
        return run

    return run_trainer


def test_the_speech_grid_runs_its_task_and_writes_both_sets(tmp_path, monkeypatch, capsys):
    import maspo_lab.runs.launch as launch

    calls: list = []
    monkeypatch.setattr(launch, "run_trainer", _fake_trainer(calls))
    out = tmp_path / "grid"
    argv = ["--method", "grpo", "--method", "maspo-fsq", "--regime", "hot", "--seeds", "0", "--steps", "2"]
    argv += [
        "--recogniser",
        "audio",
        "--texts",
        "3",
        "--eval-texts",
        "2",
        "--heldout",
        "2",
        "--eval-samples",
        "1",
        "--out",
        str(out),
    ]
    assert ablate.main(argv) == 0
    printed = capsys.readouterr().out
    assert json.loads((out / "task" / "task.json").read_text()) == {"texts": 3, "heldout": 2, "eval_texts": 2}
    import pandas as pd

    train = pd.read_parquet(out / "task" / "data" / "train.parquet")
    val = pd.read_parquet(out / "task" / "data" / "val.parquet")
    assert [r["ground_truth"] for r in train["reward_model"]] == TEXTS[:3]
    # the first 2 training sentences and the held-out ones are evaluated, each heard by the second ear too
    assert [r["ground_truth"] for r in val["reward_model"]] == TEXTS[:2] + HELD[:2]
    assert list(val["data_source"]) == [TRAIN_SOURCE] * 2 + [HELDOUT_SOURCE] * 2
    assert all(info["second_ear"] for info in val["extra_info"]) and "second_ear" not in train["extra_info"][0]
    assert len(calls) == 2
    for overrides in calls:  # the speech reward, the evaluation of both sets, the regime before the method
        assert "reward.custom_reward_function.path=pkg://reward_fns.verl_reward" in overrides
        assert f"data.val_files={out / 'task' / 'data' / 'val.parquet'}" in overrides
        assert overrides.index(f"actor_rollout_ref.actor.optim.lr={HOT_LR['speech']}") > overrides.index(
            "trainer.total_training_steps=2"
        )
    assert any("++actor_rollout_ref.actor.policy_loss.maspo.codec.layout=mini-llasa" in o for o in calls[1])
    assert "eval train content 0.400->0.450  eval heldout content 0.100->0.100" in printed
    assert "| hot | grpo | 1 |" in printed and "gain - grpo (held-out sentences)" in printed
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert [(r["regime"], r["method"]) for r in rows] == [("hot", "grpo"), ("hot", "maspo-fsq")]
    assert float(rows[1]["heldout_gain_vs_grpo_mean"]) == 0.0 and rows[1]["heldout_paired_seeds"] == "1"
    assert (out / "ablation.png").stat().st_size > 0
    # every evaluation's paired change by both ears, from the runs' validation dumps
    evaluated = list(csv.DictReader((out / "evaluations.csv").open()))
    assert {(r["method"], r["source"], r["ear"], r["step"]) for r in evaluated} == {
        (m, s, e, "2")
        for m in ("grpo", "maspo-fsq")
        for s in (TRAIN_SOURCE, HELDOUT_SOURCE)
        for e in ("whisper", "second")
    }
    assert all(float(r["change"]) == pytest.approx(-0.2) for r in evaluated)
    summary = (out / "summary.md").read_text()
    assert "heldout second: before -> after, change (95 %)" in summary
    assert "0.800 -> 0.600, -0.200" in summary  # held-out, second ear: 0.5 + 0.1 + 0.2 -> 0.3 + 0.1 + 0.2
    assert ablate.main(argv) == 0  # again: resumed, nothing run
    assert len(calls) == 2 and "resuming: 2/2 runs already finished" in capsys.readouterr().out


def test_a_grid_evaluated_every_few_steps_writes_its_long_run_files(tmp_path, monkeypatch):
    import maspo_lab.runs.launch as launch

    calls: list = []
    monkeypatch.setattr(launch, "run_trainer", _fake_trainer(calls, evaluated_steps=(0, 1, 2)))
    out = tmp_path / "long"
    argv = ["--method", "grpo", "--method", "gspo", "--seeds", "0", "--steps", "2", "--eval-every", "1"]
    argv += ["--save-every", "1", "--texts", "3", "--eval-texts", "1", "--heldout", "1", "--eval-samples", "1"]
    assert ablate.main([*argv, "--out", str(out)]) == 0
    assert all("trainer.test_freq=1" in c and "trainer.save_freq=1" in c for c in calls)
    lines = [json.loads(line) for line in (out / "long-runs.jsonl").read_text().splitlines()]
    assert [(r["method"], r["step"]) for r in lines] == [(m, s) for m in ("grpo", "gspo") for s in (0, 1, 2)]
    assert lines[2]["heldout_whisper"] == pytest.approx(0.4) and lines[2]["heldout_second"] == pytest.approx(0.6)
    assert "| default | gspo | 1 |" in (out / "long-runs.md").read_text()
    assert (out / "long-runs.png").stat().st_size > 0 and (out / "long-runs.csv").exists()
    steps = list(csv.DictReader((out / "long-runs-steps.csv").open()))
    assert [(r["method"], r["step"]) for r in steps] == [(m, s) for m in ("grpo", "gspo") for s in ("1", "2")]
    assert [float(r["batch_cer"]) for r in steps[:2]] == [0.6, 0.55]  # the fake run's batch CERs
    assert float(steps[0]["s_per_step"]) == 30.0 and steps[0]["regime"] == "default"
    paired = list(csv.DictReader((out / "long-runs-paired.csv").open()))  # the same fake run: no difference
    assert {(r["method"], r["reference"]) for r in paired} == {("gspo", "grpo")}
    assert all(float(r["difference"]) == 0.0 for r in paired)
    assert "The rollouts' CER paired by step" in (out / "long-runs.md").read_text()
    by_sentence = (out / "long-runs.md").read_text().partition("paired by sentence")[2].partition("paired by step")[0]
    assert "| default | gspo | 0 | grpo |" in by_sentence
    # the files describe the folder: a regime run by another command is read with it, and a control linked into a
    # regime counts only beside a trained method there
    from maspo_lab.analysis import long_runs, paired_runs

    (out / "runs" / "other").mkdir()
    (out / "runs" / "other" / paired_runs.CONTROL).symlink_to(out / "runs" / "default" / "grpo")
    long_runs.write(out, long_runs.runs_in(out), "two commands")
    assert "| other |" not in (out / "long-runs.md").read_text()
    (out / "runs" / "other" / "grpo").symlink_to(out / "runs" / "default" / "gspo")
    long_runs.write(out, long_runs.runs_in(out), "two commands")
    regimes = {(r["regime"], r["method"]) for r in map(json.loads, (out / "long-runs.jsonl").read_text().splitlines())}
    assert regimes == {("default", "grpo"), ("default", "gspo"), ("other", "grpo"), ("other", paired_runs.CONTROL)}
    # the files read back describe the same runs without their folders (a fresh machine keeps the files only)
    earlier = long_runs.recorded(out / "long-runs.jsonl", out / "long-runs-steps.csv")
    (again := tmp_path / "again").mkdir()
    long_runs.write(again, {}, "two commands", earlier)
    for suffix in (".jsonl", "-steps.csv", ".csv", "-paired.csv", ".md"):
        assert (again / f"long-runs{suffix}").read_text() == (out / f"long-runs{suffix}").read_text(), suffix
    # beside the folder's runs: a run only recorded joins them, a run in both is the folder's
    records, steps = earlier
    stale = {key: [{**r, "heldout_whisper": 9.0} for r in rs] for key, rs in records.items()}
    stale[("default", "grpo", 7)] = records[("default", "grpo", 0)]
    long_runs.write(out, long_runs.runs_in(out), "two commands", (stale, {**steps, ("default", "grpo", 7): []}))
    lines = [json.loads(line) for line in (out / "long-runs.jsonl").read_text().splitlines()]
    default = {(r["method"], r["seed"], r["step"]): r["heldout_whisper"] for r in lines if r["regime"] == "default"}
    assert {(method, seed) for method, seed, _ in default} == {("grpo", 0), ("gspo", 0), ("grpo", 7)}
    assert all(default["grpo", 7, step] == default["grpo", 0, step] for step in (0, 1, 2))
    assert 9.0 not in {r["heldout_whisper"] for r in lines}


def test_every_maspo_method_reads_mini_llasas_layout_on_speech():
    from maspo_lab.methods import BUILTIN_METHODS
    from maspo_lab.runs import speech_run

    for name in BUILTIN_METHODS:
        settings = speech_run.TASK.method(name).settings
        if settings.loss_mode == "maspo":
            assert settings.maspo.codec.layout == "mini-llasa", name
        if settings.adv_estimator == "maspo":
            assert settings.credit.codec.layout == "mini-llasa", name


def test_the_code_ear_can_score_the_speech_task(tmp_path, monkeypatch):
    """``--recogniser ear``: the shipped ear scores training responses; Whisper and PocketSphinx still hear the
    evaluations (reward settings built from the overrides as veRL's reward worker builds them)."""
    import maspo_lab.runs.launch as launch
    from maspo_base.typed_settings import build
    from maspo_lab.speaking_model import SHIPPED_EAR
    from reward_fns.reward_settings import ModelSettings

    assert ablate.parse_args(["--recogniser", "ear"]).task_settings["recogniser"] == "ear"
    calls: list = []
    monkeypatch.setattr(launch, "run_trainer", _fake_trainer(calls))
    out = tmp_path / "grid"
    argv = ["--method", "grpo", "--seeds", "0", "--steps", "2", "--texts", "2", "--eval-texts", "1", "--heldout"]
    assert ablate.main([*argv, "1", "--eval-samples", "1", "--recogniser", "ear", "--out", str(out)]) == 0
    kw = "+reward.custom_reward_function.reward_kwargs."
    (overrides,) = calls
    kwargs: dict = {}
    for o in overrides:
        if o.startswith(kw):
            key, value = o[len(kw) :].split("=", 1)
            *parents, leaf = key.split(".")
            node = kwargs
            for parent in parents:
                node = node.setdefault(parent, {})
            node[leaf] = value
    assert kwargs["ear"] == str(SHIPPED_EAR) and kwargs["reward_config"]["recogniser"] == "ear"
    settings = build(ModelSettings, kwargs, "reward_kwargs")
    assert settings.second_asr and settings.asr  # the evaluations' two audio ears
