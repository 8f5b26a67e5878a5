"""adv_estimator=maspo inside veRL's real trainers on CPU: each reward's frame errors reach the right tokens.

The hooks write what the estimator received and returned (``MASPO_VERL_CREDIT_TRACE``): per response its token ids,
the frame errors as placed on its tokens, its group id, score and advantages. The probe reward flags frame k iff its
codec id is odd, so the test recomputes, from the token ids alone, which token of which response must carry which
error, and from veRL's own grpo the advantages the formula must give (`credit_trace`). The speech reward's frame
errors (Whisper's words aligned to frames) reach the estimator in the recipe's CPU smoke
(tests/e2e/test_recipe_llasa_1b_cpu.py); the synthetic task's frame errors are checked in tests/data.
"""

from __future__ import annotations

import pytest
import torch
from credit_trace import expected_advantages, read_trace
from shared_runs import CREDIT_WEIGHT

from maspo_base.speech_tokens.llasa_tokens import CODEBOOK_SIZE, CODEC_OFFSET

pytestmark = pytest.mark.e2e

PROBE_RUNS = {"legacy": "legacy_probe_seg_mean", "v1": "v1_probe_token_jump"}
"""The runs with the probe reward, one per trainer (`shared_runs`; their losses do not enter the advantages)."""


def _check_probe_trace(trace: list[dict], run) -> None:
    assert len(trace) == 2  # one advantage call per step
    mixed = 0
    for call, logged in zip(trace, run.steps):
        rows = call["rows"]
        group_scores = {}
        for row in rows:
            group_scores.setdefault(row["uid"], []).append(row["score"])
        for row, expected in zip(rows, expected_advantages(rows, CREDIT_WEIGHT)):
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


@pytest.mark.slow(110)
@pytest.mark.parametrize("trainer", ["legacy", "v1"])
def test_frame_k_of_response_i_reaches_token_k_of_response_i(shared_run, trainer):
    traced = shared_run(PROBE_RUNS[trainer])
    assert traced.run.ok, traced.run.log_tail()
    _check_probe_trace(read_trace(traced.trace), traced.run)
