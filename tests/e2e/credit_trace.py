"""What ``MASPO_VERL_CREDIT_TRACE`` recorded (the advantage estimator's inputs and outputs, one JSON line per call)
and what veRL's grpo plus segment credit must have made of it, for the end-to-end credit checks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage


def read_trace(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def expected_advantages(rows: list[dict], credit_weight: float) -> list[torch.Tensor]:
    """veRL's grpo on the traced scores plus ``lambda * u_g * (ebar_i - e_{i,t})`` on frame tokens (``lambda`` =
    ``credit_weight``), in float64."""
    width = max(len(r["responses"]) for r in rows)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    rewards = torch.zeros(len(rows), width, dtype=torch.float64)
    for i, row in enumerate(rows):
        mask[i, : len(row["responses"])] = 1
        rewards[i, len(row["responses"]) - 1] = row["score"]
    index = np.array([r["uid"] for r in rows], dtype=object)
    outcome, _ = compute_grpo_outcome_advantage(rewards, mask, index)
    scores = torch.tensor([r["score"] for r in rows], dtype=torch.float64)
    expected = []
    for i, row in enumerate(rows):
        group = scores[torch.tensor(index == row["uid"])]
        std = group.std() if len(group) > 1 else torch.tensor(1.0, dtype=torch.float64)
        unit = std / (std + 1e-6)
        frames = torch.tensor(row["frame_mask"])
        errors = torch.tensor(row["frame_errors"], dtype=torch.float64)
        advantages = outcome[i, : len(row["responses"])].clone()
        if row["aligned"] and frames.any():
            mean = errors[frames].mean()
            advantages[frames] += credit_weight * unit * (mean - errors[frames])
        expected.append(advantages)
    return expected
