"""Speech-token layouts (`maspo_base.speech_tokens.layouts`): the registry, mini-llasa's ids against its tokenizer,
vocabulary ids to codec ids, layouts read off tokenizers and off checkpoints."""

from __future__ import annotations

import json

import pytest
import torch

from maspo_base.speech_tokens import llasa_tokens as lt
from maspo_base.speech_tokens import mini_llasa_tokens as mt
from maspo_base.speech_tokens.layouts import (
    LAYOUTS,
    LLASA_1B,
    MINI_LLASA,
    SpeechTokenLayout,
    get_layout,
    register_layout,
)
from maspo_lab.speaking_model.model import ModelSize, build_model, build_tokenizer, layout_of_checkpoint

TINY = ModelSize(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=2, intermediate_size=32, max_positions=64)


@pytest.fixture(scope="module")
def mini_tokenizer():
    return build_tokenizer()


# ---------------------------------------------------------------------------------------------- the registry


def test_registered_layouts_by_name():
    assert get_layout("llasa-1b") is LLASA_1B and get_layout("mini-llasa") is MINI_LLASA
    assert (LLASA_1B.offset, LLASA_1B.codebook_size, LLASA_1B.start_id, LLASA_1B.end_id) == (
        128264,
        65536,
        128260,
        128261,
    )
    assert (LLASA_1B.fsq_levels, LLASA_1B.codec, LLASA_1B.vocab_size) == ((4,) * 8, "xcodec2", 193800)
    assert (MINI_LLASA.offset, MINI_LLASA.codebook_size, MINI_LLASA.start_id, MINI_LLASA.end_id) == (113, 1024, 11, 12)
    assert (MINI_LLASA.fsq_levels, MINI_LLASA.codec, MINI_LLASA.vocab_size) == ((4,) * 5, "mel_fsq", 1137)
    assert MINI_LLASA.frame_rate == LLASA_1B.frame_rate == 50


def test_an_unknown_name_lists_the_registered_layouts():
    with pytest.raises(
        ValueError, match=r"unknown speech-token layout 'llasa-8b'; registered: \['llasa-1b', 'mini-llasa'\]"
    ):
        get_layout("llasa-8b")


def test_a_taken_name_takes_only_the_same_layout():
    try:
        assert register_layout(MINI_LLASA.replace()) == MINI_LLASA  # the same values again (a module imported twice)
        with pytest.raises(ValueError, match="speech-token layout 'mini-llasa' is already registered"):
            register_layout(MINI_LLASA.replace(offset=114))
        assert get_layout("mini-llasa") == MINI_LLASA
    finally:
        register_layout(MINI_LLASA)  # the module's own object again
    assert get_layout("mini-llasa") is MINI_LLASA
    other = SpeechTokenLayout("test-layout", offset=10, codebook_size=4, start_id=4, end_id=5, fsq_levels=(2, 2))
    try:
        assert register_layout(other) is other and get_layout("test-layout") is other
    finally:
        LAYOUTS.pop("test-layout")


def test_fsq_levels_must_give_the_codebook():
    with pytest.raises(ValueError, match=r"layout 'bad': FSQ levels \(4, 4\) give 16 codes, codebook_size is 17"):
        SpeechTokenLayout("bad", offset=0, codebook_size=17, start_id=0, end_id=1, fsq_levels=(4, 4))
    assert SpeechTokenLayout("plain", offset=0, codebook_size=17, start_id=0, end_id=1).fsq is None


# --------------------------------------------------------------------------------------- mini-llasa's ids


def test_mini_llasa_ids_are_its_tokenizers(mini_tokenizer):
    MINI_LLASA.check_tokenizer(mini_tokenizer)
    assert len(mini_tokenizer) == mt.VOCAB_SIZE == 1137
    ids = mini_tokenizer.convert_tokens_to_ids
    assert [ids(tag) for tag in lt.TAGS] == list(range(7, 15))
    assert ids(lt.SPEECH_GENERATION_START) == 11 and ids(lt.SPEECH_GENERATION_END) == 12
    assert (ids("<|s_0|>"), ids("<|s_512|>"), ids("<|s_1023|>")) == (113, 625, 1136)
    assert MINI_LLASA.expected_ids() == {
        **{tag: 7 + i for i, tag in enumerate(lt.TAGS)},
        "<|s_0|>": 113,
        "<|s_1023|>": 1136,
    }
    # text is read one character at a time, after the 17 fixed ids
    assert mini_tokenizer("Hi!", add_special_tokens=False)["input_ids"] == [
        17 + CHAR("H"),
        17 + CHAR("i"),
        17 + CHAR("!"),
    ]
    # Llasa-1B's layout does not fit it, and says where <|s_0|> should have been
    with pytest.raises(ValueError, match=r"maps <\|s_0\|> to id 113, but codec.offset=128264"):
        LLASA_1B.check_tokenizer(mini_tokenizer)


def CHAR(c: str) -> int:  # noqa: N802 - reads as the table it indexes
    return mt.CHARACTERS.index(c)


def test_codec_ids_of_mini_llasa_ids_on_both_sides_of_the_code_run():
    token_ids = torch.tensor([[112, 113, 114, 1136, 1137, 12, 0]])  # a character, <|s_0|>, <|s_1|>, <|s_1023|>, ...
    codes, is_speech = MINI_LLASA.codec_ids(token_ids)
    assert codes.dtype == torch.int32
    assert codes.tolist() == [[0, 0, 1, 1023, 0, 0, 0]]
    assert is_speech.tolist() == [[False, True, True, True, False, False, False]]
    raw, is_speech_raw = MINI_LLASA.codec_ids(token_ids, zero_off_speech=False)
    assert raw.tolist() == [[-1, 0, 1, 1023, 1024, -101, -113]] and torch.equal(is_speech_raw, is_speech)
    assert token_ids.tolist() == [[112, 113, 114, 1136, 1137, 12, 0]]  # the input is not changed in place
    # a codebook that is no power of two takes the two-sided check: 1000 codes end at id 1112
    codes, is_speech = MINI_LLASA.replace(codebook_size=1000, fsq_levels=None).codec_ids(
        torch.tensor([112, 113, 1112, 1113])
    )
    assert codes.tolist() == [0, 0, 999, 0] and is_speech.tolist() == [False, True, True, False]


# ------------------------------------------------------------------------------------ layouts read off tokenizers


class Shifted:
    """A tokenizer with ``shift`` ids inserted before mini-llasa's (its ids all move up), optionally also moving the
    last code alone (a code run that is not contiguous)."""

    def __init__(self, tokenizer, shift: int, last_code_shift: int = 0):
        self.tokenizer, self.shift, self.last_code_shift = tokenizer, shift, last_code_shift
        self.unk_token_id = tokenizer.unk_token_id + shift

    def convert_tokens_to_ids(self, token: str) -> int:
        extra = self.last_code_shift if token == "<|s_1023|>" else 0
        return self.tokenizer.convert_tokens_to_ids(token) + self.shift + extra


def test_from_tokenizer_reads_the_ids_and_keeps_the_codebook(mini_tokenizer):
    assert MINI_LLASA.from_tokenizer(mini_tokenizer) == MINI_LLASA
    shifted = MINI_LLASA.from_tokenizer(Shifted(mini_tokenizer, 3))
    assert (shifted.offset, shifted.start_id, shifted.end_id) == (116, 14, 15)
    assert (shifted.name, shifted.codebook_size, shifted.fsq_levels, shifted.frame_rate) == (
        "mini-llasa",
        1024,
        (4,) * 5,
        50,
    )
    assert shifted.codec_ids(torch.tensor([115, 116, 1139, 1140]))[0].tolist() == [0, 0, 1023, 0]
    with pytest.raises(
        ValueError,
        match=r"maps <\|s_1023\|> to id 1140, but codec.offset=116 and codec.codebook_size=1024 put it at 1139",
    ):
        MINI_LLASA.from_tokenizer(Shifted(mini_tokenizer, 3, last_code_shift=1))


def test_from_tokenizer_names_the_speech_tokens_a_tokenizer_lacks(mini_tokenizer):
    class TextOnly(Shifted):
        def convert_tokens_to_ids(self, token):
            return self.unk_token_id if token.startswith("<|s_") else super().convert_tokens_to_ids(token)

    with pytest.raises(
        ValueError, match=r"tokenizer lacks the speech token\(s\) \['<\|s_0\|>'\] of the mini-llasa layout"
    ):
        MINI_LLASA.from_tokenizer(TextOnly(mini_tokenizer, 0))


# ------------------------------------------------------------------------------------ layouts of checkpoints


def test_a_built_mini_llasa_declares_its_layout(tmp_path):
    path = build_model(tmp_path / "mini", TINY, seed=0)
    assert json.loads((path / "speech_tokens.json").read_text())["layout"] == "mini-llasa"
    assert layout_of_checkpoint(path) == MINI_LLASA


def test_a_folder_without_a_layout_file_is_llasa_1b(tmp_path):
    from maspo_lab.data.tiny_llasa import build_tokenizer as build_tiny_llasa_tokenizer

    tokenizer = build_tiny_llasa_tokenizer()
    assert layout_of_checkpoint(tmp_path, tokenizer) == LLASA_1B
    # the file names the layout (codebook, lattice); the ids are read off the tokenizer, wherever it puts them
    (tmp_path / "speech_tokens.json").write_text(json.dumps({"layout": "mini-llasa"}))
    read = layout_of_checkpoint(tmp_path, tokenizer)
    assert (read.name, read.codebook_size, read.offset, read.end_id) == ("mini-llasa", 1024, 128264, 128261)
    (tmp_path / "speech_tokens.json").write_text(json.dumps({"layout": "llasa-8b"}))
    with pytest.raises(ValueError, match=r"unknown speech-token layout 'llasa-8b'; registered"):
        layout_of_checkpoint(tmp_path, tokenizer)
