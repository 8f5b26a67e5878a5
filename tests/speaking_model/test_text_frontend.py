"""A checkpoint's text front end (and speaker tag): declared by its tokenizer, applied wherever a prompt is rendered
for it."""

from __future__ import annotations

import pytest

from maspo_base.speech_tokens import llasa_tokens as lt
from maspo_base.speech_tokens import mini_llasa_tokens as mt
from maspo_base.speech_tokens.llasa_prompt import render_prompt_ids
from maspo_base.speech_tokens.text_frontend import (
    FRONTENDS,
    espeak_phonemes,
    frontend_of,
    get_frontend,
    model_text,
    reader_of,
    reader_of_checkpoint,
    speaker_of,
    speakers_of,
)
from maspo_lab.speaking_model.model import build_model, build_tokenizer

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
    from maspo_lab.runs.speech_run import training_texts

    spelt = "".join(espeak_phonemes(text) for text in training_texts()[:200])
    assert set(spelt) <= set(mt.CHARACTERS), sorted(set(spelt) - set(mt.CHARACTERS))


def test_a_tokenizer_declaring_phonemes_renders_them_and_keeps_them_through_save_and_load(tmp_path):
    from transformers import AutoTokenizer

    from maspo_lab.speaking_model.model import ModelSize

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


def test_prepare_data_writes_what_the_tokenizers_model_reads(tmp_path):
    """veRL renders the parquet's messages itself (it never sees the front end): prepare-data writes the phonemes
    for a tokenizer that declares them, the text for one that does not; the reward's ground truth is the text."""
    import pandas as pd

    from maspo_base.speech_tokens.layouts import MINI_LLASA
    from maspo_lab.data.prepare import prepare

    (tmp_path / "in.jsonl").write_text('{"text": "Keep away from fire."}\n')
    for name, tokenizer, expected in [
        ("plain", build_tokenizer(), "Keep away from fire."),
        ("phonemes", build_tokenizer(PHONEMES), "k'i:p a#w'eI frVm f'aI3"),
    ]:
        prepare([tmp_path / "in.jsonl"], tmp_path / name, val_size=0, tokenizer=tokenizer, layout=MINI_LLASA)
        (row,) = pd.read_parquet(tmp_path / name / "train.parquet").to_dict("records")
        assert row["prompt"][0]["content"] == f"Convert the text to speech:{lt.TEXT_UNDERSTANDING_START}{expected}" + (
            lt.TEXT_UNDERSTANDING_END
        )
        assert row["reward_model"]["ground_truth"] == "Keep away from fire."


def test_the_speech_tasks_data_follows_the_checkpoints_front_end(tmp_path):
    import pandas as pd

    from maspo_lab.runs import speech_run
    from maspo_lab.speaking_model.model import ModelSize

    size = ModelSize(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=2, intermediate_size=32)
    model = build_model(tmp_path / "model", size, text_frontend=PHONEMES)
    paths = speech_run.prepare_task(tmp_path / "task", n_train=2, n_heldout=1, model=model)
    train = pd.read_parquet(paths.train).to_dict("records")
    for row in train + pd.read_parquet(paths.val).to_dict("records"):
        text = row["reward_model"]["ground_truth"]
        assert espeak_phonemes(text) in row["prompt"][0]["content"] and text not in row["prompt"][0]["content"]
    letters = speech_run.prepare_task(tmp_path / "letters", n_train=2, model=build_model(tmp_path / "plain", size))
    for row in pd.read_parquet(letters.train).to_dict("records"):  # declares none: the text as written
        assert row["reward_model"]["ground_truth"] in row["prompt"][0]["content"]


def test_a_model_of_several_voices_reads_its_declared_speakers_tag_everywhere(tmp_path):
    import pandas as pd

    from maspo_lab.runs import speech_run
    from maspo_lab.speaking_model.model import ModelSize

    voices = build_tokenizer(PHONEMES, speaker="rms")
    assert speaker_of(voices) == "rms" and speaker_of(build_tokenizer(PHONEMES)) is None
    assert model_text(voices, "Keep away from fire.") == "[rms] k'i:p a#w'eI frVm f'aI3"
    assert model_text(voices, "Keep away from fire.", speaker="slt") == "[slt] k'i:p a#w'eI frVm f'aI3"
    assert read_text(voices, render_prompt_ids(voices, "Keep away.", speaker="kal16")).startswith("[kal16] k'i:p")
    assert reader_of(build_tokenizer())("Keep away.") == "Keep away."  # one voice: no tag
    size = ModelSize(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=2, intermediate_size=32)
    model = build_model(tmp_path / "model", size, text_frontend=PHONEMES, speaker="rms")
    assert reader_of_checkpoint(model)("Keep away.") == model_text(voices, "Keep away.")
    assert reader_of_checkpoint(tmp_path / "no-such-checkpoint")("Keep away.") == "Keep away."  # a hub id
    paths = speech_run.prepare_task(tmp_path / "task", n_train=2, model=model)
    for row in pd.read_parquet(paths.train).to_dict("records"):
        text = row["reward_model"]["ground_truth"]
        assert (
            f"{lt.TEXT_UNDERSTANDING_START}[rms] {espeak_phonemes(text)}{lt.TEXT_UNDERSTANDING_END}"
            in (row["prompt"][0]["content"])
        )
    with pytest.raises(ValueError, match=r"speaker 'r ms'.*letters, digits"):
        build_tokenizer(PHONEMES, speaker="r ms")


def test_a_tokenizer_declaring_its_voices_keeps_them_through_save_and_load_and_refuses_any_other(tmp_path):
    from transformers import AutoTokenizer

    from maspo_lab.speaking_model.training import TrainSettings

    settings = TrainSettings(voices=("rms", "rms-sp90"), device="cpu")
    assert (settings.speaker, settings.speakers) == ("rms", ("rms", "rms-sp90"))
    assert TrainSettings(voices=("rms",), device="cpu").speakers == ()
    build_tokenizer(PHONEMES, settings.speaker, settings.speakers).save_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert speakers_of(tokenizer) == ("rms", "rms-sp90") and speakers_of(build_tokenizer(PHONEMES, "rms")) is None
    assert model_text(tokenizer, "Keep away.", speaker="rms-sp90") == "[rms-sp90] k'i:p a#w'eI"
    with pytest.raises(ValueError, match=r"speaker 'slt': not a voice the model learnt; valid: rms, rms-sp90"):
        render_prompt_ids(tokenizer, "Keep away.", speaker="slt")
    assert model_text(build_tokenizer(PHONEMES, "rms"), "Keep away.", speaker="slt").startswith("[slt] ")  # no list
    with pytest.raises(ValueError, match=r"speaker 'slt': the model learnt one voice"):
        render_prompt_ids(build_tokenizer(PHONEMES), "Keep away.", speaker="slt")
    with pytest.raises(ValueError, match=r"speaker 'slt' is not one of its speakers \['rms'\]"):
        build_tokenizer(PHONEMES, "slt", ("rms",))
    with pytest.raises(ValueError, match=r"speaker 'r ms'.*letters, digits"):
        build_tokenizer(PHONEMES, "rms", ("rms", "r ms"))
