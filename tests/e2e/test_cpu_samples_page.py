"""The listening page from the default (v1) trainer's rollout dumps (`maspo_verl.listening`, hooked on the trainer's
``_dump_generations``): the run shared with test_cpu_credit and test_cpu_maspo, with ``trainer.rollout_data_dir``
and ``trainer.samples.train_every=1``. The legacy trainer's page, validation included, with audio and in a browser,
is checked on the recipe's speech-reward run (test_recipe_llasa_1b_cpu.py)."""

from __future__ import annotations

import json

import pytest

from maspo_verl.listening import PAGE, read_rows

pytestmark = pytest.mark.e2e


def test_v1_rollouts_reach_the_page_with_veRLs_own_scores(shared_run):
    run = shared_run("v1_probe_token_jump").run
    assert run.ok, run.log_tail()
    folder = run.log_path.parent
    rows = read_rows(folder / "samples")
    # 4 prompts x 2 responses a step, the default count of 8: every response of both steps
    assert sorted({(r["step"], r["kind"]) for r in rows}) == [(1, "training"), (2, "training")]
    for step in (1, 2):
        page_scores = [r["score"] for r in rows if r["step"] == step]
        dumped = [json.loads(line) for line in (folder / "rollouts" / f"{step}.jsonl").read_text().splitlines()]
        assert len(page_scores) == len(dumped) == 8
        assert page_scores == [d["score"] for d in dumped]  # veRL's own JSONL, row for row
        metric = run.steps[step - 1]["critic/score/mean"]
        assert sum(page_scores) / 8 == pytest.approx(metric, rel=1e-5)
    # the synthetic task has no codec: no players; v1 hands its rollout dump no reward parts
    assert all(r["audio"] is None and r["note"] == "" for r in rows)
    page = (folder / "samples" / PAGE).read_text()
    assert "<audio" not in page and page.index('data-step="2"') < page.index('data-step="1"')
