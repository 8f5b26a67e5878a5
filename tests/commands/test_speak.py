"""`maspo-verl speak`: the shipped mini-llasa says sentences; one 16 kHz wav each, sorted as given, and a page that
plays them in a browser."""

from __future__ import annotations

import json

import pytest
import soundfile as sf
from browser import read_samples_page

from maspo_lab.commands.speak import default_codec, file_names, main

SENTENCES = ["Keep away from fire or flame.", "Why do we have two eyes?"]


@pytest.fixture(scope="module")
def spoken(tmp_path_factory):
    out = tmp_path_factory.mktemp("speak")
    assert main([*SENTENCES, "--out", str(out), "--seed", "3"]) == 0
    return out


def test_one_wav_per_sentence_in_the_order_given(spoken):
    record = json.loads((spoken / "speak.json").read_text())
    assert [r["text"] for r in record["sentences"]] == SENTENCES
    names = [r["wav"] for r in record["sentences"]]
    assert names == ["1_keep-away-from-fire-or-flame.wav", "2_why-do-we-have-two-eyes.wav"] == sorted(names)
    for row in record["sentences"]:
        audio, rate = sf.read(spoken / row["wav"])
        assert rate == 16_000 and audio.ndim == 1
        assert len(audio) == 320 * row["codes"] and row["seconds"] == pytest.approx(len(audio) / 16_000)
        assert 0.5 < row["seconds"] < 8.0


def test_the_page_plays_every_sentence_in_a_browser(spoken):
    shown = read_samples_page(spoken, page="index.html", play=True)
    assert shown["sources"] == sorted(p.name for p in spoken.glob("*.wav"))
    assert all(d > 0.5 for d in shown["durations"])
    assert all(t >= 0.2 for t in shown["played"])


def test_names_sort_in_order_past_nine_sentences():
    names = file_names([f"Sentence {i}." for i in range(1, 12)] + ["!!!"])
    assert names[0] == "01_sentence-1.wav" and names[10] == "11_sentence-11.wav" and names[11] == "12_sentence.wav"
    assert names == sorted(names)


def test_a_response_that_never_ends_gets_no_wav_and_the_page_says_so(tmp_path):
    assert main(["Keep away from fire or flame.", "--out", str(tmp_path), "--max-seconds", "0.04"]) == 1
    row = json.loads((tmp_path / "speak.json").read_text())["sentences"][0]
    assert row["wav"] is None and "did not end" in row["note"]
    assert not list(tmp_path.glob("*.wav")) and "did not end" in (tmp_path / "index.html").read_text()


def test_llasa_1b_needs_its_codec_named(capsys):
    with pytest.raises(SystemExit, match="give --codec"):
        default_codec("llasa-1b")


@pytest.mark.parametrize(
    ("argv", "named"),
    [(["--temperature", "0"], "--temperature"), (["--max-seconds", "-1"], "--max-seconds"), ([" "], "blank")],
)
def test_bad_arguments_fail_naming_them(argv, named, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([*(argv if argv == [" "] else ["Hello there.", *argv]), "--out", str(tmp_path)])
    assert named in capsys.readouterr().err


def test_speaker_picks_a_voice_the_checkpoint_learnt_and_is_refused_a_voice_it_did_not(tmp_path):
    from maspo_lab.speaking_model.model import ModelSize, build_model

    size = ModelSize(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=2, intermediate_size=32)
    one = build_model(tmp_path / "one", size, text_frontend="espeak-ng:en-us")
    with pytest.raises(SystemExit, match="--speaker: speaker 'slt': .*learnt one voice"):
        main(["Hello there.", "--out", str(tmp_path / "a"), "--checkpoint", str(one), "--speaker", "slt"])
    several = build_model(
        tmp_path / "several", size, text_frontend="espeak-ng:en-us", speaker="rms", speakers=("rms", "slt-sp90")
    )
    for argv, voice in [([], "rms"), (["--speaker", "slt-sp90"], "slt-sp90")]:
        out = tmp_path / voice
        main(["Hello there.", "--out", str(out), "--checkpoint", str(several), "--max-seconds", "0.04", *argv])
        assert json.loads((out / "speak.json").read_text())["speaker"] == voice
    with pytest.raises(SystemExit, match="--speaker: speaker 'slt': not a voice .*valid: rms, slt-sp90"):
        main(["Hello there.", "--out", str(tmp_path / "b"), "--checkpoint", str(several), "--speaker", "slt"])
    assert not (tmp_path / "b").exists()
