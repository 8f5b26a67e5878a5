"""`maspo_lab.runs.tasks`: each task, by name, is the typed `Task` its run module builds, read by ``--task`` first."""

from __future__ import annotations

import dataclasses

import pytest

from maspo_lab.runs import speech_run, synthetic_run
from maspo_lab.runs.task import Task
from maspo_lab.runs.tasks import TASK_NAMES, task_named, task_of


def test_each_task_is_the_typed_task_of_its_run_module(tmp_path):
    for name, module in zip(TASK_NAMES, (speech_run, synthetic_run)):
        task = task_named(name)
        assert isinstance(task, Task) and task is module.TASK and task.name == name
        assert task.defaults is module.TASK_DEFAULTS and next(iter(task.eval_sets)) == "train"
        files = task.paths(tmp_path)
        assert (files.train, files.val) == (tmp_path / "data" / "train.parquet", tmp_path / "data" / "val.parquet")
        assert f"data.train_files={files.train}" in task.overrides(files, steps=2, seed=3)
    with pytest.raises(ValueError, match="no task 'nope'; valid: speech, synthetic"):
        task_named("nope")


def test_the_task_option_is_read_before_the_others():
    assert task_of(["--steps", "3", "--task", "synthetic"]) is synthetic_run.TASK
    assert task_of(["--steps", "3"]) is speech_run.TASK
    assert task_of(["--task", "nope"]) is speech_run.TASK  # the command's own parser rejects it


def test_a_task_lacking_a_field_fails_where_it_is_built():
    given = {f.name: getattr(synthetic_run.TASK, f.name) for f in dataclasses.fields(Task)}
    with pytest.raises(TypeError, match="evaluation_figures"):
        Task(**{k: v for k, v in given.items() if k != "evaluation_figures"})


def test_a_kl_term_is_asked_for_by_its_coefficient_and_a_bad_one_is_refused():
    from maspo_lab.runs.run_shape import kl_term_overrides

    assert kl_term_overrides(0.0) == ["actor_rollout_ref.actor.use_kl_loss=False"]
    assert kl_term_overrides(0.25) == [
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.25",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    ]
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="kl_coef="):
            kl_term_overrides(bad)
    # the synthetic task has none (scale/tiny.yaml), the speech task the code ear's learning setting's
    files = synthetic_run.TASK.paths("/w")
    assert "actor_rollout_ref.actor.use_kl_loss=False" in synthetic_run.TASK.overrides(files, steps=2, seed=0)
    assert speech_run.TASK_DEFAULTS["kl_coef"] == speech_run.LEARNING_SETTING["kl_coef"] == 0.1
