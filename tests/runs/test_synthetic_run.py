"""The synthetic task's veRL overrides: the demo's evaluation scores the training texts before and after training."""

import pytest

from maspo_lab.runs.synthetic_run import TaskPaths, run_overrides

SHAPE = {
    "steps": 2,
    "batch": 2,
    "n": 2,
    "mini_batches": 1,
    "micro_batch": 4,
    "response_length": 16,
    "lr": 1e-6,
    "seed": 0,
}


def _overrides(**settings) -> dict[str, str]:
    task = TaskPaths(model="/m", train="/d/train.parquet", val="/d/val.parquet")
    settings = {"temperature": 1.0, "eval_samples": 0, **SHAPE, **settings}
    return dict(item.split("=", 1) for item in run_overrides(task, **settings) if "=" in item)


def test_evaluation_validates_the_training_texts_before_the_first_and_after_the_last_step():
    got = _overrides(steps=12, temperature=0.8, eval_samples=8)
    assert got["data.train_files"] == got["data.val_files"] == "/d/train.parquet"
    assert got["trainer.val_before_train"] == "True"
    assert got["trainer.test_freq"] == "12"
    assert got["actor_rollout_ref.rollout.val_kwargs.n"] == "8"
    assert got["actor_rollout_ref.rollout.val_kwargs.do_sample"] == "True"
    assert got["actor_rollout_ref.rollout.val_kwargs.temperature"] == got["actor_rollout_ref.rollout.temperature"]


def test_without_evaluation_no_validation_runs():
    got = _overrides(steps=12)
    assert got["data.val_files"] == "/d/val.parquet"
    assert got["trainer.val_before_train"] == "False"
    assert got["trainer.test_freq"] == "-1"
    assert not any(key.startswith("actor_rollout_ref.rollout.val_kwargs") for key in got)


def test_negative_eval_samples_are_refused():
    with pytest.raises(ValueError, match="eval_samples=-1"):
        _overrides(eval_samples=-1)


def test_the_demo_shape_is_the_recipes_tiny_scale():
    """`TASK_DEFAULTS` reads ``scale/tiny.yaml``: the demo's run composes to the recipes' CPU scale."""
    from maspo_lab.runs.synthetic_run import TASK_DEFAULTS, TASK_SCALE, task_overrides

    got = dict(
        item.split("=", 1)
        for item in task_overrides(TaskPaths("/m", "/t", "/v"), steps=TASK_DEFAULTS["steps"], seed=0)
        if "=" in item
    )
    for key in ("train_batch_size", "max_prompt_length", "max_response_length"):
        assert got[f"data.{key}"] == str(TASK_SCALE["data"][key])
    actor = TASK_SCALE["actor_rollout_ref"]["actor"]
    assert got["actor_rollout_ref.actor.ppo_mini_batch_size"] == str(actor["ppo_mini_batch_size"])
    # The scale regroups micro-batches by token count; the demo updates on one micro-batch per mini-batch, the same
    # gradient (tests/test_dynamic_micro_batches.py) with fixed, reproducible grouping.
    sequences_per_mini_batch = actor["ppo_mini_batch_size"] * TASK_SCALE["actor_rollout_ref"]["rollout"]["n"]
    assert got["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == str(sequences_per_mini_batch)
    for key in ("n", "temperature", "log_prob_micro_batch_size_per_gpu"):
        assert got[f"actor_rollout_ref.rollout.{key}"] == str(TASK_SCALE["actor_rollout_ref"]["rollout"][key])
    assert float(got["actor_rollout_ref.actor.optim.lr"]) == TASK_SCALE["actor_rollout_ref"]["actor"]["optim"]["lr"]
    assert got["trainer.total_training_steps"] == str(TASK_SCALE["trainer"]["total_training_steps"])
