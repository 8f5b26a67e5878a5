"""The tiny Llasa model keeps every Llasa-1B id and renders prompts as Llasa expects."""

from __future__ import annotations

import pytest

from maspo_base.speech_tokens import llasa_tokens as lt
from maspo_base.speech_tokens.layouts import LLASA_1B
from maspo_base.speech_tokens.llasa_prompt import SPEECH_CHAT_TEMPLATE, render_prompt_ids
from maspo_lab.data.tiny_llasa import build_tiny_llasa


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = build_tiny_llasa(tmp_path_factory.mktemp("tiny_llasa"), corpus=["bad ok", "sim"])
    return AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)


def test_vocabulary_has_llasa_layout(built):
    tokenizer, model = built
    assert len(tokenizer) == model.config.vocab_size == 193_800
    assert [tokenizer.convert_tokens_to_ids(t) for t in lt.TAGS] == list(range(128256, 128264))
    assert tokenizer.convert_tokens_to_ids("<|s_0|>") == 128264
    assert tokenizer.convert_tokens_to_ids("<|s_12345|>") == 128264 + 12345
    assert tokenizer.convert_tokens_to_ids("<|s_65535|>") == 193799
    assert tokenizer.convert_tokens_to_ids("<|begin_of_text|>") == 128000
    assert tokenizer.convert_tokens_to_ids("<|eot_id|>") == 128009
    # tags and codes are ordinary added tokens: the reward sees them after skip_special_tokens=True
    text = tokenizer.decode([128264 + 7, 128264 + 65535, 128261], skip_special_tokens=True)
    assert text == "<|s_7|><|s_65535|><|SPEECH_GENERATION_END|>"
    assert tokenizer.encode("<|s_42|>", add_special_tokens=False) == [128264 + 42]


def test_prompt_opens_the_speech_turn(built):
    tokenizer, _ = built
    ids = render_prompt_ids(tokenizer, "bad ok")
    assert ids[0] == 128000  # <|begin_of_text|>
    assert ids[-1] == lt.SPEECH_GENERATION_START_ID
    # ... preceded by the assistant header, exactly as continue_final_message would leave it
    header = tokenizer.encode("<|start_header_id|>assistant<|end_header_id|>\n\n", add_special_tokens=False)
    assert ids[-1 - len(header) : -1] == header
    text = tokenizer.decode(ids)
    assert "Today Date: 26 Jul 2024" in text  # pinned: prompts do not change with the calendar
    assert "Convert the text to speech:<|TEXT_UNDERSTANDING_START|>bad ok<|TEXT_UNDERSTANDING_END|><|eot_id|>" in text
    # the tokenizer's own template is plain Llama-3.2: no speech tag unless veRL is given SPEECH_CHAT_TEMPLATE
    plain = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], add_generation_prompt=True)
    plain = plain["input_ids"] if hasattr(plain, "keys") else plain
    assert lt.SPEECH_GENERATION_START_ID not in plain
    assert "'" not in SPEECH_CHAT_TEMPLATE  # passes through a Hydra override quoted with '


def test_generation_stops_at_speech_end(built):
    _, model = built
    assert lt.SPEECH_GENERATION_END_ID in model.generation_config.eos_token_id
    assert model.config.tie_word_embeddings


def test_check_tokenizer_rejects_a_shifted_layout(built):
    tokenizer, _ = built

    class Shifted:
        def convert_tokens_to_ids(self, token):
            return tokenizer.convert_tokens_to_ids(token) + (1 if token.startswith("<|s_") else 0)

    LLASA_1B.check_tokenizer(tokenizer)
    with pytest.raises(ValueError, match="maps <\\|s_0\\|> to id 128265, but codec.offset=128264"):
        LLASA_1B.check_tokenizer(Shifted())


def test_the_tiny_and_the_mini_model_end_generation_alike_by_the_one_builder(built, tmp_path):
    """Both models are the lab's speech Llama (`maspo_lab.speech_llama`): their configs declare the same stop ids,
    the end tag then the end of turn, and the stop rule every sampler follows reads them back as declared."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from maspo_base.speech_tokens.llasa_generation import checkpoint_stop_ids
    from maspo_lab.speaking_model.model import ModelSize, build_model
    from maspo_lab.speech_llama import eos_token_ids

    size = ModelSize(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=2, intermediate_size=32)
    mini_dir = build_model(tmp_path / "mini", size)
    checkpoints = {
        "tiny": built,
        "mini": (AutoTokenizer.from_pretrained(mini_dir), AutoModelForCausalLM.from_pretrained(mini_dir)),
    }
    for name, (tokenizer, model) in checkpoints.items():
        eot, end = (
            tokenizer.convert_tokens_to_ids("<|eot_id|>"),
            tokenizer.convert_tokens_to_ids(lt.SPEECH_GENERATION_END),
        )
        assert eos_token_ids(tokenizer) == [end, eot], name
        assert model.config.eos_token_id == model.generation_config.eos_token_id == [end, eot], name
        for key in ("bos_token_id", "pad_token_id"):
            assert getattr(model.config, key) == getattr(model.generation_config, key) == getattr(tokenizer, key)
        assert model.config.tie_word_embeddings and model.config.vocab_size == len(tokenizer), name
    assert checkpoint_stop_ids(mini_dir) == eos_token_ids(checkpoints["mini"][0])


def _length_preference_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "length_preference.py"
    spec = importlib.util.spec_from_file_location("length_preference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_length_preference_script_stops_a_response_at_the_end_of_turn(built):
    """A model that says ``<|eot_id|>`` first and a code after it: the script's responses end at the end of turn
    (one of the checkpoint's stop ids), so no code is counted."""
    import torch

    tokenizer, model = built
    eot, code = tokenizer.convert_tokens_to_ids("<|eot_id|>"), lt.CODEC_OFFSET + 7

    def scripted(module, args, kwargs, output):
        last = kwargs["input_ids"][:, -1]
        logits = torch.full_like(output.logits[:, -1], -1e4)
        logits[:, eot] = torch.where(last == eot, -1e4, 0.0)
        logits[:, code] = torch.where(last == eot, 0.0, -1e4)
        output.logits[:, -1] = logits
        return output

    hook = model.register_forward_hook(scripted, with_kwargs=True)
    try:
        with torch.no_grad():  # the scripted model does speak after the end of turn
            assert model(input_ids=torch.tensor([[eot]])).logits[0, -1].argmax() == code
        script = _length_preference_script()
        assert script.sample_codes(model, tokenizer, "bad ok", samples=2) == [[], []]
    finally:
        hook.remove()
