"""Make generation stop at Llasa's ``<|SPEECH_GENERATION_END|>`` without editing the checkpoint.

Llasa-1B's ``generation_config.json`` stops at Llama-3.2's end tokens only; a rollout would then run every response
to ``max_response_length``. veRL 0.9.1 passes no stop ids to vLLM, but vLLM reads its stop ids from a
``generation_config.json`` in the folder given as its ``generation_config`` engine argument. `write_stop_config`
writes that folder: the checkpoint's generation config with ``<|SPEECH_GENERATION_END|>`` added to ``eos_token_id``
(the id read from the checkpoint's tokenizer and checked against Llasa's layout). The recipe passes it as
``+actor_rollout_ref.rollout.engine_kwargs.vllm.generation_config=<folder>``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from . import llasa_tokens as lt
from .layout import LLASA_1B


def stop_token_ids(model_dir: str | Path) -> list[int]:
    """The checkpoint's own ``eos_token_id`` (int or list) plus ``<|SPEECH_GENERATION_END|>``, in that order."""
    from transformers import AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    LLASA_1B.check_tokenizer(tokenizer)
    try:
        eos = GenerationConfig.from_pretrained(str(model_dir)).eos_token_id
    except OSError:  # no generation_config.json: the tokenizer's end token
        eos = tokenizer.eos_token_id
    ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    end = tokenizer.convert_tokens_to_ids(lt.SPEECH_GENERATION_END)
    return ids + [end] if end not in ids else ids


def write_stop_config(model_dir: str | Path, out_dir: str | Path) -> Path:
    """Write ``out_dir/generation_config.json``: the checkpoint's, with `stop_token_ids` as ``eos_token_id``."""
    model_dir, out = Path(model_dir), Path(out_dir)
    source = model_dir / "generation_config.json"
    config = json.loads(source.read_text()) if source.exists() else {}
    config["eos_token_id"] = stop_token_ids(model_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "generation_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


if __name__ == "__main__":  # python -m reward_fns.speech_tokens.llasa_generation MODEL_DIR OUT_DIR
    if len(sys.argv) != 3:
        sys.exit("usage: python -m reward_fns.speech_tokens.llasa_generation MODEL_DIR OUT_DIR")
    print(write_stop_config(sys.argv[1], sys.argv[2]))
