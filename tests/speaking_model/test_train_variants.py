"""`scripts/train_variants.py`: variants trained at once from an examples file, returned as bfloat16 weights and a
summary, and assembled back into a checkpoint that `build-model --reuse` reads (here on the CPU, as on a GPU)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch


def load_script():
    path = Path(__file__).parents[2] / "scripts" / "train_variants.py"
    spec = importlib.util.spec_from_file_location("train_variants", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_variants_train_from_examples_and_assemble_into_the_checkpoint_they_were(tiny_mini_llasa, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from maspo_base.speech_tokens.text_frontend import frontend_of
    from maspo_lab.speaking_model.training import heldout_loss, read_examples

    script = load_script()
    out = tmp_path / "out"
    argv = ["--examples", str(tiny_mini_llasa / "examples.json"), "--out", str(out), "--device", "cpu"]
    argv += ["--variant", "a:32,2,2,64,0.1", "--variant", "b:32,1,2,64,0"]
    extra = ["--", "--steps", "2", "--eval-every", "1", "--tokens-per-batch", "512", "--lr", "1e-3"]
    assert script.main(argv + extra) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert {name: v["exit"] for name, v in summary.items()} == {"a": 0, "b": 0}
    assert (
        summary["a"]["training"]["settings"]["dropout"] == 0.1 and summary["b"]["training"]["size"]["num_layers"] == 1
    )
    checkpoint = script.assemble(
        out / "summary.json", "a", out / "a.safetensors", tiny_mini_llasa / "examples.json", tmp_path / "a"
    )
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    assert frontend_of(AutoTokenizer.from_pretrained(checkpoint)) == "espeak-ng:en-us"
    held = [tuple(e) for e in read_examples(checkpoint / "examples.json")["heldout"]]
    record = json.loads((checkpoint / "training.json").read_text())
    best = min(h["heldout_loss"] for h in record["history"])
    assert heldout_loss(model, held, model.config.pad_token_id, 512) == pytest.approx(best, rel=2e-3)  # bfloat16
    with pytest.raises(SystemExit):
        script.main(["--examples", "x", "--out", str(out), "--variant", "a:32,2,2"])
