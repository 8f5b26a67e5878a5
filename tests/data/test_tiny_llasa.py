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
