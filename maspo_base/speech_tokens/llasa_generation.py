"""Where speech generation stops (`stop_ids`, one rule for every sampler), and vLLM made to stop there without
editing the checkpoint (`write_stop_config`).

Llasa-1B's ``generation_config.json`` stops at Llama-3.2's end tokens only; a rollout would then run every response
to ``max_response_length``. veRL 0.9.1 passes no stop ids to vLLM, but vLLM reads its stop ids from a
``generation_config.json`` in the folder given as its ``generation_config`` engine argument. `write_stop_config`
writes that folder: the checkpoint's generation config with ``<|SPEECH_GENERATION_END|>`` added to ``eos_token_id``
(the id read from the checkpoint's tokenizer). The recipe passes it as
``+actor_rollout_ref.rollout.engine_kwargs.vllm.generation_config=<folder>``.
"""

from __future__ import annotations

import json
from pathlib import Path

from . import llasa_tokens as lt


def stop_ids(tokenizer, generation_config=None) -> list[int]:
    """The ids a speech model's generation stops at, the one rule every sampler here follows (the ``hf`` rollout,
    ``maspo-verl eval`` and ``speak``, fidelity, and vLLM through `write_stop_config`): the checkpoint's own end ids
    (``generation_config.eos_token_id``, int or list; without a generation config, the tokenizer's
    ``eos_token_id``), then ``<|SPEECH_GENERATION_END|>`` where the tokenizer has it and it is not among them
    (every speech-token layout here ends speech with that tag, `maspo_base.speech_tokens.layouts`).
    ``ValueError`` when there is no stop id at all: generation would never stop."""
    eos = tokenizer.eos_token_id if generation_config is None else generation_config.eos_token_id
    ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    end = tokenizer.get_vocab().get(lt.SPEECH_GENERATION_END)
    if end is not None and end not in ids:
        ids.append(end)
    if not ids:
        raise ValueError(
            "the checkpoint has no generation_config.eos_token_id and its tokenizer no "
            f"{lt.SPEECH_GENERATION_END}: generation would never stop"
        )
    return ids


def checkpoint_stop_ids(model_dir: str | Path, generation_config=None, trust_remote_code: bool = False) -> list[int]:
    """`stop_ids` of the checkpoint in ``model_dir``: its ``generation_config`` (given, else its
    ``generation_config.json``) and its tokenizer. With a generation config and a ``tokenizer.json``, only that file's
    vocabulary is read (`TokenizerFileVocabulary`): building Llasa's whole tokenizer (65,800 added tokens) in
    `transformers` costs many times that (docs/benchmarks.md), and every trainer run's rollout starts with this."""
    from transformers import AutoTokenizer, GenerationConfig

    model_dir = Path(model_dir)
    if generation_config is None:
        try:
            generation_config = GenerationConfig.from_pretrained(str(model_dir))
        except OSError:  # no generation_config.json
            generation_config = None
    tokenizer_file = model_dir / "tokenizer.json"
    if generation_config is not None and tokenizer_file.exists():
        return stop_ids(TokenizerFileVocabulary(tokenizer_file), generation_config)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=trust_remote_code)
    return stop_ids(tokenizer, generation_config)


class TokenizerFileVocabulary:
    """A ``tokenizer.json``'s vocabulary, added tokens included, read by `tokenizers` alone: what `stop_ids` reads of
    a tokenizer when it is given a generation config (`get_vocab`), without the `transformers` tokenizer around it."""

    def __init__(self, path: str | Path):
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(path))

    def get_vocab(self) -> dict[str, int]:
        return self._tokenizer.get_vocab(with_added_tokens=True)


def write_stop_config(model_dir: str | Path, out_dir: str | Path) -> Path:
    """Write ``out_dir/generation_config.json``: the checkpoint's, with `checkpoint_stop_ids` as ``eos_token_id``."""
    model_dir, out = Path(model_dir), Path(out_dir)
    source = model_dir / "generation_config.json"
    config = json.loads(source.read_text()) if source.exists() else {}
    config["eos_token_id"] = checkpoint_stop_ids(model_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "generation_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out
