"""One rule for where speech generation stops, one sampler: the ``hf`` rollout, ``maspo-verl eval`` and `Speaker`
stop a model at the same token and say the same thing for the same seed."""

from __future__ import annotations

import asyncio
import json
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import AutoTokenizer, GenerationConfig, PreTrainedTokenizerFast

from maspo_base.llasa_response import GateConfig, parse_token_ids
from maspo_base.speech_tokens import mini_llasa_tokens as mt
from maspo_base.speech_tokens.layouts import MINI_LLASA
from maspo_base.speech_tokens.llasa_generation import TokenizerFileVocabulary, checkpoint_stop_ids, stop_ids
from maspo_base.speech_tokens.llasa_prompt import render_prompt_ids
from maspo_lab.speaking_model.model import ModelSize, build_model, build_tokenizer
from maspo_lab.speaking_model.speaker import Sampling, Speaker, generate_hf
from maspo_verl.cpu.hf_rollout import HFRolloutServer

SECONDS = 10.0
BUDGET = int(SECONDS * MINI_LLASA.frame_rate) + 1  # what `Speaker` allows for SECONDS of codes
TEMPERATURE = 1.5
TEXTS = ["a cat sat", "on the mat", "the sun is warm today", "a cat sat"]  # one text twice: its second stream


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def eot_only(tmp_path_factory, tokenizer):
    """A random tiny mini-llasa whose own generation config stops at ``<|eot_id|>`` only: the end tag is a stop id
    through the rule alone."""
    size = ModelSize(
        hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=64, max_positions=1024
    )
    path = build_model(tmp_path_factory.mktemp("eot_only"), size, seed=0)
    config_file = path / "generation_config.json"
    eot = tokenizer.convert_tokens_to_ids(mt.EOT)
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "eos_token_id": [eot]}))
    return path


def test_stop_ids_are_the_checkpoints_end_ids_then_the_end_tag(tokenizer):
    eot, end = tokenizer.convert_tokens_to_ids(mt.EOT), MINI_LLASA.end_id
    assert stop_ids(tokenizer, GenerationConfig(eos_token_id=eot)) == [eot, end]
    assert stop_ids(tokenizer, GenerationConfig(eos_token_id=[end, eot])) == [end, eot]  # not repeated
    assert stop_ids(tokenizer, GenerationConfig(eos_token_id=None)) == [end]
    assert stop_ids(tokenizer) == [tokenizer.eos_token_id, end]  # no generation config: the tokenizer's end


def test_a_tokenizer_without_speech_tags_stops_at_its_own_end_and_none_at_all_is_an_error():
    plain = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel({"a": 0, "b": 1, "</s>": 2, "<unk>": 3}, unk_token="<unk>")),
        eos_token="</s>",
        unk_token="<unk>",
    )
    assert stop_ids(plain, GenerationConfig(eos_token_id=1)) == [1]
    assert stop_ids(plain) == [2]
    with pytest.raises(ValueError, match="eos_token_id.*never stop"):
        stop_ids(plain, GenerationConfig(eos_token_id=None))


def test_a_checkpoints_stop_ids_from_its_tokenizer_file_are_those_of_its_whole_tokenizer(eot_only, tmp_path):
    whole = AutoTokenizer.from_pretrained(eot_only)
    assert TokenizerFileVocabulary(eot_only / "tokenizer.json").get_vocab() == whole.get_vocab()
    config = GenerationConfig.from_pretrained(eot_only)
    assert checkpoint_stop_ids(eot_only, config) == stop_ids(whole, config) == [whole.eos_token_id, MINI_LLASA.end_id]
    # without a generation_config.json the tokenizer's own end is read, from the whole tokenizer
    bare = shutil.copytree(eot_only, tmp_path / "bare")
    (bare / "generation_config.json").unlink()
    assert checkpoint_stop_ids(bare) == stop_ids(whole) == [whole.eos_token_id, MINI_LLASA.end_id]


def test_eval_speak_and_the_rollout_stop_the_same_model_at_the_same_token(eot_only, tokenizer):
    stops = checkpoint_stop_ids(eot_only)
    assert stops == [tokenizer.convert_tokens_to_ids(mt.EOT), MINI_LLASA.end_id]
    prompts = [render_prompt_ids(tokenizer, text) for text in TEXTS]

    server = HFRolloutServer(
        SimpleNamespace(response_length=BUDGET, prompt_length=128, seed=0), {"path": str(eot_only)}
    )
    assert server.stop_ids == stops

    async def one_by_one():
        params = {"temperature": TEMPERATURE, "top_p": 1.0, "top_k": -1}
        return [(await server.generate(p, dict(params))).token_ids for p in prompts]

    served = asyncio.run(one_by_one())
    ends = [response[-1] for response in served if len(response) < BUDGET]
    # preconditions: responses that end at the end tag (a stop through the rule only), at eot, and one that does not
    assert MINI_LLASA.end_id in ends and any(len(r) == BUDGET for r in served), [len(r) for r in served]
    for response in served:  # each ends at its first stop id
        assert not set(response[:-1]) & set(stops)

    evaluated = generate_hf(eot_only, tokenizer, prompts, Sampling(TEMPERATURE, 1.0, BUDGET, seed=0), "cpu", 3)
    assert evaluated == served

    said = Speaker(eot_only).codes(TEXTS, temperature=TEMPERATURE, seed=0, batch=3, max_seconds=SECONDS)
    gate = GateConfig(max_codes=None)
    for codes, response in zip(said, served, strict=True):
        parsed = parse_token_ids(response, MINI_LLASA, config=gate)
        np.testing.assert_array_equal(codes, parsed.codes if parsed.ok else np.zeros(0, dtype=np.int64))
