"""The synthetic task's veRL overrides: the demo's evaluation scores the training texts before and after training."""

import pytest

from maspo_verl.cpu.synthetic_run import TaskPaths, run_overrides


def _overrides(**settings) -> dict[str, str]:
    task = TaskPaths(model="/m", train="/d/train.parquet", val="/d/val.parquet")
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


def test_the_recipes_tiny_scale_runs_the_demo_settings():
    """`trainer_config/scale/tiny.yaml` (the recipes' CPU scale) repeats `TASK_DEFAULTS` in Hydra's terms."""
    from pathlib import Path

    import yaml

    import maspo_verl
    from maspo_verl.cpu.synthetic_run import TASK_DEFAULTS as d

    tiny = yaml.safe_load((Path(maspo_verl.__file__).parent / "trainer_config" / "scale" / "tiny.yaml").read_text())
    actor, rollout = tiny["actor_rollout_ref"]["actor"], tiny["actor_rollout_ref"]["rollout"]
    assert tiny["data"]["train_batch_size"] == d["batch"]
    assert tiny["data"]["max_response_length"] == d["response_length"]
    assert rollout["n"] == d["n"] and rollout["temperature"] == d["temperature"]
    assert actor["optim"]["lr"] == d["lr"]
    assert d["batch"] // actor["ppo_mini_batch_size"] == d["mini_batches"]
    assert tiny["trainer"]["total_training_steps"] == d["steps"]
