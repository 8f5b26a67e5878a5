import numpy as np
import pytest

from maspo_base.llasa_response import GateConfig, parse_response, parse_token_ids
from maspo_base.speech_tokens.layouts import LLASA_1B

END = "<|SPEECH_GENERATION_END|>"


def test_parses_codes_up_to_the_stop_tag_and_ignores_what_follows():
    parsed = parse_response(f"<|s_5|><|s_65535|> <|s_0|>{END}<|eot_id|> trailing")
    assert parsed.ok and parsed.reason == "ok"
    assert parsed.codes.tolist() == [5, 65535, 0]


def test_echoed_generation_start_and_prompt_codes_are_not_scored():
    text = f"<|SPEECH_GENERATION_START|><|s_1|><|s_2|><|s_3|><|s_4|>{END}"
    assert parse_response(text, prompt_codes=[1, 2]).codes.tolist() == [3, 4]
    # prompt codes that the response does not start with are left alone
    assert parse_response(text, prompt_codes=[2, 3]).codes.tolist() == [1, 2, 3, 4]


@pytest.mark.parametrize(
    "text, reason",
    [
        ("", "no_speech_tokens"),
        ("hello there", "no_speech_tokens"),
        (END, "no_speech_tokens"),
        ("<|s_1|><|s_2|>", "truncated"),
        (f"<|s_1|><|s_65536|>{END}", "code_out_of_range"),
        (f"<|s_1|>hello<|s_2|>{END}", "text_in_speech"),
        (f"<|s_1|><|TEXT_UNDERSTANDING_END|><|s_2|>{END}", "text_in_speech"),
    ],
)
def test_gate_reasons(text, reason):
    parsed = parse_response(text)
    assert not parsed.ok and parsed.reason == reason


def test_gate_limits_name_the_bound():
    short = parse_response(f"<|s_1|>{END}", config=GateConfig(min_codes=2))
    long = parse_response(f"<|s_1|><|s_2|><|s_3|>{END}", config=GateConfig(max_codes=2))
    assert (short.reason, long.reason) == ("too_short", "too_long")
    assert "max_codes=2" in long.detail
    assert parse_response("<|s_1|><|s_2|>", config=GateConfig(require_end=False)).ok


def test_token_ids_use_the_same_gate():
    layout = LLASA_1B  # Llasa-1B: <|s_0|> = 128264, END = 128261, START = 128260
    ok = parse_token_ids([128260, 128264 + 7, 128264 + 65535, 128261, 128009], layout)
    assert ok.ok and ok.codes.tolist() == [7, 65535]
    assert parse_token_ids([128264 + 7, 128264 + 8], layout).reason == "truncated"
    assert parse_token_ids([128264 + 7, 1234, 128264 + 8, 128261], layout).reason == "text_in_speech"
    assert parse_token_ids([128264 + 65536, 128261], layout).reason == "code_out_of_range"
    assert parse_token_ids([128261], layout).reason == "no_speech_tokens"
    stripped = parse_token_ids(np.array([128264 + 1, 128264 + 2, 128264 + 3, 128261]), layout, prompt_codes=[1])
    assert stripped.codes.tolist() == [2, 3]


def test_layout_from_a_real_tokenizer_with_llasa_tokens():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tags = ["<|TEXT_GENERATION_START|>", "<|TEXT_GENERATION_END|>", "<|TEXT_UNDERSTANDING_START|>",
            "<|TEXT_UNDERSTANDING_END|>", "<|SPEECH_GENERATION_START|>", "<|SPEECH_GENERATION_END|>",
            "<|SPEECH_UNDERSTANDING_START|>", "<|SPEECH_UNDERSTANDING_END|>"]  # fmt: skip
    base = Tokenizer(models.WordLevel({"<unk>": 0, "hello": 1}, unk_token="<unk>"))
    tok = PreTrainedTokenizerFast(tokenizer_object=base, unk_token="<unk>")
    tok.add_tokens(tags + [f"<|s_{i}|>" for i in range(65536)])
    layout = LLASA_1B.from_tokenizer(tok)
    assert (layout.start_id, layout.end_id, layout.offset) == (6, 7, 10)
    ids = tok.convert_tokens_to_ids(["<|s_3|>", "<|s_9|>", "<|SPEECH_GENERATION_END|>"])
    assert parse_token_ids(ids, layout).codes.tolist() == [3, 9]

    plain = PreTrainedTokenizerFast(tokenizer_object=base, unk_token="<unk>")
    with pytest.raises(ValueError, match="SPEECH_GENERATION_START"):
        LLASA_1B.from_tokenizer(plain)
