"""adv_estimator=maspo inside veRL's real trainers on CPU: each reward's frame errors reach the right tokens.

The hooks write what the estimator received and returned (``MASPO_VERL_CREDIT_TRACE``): per response its token ids,
the frame errors as placed on its tokens, its group id, score and advantages. The probe reward flags frame k iff its
codec id is odd, so the test recomputes, from the token ids alone, which token of which response must carry which
error, and from veRL's own grpo the advantages the formula must give.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from shared_runs import CREDIT_WEIGHT
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

from reward_fns.speech_tokens.llasa_tokens import CODEBOOK_SIZE, CODEC_OFFSET

pytestmark = pytest.mark.e2e

PROBE_RUNS = {"legacy": "legacy_probe_seg_mean", "v1": "v1_probe_token_jump"}
"""The runs with the probe reward, one per trainer (`shared_runs`; their losses do not enter the advantages)."""


def _trace(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _expected_advantages(rows: list[dict]) -> list[torch.Tensor]:
    """veRL's grpo on the traced scores plus ``lambda * u_g * (ebar_i - e_{i,t})`` on frame tokens, in float64."""
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
            advantages[frames] += CREDIT_WEIGHT * unit * (mean - errors[frames])
        expected.append(advantages)
    return expected


def _check_probe_trace(trace: list[dict], run) -> None:
    assert len(trace) == 2  # one advantage call per step
    mixed = 0
    for call, logged in zip(trace, run.steps):
        rows = call["rows"]
        group_scores = {}
        for row in rows:
            group_scores.setdefault(row["uid"], []).append(row["score"])
        for row, expected in zip(rows, _expected_advantages(rows)):
            ids = torch.tensor(row["responses"])
            frames = (ids >= CODEC_OFFSET) & (ids < CODEC_OFFSET + CODEBOOK_SIZE)
            # frame k of this response sits on its k-th codec token, with the error the reward gave frame k
            assert row["frame_mask"] == frames.tolist()
            assert row["aligned"] == bool(frames.any())
            flags = ((ids - CODEC_OFFSET) % 2 == 1) & frames
            assert row["frame_errors"] == flags.float().tolist()
            advantages = torch.tensor(row["advantages"], dtype=torch.float64)
            torch.testing.assert_close(advantages, expected, rtol=0, atol=1e-5)
            spread = len(set(group_scores[row["uid"]])) > 1  # a group of equal rewards gets no credit (u_g = 0)
            if spread and flags.any() and (frames & ~flags).any():
                mixed += 1
                # flagged frames are pushed less (or pulled more) than the unflagged frames of the same response
                assert advantages[flags].max() < advantages[frames & ~flags].min()
        flagged = sum(sum(e > 0 for e in r["frame_errors"]) for r in rows if r["aligned"])
        frame_count = sum(sum(r["frame_mask"]) for r in rows if r["aligned"])
        assert logged["maspo_credit/flagged_frame_fraction"] == pytest.approx(flagged / frame_count)
        assert logged["maspo_credit/unaligned_samples"] == sum(not r["aligned"] for r in rows)
        assert logged["maspo_credit/credit_abs_mean"] > 0
    assert mixed >= 2, mixed  # responses with flagged and unflagged frames in a group with reward spread


@pytest.mark.parametrize("trainer", ["legacy", "v1"])
def test_frame_k_of_response_i_reaches_token_k_of_response_i(shared_run, trainer):
    traced = shared_run(PROBE_RUNS[trainer])
    assert traced.run.ok, traced.run.log_tail()
    _check_probe_trace(_trace(traced.trace), traced.run)


def test_synthetic_task_errors_reach_the_estimator(shared_run):
    # the legacy trainer with the synthetic task's own reward (the run test_cpu_maspo checks fixed windows on)
    traced = shared_run("legacy_fixed_window_credit")
    run, trace = traced.run, traced.trace
    assert run.ok, run.log_tail()
    calls = _trace(trace)
    assert len(calls) == 2
    from maspo_verl.data import synthetic_tts

    for call, logged in zip(calls, run.steps):
        for row, expected in zip(call["rows"], _expected_advantages(call["rows"])):
            ids = torch.tensor(row["responses"])
            frames = (ids >= CODEC_OFFSET) & (ids < CODEC_OFFSET + CODEBOOK_SIZE)
            assert row["aligned"] == bool(frames.any())
            codes = (ids[frames] - CODEC_OFFSET).tolist()
            # a frame heard as noise is always an error; the rest depends on the text, checked in unit tests
            noise = [synthetic_tts.label(code) is None for code in codes]
            errors = torch.tensor(row["frame_errors"])[frames].tolist()
            assert all(e == 1.0 for e, is_noise in zip(errors, noise) if is_noise)
            torch.testing.assert_close(
                torch.tensor(row["advantages"], dtype=torch.float64), expected, rtol=0, atol=1e-5
            )
        for key in ("flagged_frame_fraction", "credit_abs_mean", "unaligned_samples"):
            assert f"maspo_credit/{key}" in logged
        assert logged["maspo_credit/unaligned_samples"] == sum(not r["aligned"] for r in call["rows"])
