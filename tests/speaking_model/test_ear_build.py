"""``maspo-verl build-ear`` at a toy size: the real command on a tiny corpus and codec (speaking_model conftest)."""

from __future__ import annotations

import json

import pytest

from maspo_lab.commands import build_ear
from reward_fns.code_ear import CodeEar

TOY = [
    "--check-sentences",
    "0",
    "--steps",
    "4",
    "--eval-every",
    "2",
    "--frames-per-batch",
    "400",
    "--width",
    "16",
    "--dilations",
    "[1, 2]",
]


def test_build_ear_encodes_the_corpus_trains_and_reports_held_out_phoneme_errors(tmp_path, tiny_corpus, tiny_codec):
    out = tmp_path / "ear"
    args = ["--corpus", str(tiny_corpus), "--codec", str(tiny_codec), "--out", str(out), "--voices", "rms", "slt"]
    assert build_ear.main([*args, *TOY]) == 0
    ear = CodeEar.from_pretrained(out)
    rows = [json.loads(line) for line in (out / "codes.jsonl").read_text().splitlines()]
    train_texts = {r["text"] for r in rows if r["split"] == "train"}
    heldout_texts = {r["text"] for r in rows if r["split"] == "heldout"}
    assert train_texts and heldout_texts and not train_texts & heldout_texts  # held-out sentences never trained on
    trained_phonemes = {u for text in train_texts for u in ear.targets(text)}
    assert set(ear.config.phonemes) == trained_phonemes  # the inventory is the training split's
    training = json.loads((out / "training.json").read_text())
    assert [h["step"] for h in training["history"]] == [2, 4] and training["best_step"] in (2, 4)
    report = json.loads((out / "report.json").read_text())
    assert set(report) == {"rms", "slt", "all"} and 0 <= report["all"]["per"]
    per_voice = [report[v]["utterances"] + report[v]["unknown_phoneme_utterances"] for v in ("rms", "slt")]
    assert sum(per_voice) == report["all"]["utterances"] + report["all"]["unknown_phoneme_utterances"]
    assert all(n > 0 for n in per_voice)
    assert report["all"]["utterances"] + report["all"]["unknown_phoneme_utterances"] == len(
        [r for r in rows if r["split"] == "heldout"]
    )
    stamp = (out / "codes.jsonl").stat().st_mtime_ns
    assert build_ear.main([*args, *TOY]) == 0
    assert (out / "codes.jsonl").stat().st_mtime_ns == stamp  # the corpus's codes are encoded once


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--kernel", "4"], "--kernel"),
        (["--mask-fraction", "1.5"], "--mask-fraction"),
        (["--dilations", "[]"], "--dilations"),
        (["--layout", "nope"], "nope"),
    ],
)
def test_bad_settings_stop_before_anything_is_built(tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit):
        build_ear.parse_args(["--codes", str(tmp_path / "x"), "--out", str(tmp_path), *extra])
    with pytest.raises(SystemExit):
        build_ear.parse_args(["--out", str(tmp_path)])
    codes = tmp_path / "codes.jsonl"
    codes.write_text("")
    with pytest.raises(SystemExit):
        build_ear.parse_args(["--codes", str(codes), "--out", str(tmp_path), *extra])
    assert message in capsys.readouterr().err


def test_an_ear_over_xcodec2_codes_reads_them_as_fsq_digits(tmp_path, tiny_corpus):
    """Llasa-1B's path at toy size: the corpus encoded by a random XCodec2 (encoder and all, built here), an ear
    over its 65,536 codes read as 8 FSQ digits of 4 levels."""
    from reward_fns.testing.tiny_encoder import write_tiny_xcodec2_with_encoder

    xcodec2 = write_tiny_xcodec2_with_encoder(tmp_path / "xcodec2")
    out = tmp_path / "ear"
    args = ["--corpus", str(tiny_corpus), "--codec", f"xcodec2:{xcodec2}", "--out", str(out), "--voices", "rms"]
    assert build_ear.main([*args, "--layout", "llasa-1b", "--inputs", "digits", *TOY]) == 0
    ear = CodeEar.from_pretrained(out)
    assert ear.config.codebook_size == 65536 and ear.config.fsq_levels == (4,) * 8
    assert ear.embed.num_embeddings == 8 * 4 + 1  # one row per digit level, and the mask
    rows = [json.loads(line) for line in (out / "codes.jsonl").read_text().splitlines()]
    assert max(max(r["codes"]) for r in rows) >= 1024  # XCodec2's codes, beyond the mini codec's 1,024
