"""maspo-verl prepare-data: every input format -> parquet that veRL's RLHFDataset reads, in Llasa's prompt format."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from maspo_base.speech_tokens import llasa_tokens as lt
from maspo_base.speech_tokens.llasa_prompt import SPEECH_CHAT_TEMPLATE, render_prompt_ids
from maspo_lab.cli import main as cli
from maspo_lab.data.prepare import CodesFile, Limits, detect_language, prepare, text_problem
from maspo_lab.data.tiny_llasa import build_tokenizer

PROMPT_CODES = [5, 43690, 65535, 17]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(["hello world", "the cat sat"])


def _read(path):
    return pd.read_parquet(path).to_dict("records")


def _seedtts_list(tmp_path):
    """A Seed-TTS-eval style list: voice cloning rows (prompt wavs found through a codes file), one bad row."""
    (tmp_path / "prompt-wavs").mkdir()
    lines = [
        "utt1|你好。|prompt-wavs/p1.wav|今天天气很好",
        "utt2|hello there|prompt-wavs/p2.wav|the cat sat",
        "utt3|hi|prompt-wavs/missing.wav|no audio here",
        "utt4|only three|fields",
        "utt5|hello there|prompt-wavs/p2.wav|the cat sat",  # duplicate of utt2
    ]
    lst = tmp_path / "meta.lst"
    lst.write_text("\n".join(lines) + "\n", encoding="utf-8")
    codes = tmp_path / "codes.jsonl"
    codes.write_text(
        json.dumps({"wav": "prompt-wavs/p1.wav", "codes": PROMPT_CODES})
        + "\n"
        + json.dumps({"utt": "p2", "codes": [1, 2, 3]})
        + "\n"
    )
    return lst, codes


def test_seedtts_list_with_codes_file_voice_cloning_rows(tmp_path, tokenizer):
    lst, codes = _seedtts_list(tmp_path)
    reported = []
    summary = prepare([lst], tmp_path / "out", coder=CodesFile(codes), val_size=0, report=reported.append)
    rows = {r["extra_info"]["utt"]: r for r in _read(tmp_path / "out" / "train.parquet")}
    assert sorted(rows) == ["utt1", "utt2"]
    assert summary.read == 5 and summary.bad == 2 and summary.duplicates == 1 and summary.voice_cloning == 2
    assert reported == [
        f"skipped {lst}:3: missing audio {(tmp_path / 'prompt-wavs' / 'missing.wav').resolve()}",
        f"skipped {lst}:4: 3 '|'-separated fields; expected utt|prompt_text|prompt_wav|text or utt|text",
    ]
    zh = rows["utt1"]
    assert zh["reward_model"]["ground_truth"] == "今天天气很好"  # the target only: the reward scores the continuation
    assert zh["extra_info"]["language"] == "zh"  # detected from the Han characters
    assert list(zh["extra_info"]["prompt_codes"]) == PROMPT_CODES
    assert rows["utt2"]["extra_info"]["language"] == "en"

    # the prompt as veRL's agent loop renders it with the recipe's template: prompt text + target in the user
    # turn, the prompt speech's codes right after <|SPEECH_GENERATION_START|>, nothing after them
    messages = [dict(m) for m in zh["prompt"]]
    ids = tokenizer.apply_chat_template(messages, chat_template=SPEECH_CHAT_TEMPLATE, add_generation_prompt=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    start = ids.index(lt.SPEECH_GENERATION_START_ID)
    assert ids[start + 1 :] == [lt.CODEC_OFFSET + c for c in PROMPT_CODES]
    assert ids == render_prompt_ids(tokenizer, "你好。 今天天气很好", PROMPT_CODES)
    text_start = ids.index(tokenizer.convert_tokens_to_ids(lt.TEXT_UNDERSTANDING_START))
    text_end = ids.index(tokenizer.convert_tokens_to_ids(lt.TEXT_UNDERSTANDING_END))
    assert tokenizer.decode(ids[text_start + 1 : text_end]) == "你好。 今天天气很好"


def test_rows_without_prompt_speech_end_at_speech_generation_start(tmp_path, tokenizer):
    (tmp_path / "in.txt").write_text("hello world\n\nthe cat sat\n")
    prepare([tmp_path / "in.txt"], tmp_path / "out", val_size=0, report=lambda _: None)
    row = _read(tmp_path / "out" / "train.parquet")[0]
    assert (
        len(row["prompt"]) == 1 and "prompt_codes" not in row["extra_info"] or row["extra_info"]["prompt_codes"] is None
    )
    ids = render_prompt_ids(tokenizer, row["reward_model"]["ground_truth"])
    assert ids[-1] == lt.SPEECH_GENERATION_START_ID
    assert ids[-2] != lt.SPEECH_GENERATION_START_ID  # one tag, not two


def test_verl_rlhf_dataset_reads_the_output(tmp_path, tokenizer):
    from verl.utils.dataset.rl_dataset import RLHFDataset

    lst, codes = _seedtts_list(tmp_path)
    prepare([lst], tmp_path / "out", coder=CodesFile(codes), val_size=1, report=lambda _: None)
    config = OmegaConf.create(
        {"max_prompt_length": 256, "filter_overlong_prompts": True, "cache_dir": str(tmp_path / "cache")}
    )
    for split, size in (("train", 1), ("val", 1)):
        dataset = RLHFDataset(str(tmp_path / "out" / f"{split}.parquet"), tokenizer, config)
        assert len(dataset) == size
        item = dataset[0]
        assert item["raw_prompt"][0]["role"] == "user" and item["raw_prompt"][-1]["role"] == "assistant"
        assert item["extra_info"]["split"] == split and item["extra_info"]["index"] == 0


def test_csv_jsonl_and_hf_dataset_columns(tmp_path):
    pd.DataFrame({"sentence": ["Good morning", "早上好", ""], "lang": ["en-US", None, "en"]}).to_csv(
        tmp_path / "in.csv", index=False
    )
    (tmp_path / "in.jsonl").write_text(
        json.dumps({"sentence": "a jsonl row", "prompt_codes": [7, 8]}) + "\n" + "{not json\n" + json.dumps([1]) + "\n"
    )
    from datasets import Dataset

    Dataset.from_dict({"sentence": ["from the hub format"], "lang": ["en"]}).save_to_disk(str(tmp_path / "hf"))
    reported = []
    args = [
        "prepare-data",
        str(tmp_path / "in.csv"),
        str(tmp_path / "in.jsonl"),
        str(tmp_path / "hf"),
        "--out",
        str(tmp_path / "out"),
        "--text-column",
        "sentence",
        "--language-column",
        "lang",
        "--val-size",
        "0",
    ]
    assert cli(args) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    rows = _read(tmp_path / "out" / "train.parquet")
    by_text = {r["reward_model"]["ground_truth"]: r["extra_info"] for r in rows}
    assert by_text["Good morning"]["language"] == "en-us"
    assert by_text["早上好"]["language"] == "zh"
    assert list(by_text["a jsonl row"]["prompt_codes"]) == [7, 8]
    assert by_text["from the hub format"]["line"] == 0
    assert summary["bad"] == 3 and summary["train"] == 4
    assert any(r.endswith("in.csv:4: empty text") for r in summary["bad_rows"])
    assert any("in.jsonl:2: not JSON" in r for r in summary["bad_rows"])
    assert any("in.jsonl:3: a JSON list" in r for r in summary["bad_rows"])
    del reported


def test_missing_text_column_is_an_error_naming_it(tmp_path, capsys):
    pd.DataFrame({"sentence": ["x"]}).to_csv(tmp_path / "in.csv", index=False)
    assert cli(["prepare-data", str(tmp_path / "in.csv"), "--out", str(tmp_path / "out")]) == 2
    assert "no column 'text' (columns: ['sentence']); set --text-column" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "empty text"),
        ("   ", "empty text"),
        (None, "empty text"),
        ("bell\x07", "unsupported characters ['U+0007']"),
        ("say <|s_5|>", "unsupported characters: Llasa tag syntax '<|' or '|>' in the text"),
        ("?!...", "nothing speakable (punctuation or symbols only)"),
        ("fine, thanks!", None),
        ("好的", None),
    ],
)
def test_text_problems(text, problem):
    assert text_problem(text) == problem


def test_language_detection():
    assert detect_language("我们一起去公园") == "zh"
    assert detect_language("mixed 中文 text") == "zh"
    assert detect_language("plain English, 42") == "en"


def test_dedup_length_filters_and_seeded_split(tmp_path):
    texts = [f"sentence number {i}" for i in range(40)] + ["sentence number 3", "x" * 50, "ab"]
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")

    def split(seed, out):
        summary = prepare(
            [tmp_path / "in.txt"],
            tmp_path / out,
            val_size=0.25,
            seed=seed,
            limits=Limits(min_chars=3, max_chars=40),
            report=lambda _: None,
        )
        return summary, [r["reward_model"]["ground_truth"] for r in _read(tmp_path / out / "val.parquet")]

    summary, val_a = split(0, "a")
    _, val_b = split(0, "b")
    _, val_c = split(1, "c")
    assert (summary.duplicates, summary.too_long, summary.too_short) == (1, 1, 1)
    assert (summary.train, summary.val) == (30, 10)
    assert val_a == val_b and set(val_a) != set(val_c)
    train = {r["reward_model"]["ground_truth"] for r in _read(tmp_path / "a" / "train.parquet")}
    assert not train & set(val_a)


def test_prompt_length_limit_in_seconds_and_tokens(tmp_path, tokenizer):
    rows = [{"text": "short prompt", "prompt_codes": [1] * 50}, {"text": "long prompt", "prompt_codes": [1] * 60}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = prepare(
        [tmp_path / "in.jsonl"],
        tmp_path / "s",
        val_size=0,
        limits=Limits(max_prompt_seconds=1.0),
        report=lambda _: None,
    )
    assert (summary.train, summary.prompt_too_long) == (1, 1)
    n_tokens = len(render_prompt_ids(tokenizer, "short prompt", [1] * 50))
    summary = prepare(
        [tmp_path / "in.jsonl"],
        tmp_path / "t",
        val_size=0,
        tokenizer=tokenizer,
        limits=Limits(max_prompt_tokens=n_tokens),
        report=lambda _: None,
    )
    assert (summary.train, summary.prompt_too_long) == (1, 1)


def test_random_weights_codec_encoder_fills_prompt_codes(tmp_path):
    """--codec: prompt wavs encoded by XCodec2's encoder (tiny, random weights, loaded from a checkpoint dir)."""
    import soundfile as sf

    from maspo_base.xcodec2_encoder import XCodec2Encoder, load_audio
    from reward_fns.testing.tiny_encoder import write_tiny_xcodec2_with_encoder

    codec = write_tiny_xcodec2_with_encoder(tmp_path / "xcodec2_random")
    wav = 0.1 * np.sin(np.linspace(0, 440 * 2 * np.pi, 8000)).astype(np.float32)
    sf.write(tmp_path / "p.wav", wav, 8000)  # 1 s at 8 kHz: resampled to 16 kHz
    (tmp_path / "in.lst").write_text("u|a prompt|p.wav|the target\n")
    assert (
        cli(
            [
                "prepare-data",
                str(tmp_path / "in.lst"),
                "--out",
                str(tmp_path / "out"),
                "--codec",
                str(codec),
                "--val-size",
                "0",
            ]
        )
        == 0
    )
    row = _read(tmp_path / "out" / "train.parquet")[0]
    expected = XCodec2Encoder.from_pretrained(codec).encode(load_audio(tmp_path / "p.wav"))
    assert list(row["extra_info"]["prompt_codes"]) == expected.tolist()
    assert len(expected) == 51  # 16000 samples padded to 16320: 51 frames of 320
    assert row["prompt"][1]["content"] == "".join(lt.speech_token(int(c)) for c in expected)


def test_codes_file_forms(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"dir/p1.wav": [1, 2], "p2": [3]}, indent=2))
    (tmp_path / "b.jsonl").write_text(json.dumps({"wav": "/abs/dir/p1.wav", "codes": [4]}) + "\n")
    mapping, lines = CodesFile(tmp_path / "a.json"), CodesFile(tmp_path / "b.jsonl")
    assert mapping("/elsewhere/p1.wav") == [1, 2]  # by file name
    assert mapping("/x/p2.flac") == [3]  # by stem
    assert mapping("/x/p3.wav", utt="p2") == [3]  # by utterance id
    assert mapping("/x/p3.wav") is None
    assert lines("/abs/dir/p1.wav") == [4]


@pytest.fixture(scope="module")
def mini_codec(tmp_path_factory):
    """A random mini codec (small channels) saved as a checkpoint folder."""
    import torch

    from maspo_base.mel_codec import MelFsqCodec

    torch.manual_seed(0)
    return MelFsqCodec(channels=16, griffin_lim_iters=2).save_pretrained(tmp_path_factory.mktemp("mel") / "codec")


def test_mini_codec_encoder_fills_prompt_codes_for_a_mini_llasa_tokenizer(tmp_path, mini_codec, capsys):
    """--codec mel_fsq:PATH: prompt wavs encoded by the mini codec; --tokenizer of a mini-llasa checkpoint: its layout
    checks the tokenizer and measures the prompt in its own ids."""
    import soundfile as sf

    from maspo_base.mel_codec import MelFsqCodec
    from maspo_base.xcodec2_encoder import load_audio
    from maspo_lab.speaking_model.model import build_tokenizer as build_mini_tokenizer

    mini = tmp_path / "mini"
    build_mini_tokenizer().save_pretrained(mini)
    (mini / "speech_tokens.json").write_text(json.dumps({"layout": "mini-llasa"}))
    wav = 0.1 * np.sin(np.linspace(0, 440 * 2 * np.pi, 8000)).astype(np.float32)
    sf.write(tmp_path / "p.wav", wav, 8000)  # 1 s at 8 kHz: resampled to 16 kHz, 50 frames of 320 samples
    (tmp_path / "in.lst").write_text("u|a prompt|p.wav|the target\n")
    args = ["prepare-data", str(tmp_path / "in.lst"), "--out", str(tmp_path / "out"), "--val-size", "0"]
    assert cli([*args, "--codec", f"mel_fsq:{mini_codec}", "--tokenizer", str(mini)]) == 0
    row = _read(tmp_path / "out" / "train.parquet")[0]
    expected = MelFsqCodec.from_pretrained(mini_codec).encode_waveforms([load_audio(tmp_path / "p.wav")])[0]
    assert list(row["extra_info"]["prompt_codes"]) == expected.tolist()
    assert len(expected) == 50 and 0 <= expected.min() and expected.max() < 1024
    assert row["prompt"][1]["content"] == "".join(lt.speech_token(int(c)) for c in expected)
    capsys.readouterr()
    # Llasa-1B's tokenizer with the mini codec: the model's codes are not the codec's, named before any row
    llasa = tmp_path / "llasa"
    build_tokenizer(["a prompt"]).save_pretrained(llasa)
    assert cli([*args, "--codec", str(mini_codec), "--tokenizer", str(llasa)]) == 2
    assert "layout 'llasa-1b' has 65536 codes but the codec has 1024" in capsys.readouterr().err


def test_prompt_codes_are_checked_against_the_layouts_codebook(tmp_path):
    """Codes files may hold another codec's codes: a mini-llasa layout takes codes below 1,024 only."""
    from maspo_base.speech_tokens.layouts import MINI_LLASA

    rows = [{"text": "fits", "prompt_codes": [0, 1023]}, {"text": "does not", "prompt_codes": [5, 1024]}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    reported = []
    summary = prepare([tmp_path / "in.jsonl"], tmp_path / "m", val_size=0, layout=MINI_LLASA, report=reported.append)
    assert summary.train == 1 and "prompt codes out of range [0, 1024): [1024]" in reported[0]
    assert prepare([tmp_path / "in.jsonl"], tmp_path / "l", val_size=0, report=lambda _: None).train == 2  # Llasa-1B
