"""`maspo_verl.verl_patches.metrics`: the numeric parts of a custom reward become ``reward/<key>/mean`` metrics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from verl import DataProto

from maspo_verl.verl_patches import metrics as reward_metrics


def test_part_means_keep_finite_numbers_only():
    metrics = reward_metrics.part_means(
        {
            "score": [0.5, 0.7],  # critic/score/mean already says it
            "content": [0.0, 0.5, 1.0],
            "end": [True, False, False, False],
            "frames": [np.int64(3), np.int64(5)],
            "transcript": ["ab", "ba"],
            "broken": [0.1, math.nan],
            "mixed": [0.1, None],
            "empty": [],
        }
    )
    assert metrics == {"reward/content/mean": 0.5, "reward/end/mean": 0.25, "reward/frames/mean": 4.0}


def test_legacy_trainer_batch_parts_reach_compute_data_metrics():
    from verl.trainer.ppo.metric_utils import compute_data_metrics as wrapped  # as the plugin installed it

    assert getattr(wrapped, "__maspo_wrapped__", False)
    batch_size, prompt, response = 2, 3, 4
    tensors = {
        "token_level_scores": torch.tensor([[0, 0, 0, 0.5], [0, 0, 1.0, 0]]),
        "token_level_rewards": torch.tensor([[0, 0, 0, 0.5], [0, 0, 1.0, 0]]),
        "advantages": torch.zeros(batch_size, response),
        "returns": torch.zeros(batch_size, response),
        "responses": torch.ones(batch_size, response, dtype=torch.long),
        "attention_mask": torch.tensor([[1] * 7, [1] * 6 + [0]]),
        "response_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]),
        "prompts": torch.ones(batch_size, prompt, dtype=torch.long),
    }
    parts = {"content": np.array([0.25, 0.75]), "unit_error_rate": np.array([0.75, 0.25]), "uid": np.array(["a", "b"])}
    batch = DataProto.from_dict(
        tensors=tensors, non_tensors=parts, meta_info={"reward_extra_keys": ["content", "unit_error_rate"]}
    )
    metrics = wrapped(batch=batch, use_critic=False)
    assert metrics["reward/content/mean"] == pytest.approx(0.5)
    assert metrics["reward/unit_error_rate/mean"] == pytest.approx(0.5)
    assert "reward/uid/mean" not in metrics  # not a reward key
    assert "critic/score/mean" in metrics  # veRL's own metrics are still there


def test_v1_extra_fields_keep_keys_every_sample_has():
    fields = [
        {"reward_extra_info": {"content": 1.0, "end": 1.0}},
        {"reward_extra_info": {"content": 0.0}},
        {"other": 1},
    ]
    assert reward_metrics.extra_fields_parts(fields[:2]) == {"content": [1.0, 0.0]}
    assert reward_metrics.extra_fields_parts(fields) == {}


def test_plugin_patches_the_trainers_when_they_are_imported(fresh_verl):
    result = fresh_verl("trainer_patches")  # tests/conftest.py: a fresh interpreter imports veRL's legacy trainer
    # one wrapper of compute_data_metrics (reward parts and credit metrics), the same object wherever veRL bound it
    assert result == {"wrapped": True, "same_everywhere": True, "wrapped_once": True}
