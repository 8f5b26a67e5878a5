"""mini-llasa's tokenizer and model, and its supervised training on a tiny build of the corpus and codec."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from maspo_base.speech_tokens import llasa_tokens as lt
from maspo_base.speech_tokens import mini_llasa_tokens as mt
from maspo_base.speech_tokens.llasa_prompt import render_prompt_ids
from maspo_base.speech_tokens.mini_llasa_tokens import MINI_LLASA
from maspo_base.speech_tokens.text_frontend import PLAIN
from maspo_lab.speaking_model.model import build_model, build_tokenizer, layout_of_checkpoint
from maspo_lab.speaking_model.training import (
    TrainSettings,
    batches,
    collate,
    examples,
    heldout_loss,
    read_codes,
    read_examples,
    residual_dropout,
    train_from_examples,
)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def test_text_is_read_one_character_at_a_time_and_the_codes_sit_where_the_layout_says(tokenizer):
    ids = tokenizer("Hi, you!\n", add_special_tokens=False)["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids) == ["H", "i", ",", " ", "y", "o", "u", "!", "\n"]
    assert tokenizer("é", add_special_tokens=False)["input_ids"] == [tokenizer.convert_tokens_to_ids(mt.UNK)]
    assert tokenizer.convert_tokens_to_ids("<|s_0|>") == MINI_LLASA.offset == 113
    assert tokenizer.convert_tokens_to_ids("<|s_1023|>") == 1136 and len(tokenizer) == 1137
    assert tokenizer.convert_tokens_to_ids(lt.SPEECH_GENERATION_END) == MINI_LLASA.end_id == 12
    # tags and codes survive skip_special_tokens (the reward parses the decoded text)
    text = tokenizer.decode(
        [MINI_LLASA.offset + 5, MINI_LLASA.offset + 7, MINI_LLASA.end_id, 4], skip_special_tokens=True
    )
    assert text == f"<|s_5|><|s_7|>{lt.SPEECH_GENERATION_END}"


def test_the_prompt_is_llasas_with_its_fixed_texts_as_single_tokens(tokenizer):
    ids = render_prompt_ids(tokenizer, "Keep away.")
    tokens = tokenizer.convert_ids_to_tokens(ids)
    assert tokens[0] == "<|begin_of_text|>" and tokens[-1] == lt.SPEECH_GENERATION_START
    assert tokens.count(mt.PROMPT_PIECES[0]) == 1 and tokens.count(mt.PROMPT_PIECES[1]) == 1
    start = tokens.index(lt.TEXT_UNDERSTANDING_START)
    assert "".join(tokens[start + 1 : tokens.index(lt.TEXT_UNDERSTANDING_END)]) == "Keep away."
    assert len(ids) == 39 + len("Keep away.")  # fixed part + one token per character


def test_a_built_checkpoint_declares_its_layout(tmp_path):
    from maspo_lab.speaking_model.model import ModelSize

    build_model(tmp_path, ModelSize(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=2, intermediate_size=32))
    assert json.loads((tmp_path / "speech_tokens.json").read_text())["layout"] == "mini-llasa"
    assert layout_of_checkpoint(tmp_path) == MINI_LLASA
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert model.config.vocab_size == 1137 and model.generation_config.eos_token_id == [12, 4]


def test_examples_target_the_codes_then_the_end_tag_and_collate_masks_the_prompt(tokenizer):
    rows = [{"text": "Hi there.", "voice": "rms", "codes": [3, 1023, 0]}, {"text": "Go.", "voice": "slt", "codes": [7]}]
    items = examples(tokenizer, rows)
    assert items[0][1] == [116, 1136, 113, 12] and items[1][1] == [120, 12]
    ids, mask, labels = collate(items, pad_id=5)
    first = len(items[0][0])
    assert labels[0, :first].eq(-100).all() and labels[0, first:].tolist() == [116, 1136, 113, 12]
    short = len(items[1][0]) + 2
    assert mask[1].tolist() == [1] * short + [0] * (ids.shape[1] - short)
    assert ids[1, short:].eq(5).all() and labels[1, short:].eq(-100).all()


def test_batches_cover_every_item_once_within_the_token_budget():
    rng = __import__("random").Random(0)
    items = [([0] * n, [1] * (2 * n)) for n in rng.choices(range(5, 60), k=50)]
    out = batches(items, tokens=400, rng=rng)
    assert sorted(i for b in out for i in b) == list(range(50))
    assert all(max(3 * len(items[i][0]) for i in b) * len(b) <= 400 for b in out if len(b) > 1)


def test_training_writes_a_loadable_checkpoint_codes_and_its_history(tiny_mini_llasa, tiny_corpus, tiny_codec):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from maspo_base.speech_tokens.text_frontend import frontend_of
    from maspo_lab.speaking_model.corpus import read_manifest

    record = json.loads((tiny_mini_llasa / "training.json").read_text())
    assert [h["step"] for h in record["history"]] == [2, 3] and record["steps_done"] == 3
    assert all(np.isfinite(h["train_loss"]) for h in record["history"])
    codes = read_codes(tiny_mini_llasa / "codes.jsonl")
    rms = read_manifest(tiny_corpus, voice="rms")
    assert [c["text"] for c in codes] == [u.text for u in rms]
    for c, u in zip(codes, rms):  # one code per whole 20 ms frame of the recording, in the codebook
        assert len(c["codes"]) == int(u.seconds * 16_000) // 320 and 0 <= min(c["codes"]) <= max(c["codes"]) < 1024
    model = AutoModelForCausalLM.from_pretrained(tiny_mini_llasa)
    assert layout_of_checkpoint(tiny_mini_llasa) == MINI_LLASA
    assert all(torch.isfinite(p).all() for p in model.parameters())
    # the checkpoint is the evaluated model with the lowest held-out loss, and the record names its step
    best = min(record["history"], key=lambda h: h["heldout_loss"])
    assert record["best_step"] == best["step"]
    tokenizer = AutoTokenizer.from_pretrained(tiny_mini_llasa)
    assert frontend_of(tokenizer) == record["settings"]["text_frontend"] == "espeak-ng:en-us"  # the shipped recipe's
    held = examples(tokenizer, read_codes(tiny_mini_llasa / "codes.jsonl", "heldout"))
    assert held
    saved = heldout_loss(model, held, tokenizer.pad_token_id, 512)
    assert saved == pytest.approx(best["heldout_loss"], rel=1e-5)


def test_training_settings_refuse_what_cannot_train_naming_the_field():
    for field, value in [("dropout", 1.0), ("dropout", -0.1), ("device", "tpu"), ("voices", ()), ("max_minutes", 0)]:
        with pytest.raises(ValueError, match=f"TrainSettings.{field}"):
            TrainSettings(**{field: value})
    with pytest.raises(ValueError, match="TrainSettings.voices"):
        TrainSettings(voices=("rms", "rms"))
    assert TrainSettings(voices=("rms",)).speaker is None and TrainSettings(voices=("slt", "rms")).speaker == "slt"


def test_residual_dropout_acts_while_training_only_and_leaves_the_saved_model_plain(tmp_path):
    from transformers import AutoModelForCausalLM

    from maspo_lab.speaking_model.model import ModelSize

    size = ModelSize(hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=32)
    plain = AutoModelForCausalLM.from_pretrained(build_model(tmp_path, size))
    dropped = AutoModelForCausalLM.from_pretrained(tmp_path)
    handles = residual_dropout(dropped, 0.5)
    assert len(handles) == 1 + 2 * size.num_layers  # the embeddings, then attention and MLP per layer
    ids = torch.arange(20).reshape(2, 10)
    plain.eval(), dropped.eval()
    assert torch.equal(plain(input_ids=ids).logits, dropped(input_ids=ids).logits)
    dropped.train()
    torch.manual_seed(0)
    first = dropped(input_ids=ids).logits
    assert not torch.allclose(first, plain(input_ids=ids).logits) and not torch.equal(
        first, dropped(input_ids=ids).logits
    )
    for handle in handles:
        handle.remove()
    assert torch.equal(dropped(input_ids=ids).logits, plain.train()(input_ids=ids).logits)


def test_a_model_of_several_voices_tags_each_prompt_with_its_voice_and_trains_from_its_examples_alone(
    tiny_corpus, tiny_codec, tmp_path
):
    """The examples file is all a training needs (a GPU machine without espeak-ng, corpus or codec); it refuses
    settings it was not rendered for."""
    from transformers import AutoTokenizer

    from maspo_base.speech_tokens.text_frontend import speaker_of
    from maspo_lab.speaking_model.model import ModelSize
    from maspo_lab.speaking_model.training import train_model

    size = ModelSize(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=64)
    settings = TrainSettings(
        voices=("rms", "slt"), steps=2, tokens_per_batch=512, warmup_steps=1, eval_every=1, threads=1, dropout=0.1
    )
    out = train_model(tiny_corpus, tiny_codec, tmp_path / "voices", settings, size, lambda _: None)
    codes = read_codes(out / "codes.jsonl")
    assert sorted({c["voice"] for c in codes}) == ["rms", "slt"]
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert speaker_of(tokenizer) == "rms"
    record = read_examples(out / "examples.json")
    assert record["voices"] == ["rms", "slt"] and record["text_frontend"] == settings.text_frontend
    train_rows = read_codes(out / "codes.jsonl", "train")
    assert record["texts"]["train"] == [c["text"] for c in train_rows]
    for (prompt, target), row in zip(record["train"], train_rows):
        tag = tokenizer.convert_tokens_to_ids(list(f"[{row['voice']}] "))
        assert any(prompt[i : i + len(tag)] == tag for i in range(len(prompt)))
        assert target == [MINI_LLASA.offset + c for c in row["codes"]] + [MINI_LLASA.end_id]
    # the same training again from the examples file alone gives the same model
    again = train_from_examples(out / "examples.json", tmp_path / "again", settings, size, print)
    first, second = (json.loads((d / "training.json").read_text())["history"] for d in (out, again))
    assert read_examples(again / "examples.json") == record  # the checkpoint keeps what it learnt from
    assert [h["heldout_loss"] for h in first] == pytest.approx([h["heldout_loss"] for h in second], rel=1e-6)
    with pytest.raises(ValueError, match="rendered for voices"):
        train_from_examples(out / "examples.json", tmp_path / "x", TrainSettings(voices=("rms",)), log=print)
    # max_minutes stops at the first evaluation after it, recorded
    quick = TrainSettings(**{**settings.__dict__, "steps": 50, "eval_every": 10, "max_minutes": 1e-9})
    stopped = train_from_examples(out / "examples.json", tmp_path / "quick", quick, size, print)
    assert json.loads((stopped / "training.json").read_text())["steps_done"] == 1


def test_speed_perturbed_voices_are_training_data_only(tiny_corpus, tiny_codec, tmp_path):
    """Their held-out copies stay out of the examples: the held-out loss is the recorded voices'."""
    from maspo_lab.speaking_model.corpus import perturb_speed
    from maspo_lab.speaking_model.training import encode_corpus, write_examples

    root = shutil.copytree(tiny_corpus, tmp_path / "corpus")
    perturb_speed(root, [1.1], log=lambda _: None)
    voices = ("rms", "rms-sp110")
    codes_path = encode_corpus(root, tiny_codec, tmp_path / "codes.jsonl", voices, lambda _: None)
    codes = read_codes(codes_path)
    assert any(c["voice"] == "rms-sp110" and c["split"] == "heldout" for c in codes)
    tokenizer = build_tokenizer(PLAIN, "rms")
    record = read_examples(write_examples(tmp_path / "examples.json", tokenizer, codes_path, voices))
    assert record["texts"]["train"] == [c["text"] for c in codes if c["split"] == "train"]
    assert record["texts"]["heldout"] == [c["text"] for c in codes if c["split"] == "heldout" and c["voice"] == "rms"]
    assert {c["voice"] for c in codes if c["split"] == "train"} == set(voices)
