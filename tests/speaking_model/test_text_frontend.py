"""A checkpoint's text front end: declared by its tokenizer, applied wherever a prompt is rendered for it."""

from __future__ import annotations

import pytest

from maspo_verl.speaking_model.model import build_model, build_tokenizer
from reward_fns.speech_tokens import llasa_tokens as lt
from reward_fns.speech_tokens import mini_llasa_tokens as mt
from reward_fns.speech_tokens.llasa_prompt import render_prompt_ids
from reward_fns.speech_tokens.text_frontend import (
    FRONTENDS,
    espeak_phonemes,
    frontend_of,
    get_frontend,
    model_text,
)

PHONEMES = "espeak-ng:en-us"


def read_text(tokenizer, ids):
    tokens = tokenizer.convert_ids_to_tokens(ids)
    return "".join(tokens[tokens.index(lt.TEXT_UNDERSTANDING_START) + 1 : tokens.index(lt.TEXT_UNDERSTANDING_END)])


def test_espeak_phonemes_spell_the_sounds_word_by_word_and_join_clauses():
    # espeak-ng 1.51 (Debian), checked by hand: stress marks, word breaks, one line per clause joined by a space
    assert espeak_phonemes("Keep away from fire.") == "k'i:p a#w'eI frVm f'aI3"
    assert espeak_phonemes("Don't panic, then run.") == "d'oUnt p'anIk D'En r'Vn"
    assert espeak_phonemes("-- starts with a dash") == espeak_phonemes("starts with a dash")  # not an option
    assert espeak_phonemes("...") == ""


def test_phonemes_of_the_shipped_training_sentences_are_all_in_the_vocabulary():
    from maspo_verl.runs.speech_run import training_texts

    spelt = "".join(espeak_phonemes(text) for text in training_texts()[:200])
    assert set(spelt) <= set(mt.CHARACTERS), sorted(set(spelt) - set(mt.CHARACTERS))


def test_a_tokenizer_declaring_phonemes_renders_them_and_keeps_them_through_save_and_load(tmp_path):
    from transformers import AutoTokenizer

    from maspo_verl.speaking_model.model import ModelSize

    plain, phonemes = build_tokenizer(), build_tokenizer(PHONEMES)
    assert frontend_of(plain) == "text" and frontend_of(phonemes) == PHONEMES
    assert read_text(plain, render_prompt_ids(plain, "Keep away from fire.")) == "Keep away from fire."
    assert read_text(phonemes, render_prompt_ids(phonemes, "Keep away from fire.")) == "k'i:p a#w'eI frVm f'aI3"
    assert model_text(phonemes, "Keep away from fire.") == "k'i:p a#w'eI frVm f'aI3"
    size = ModelSize(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=2, intermediate_size=32)
    build_model(tmp_path, size, text_frontend=PHONEMES)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert render_prompt_ids(loaded, "Keep away.") == render_prompt_ids(phonemes, "Keep away.")
    assert render_prompt_ids(loaded, "Keep away.") != render_prompt_ids(plain, "Keep away.")


def test_an_unknown_front_end_is_refused_naming_the_valid_ones():
    with pytest.raises(ValueError, match=r"text_frontend 'ipa'.*'espeak-ng:en-us', 'text'"):
        build_tokenizer("ipa")
    with pytest.raises(ValueError, match="text_frontend"):
        get_frontend("ipa")
    assert sorted(FRONTENDS) == [PHONEMES, "text"]
