"""The speaking testbed's corpus: which fortune sentences pass, how utterances are split and written (real flite)."""

from __future__ import annotations

import inspect
import json
import re
import shutil

import numpy as np
import pytest
import soundfile as sf

from maspo_lab.commands import build_corpus as build_corpus_command
from maspo_lab.speaking_model import corpus


@pytest.fixture
def fortunes(tmp_path):
    root = tmp_path / "fortunes"
    root.mkdir()
    (root / "cookie").write_text(
        "Keep away from fire or flame.\n%\n"
        "A tall, dark stranger will have more fun than you.  Buy the negatives at any price!\n%\n"
        "Too short.\n%\n"
        "Use the NASA computer for your taxes today.\n%\n"
        "Numbers like 42 are never spoken here at all.\n%\n"
        "This one has far too many words in it to be spoken within four seconds at all.\n"
    )
    (root / "cookie.dat").write_bytes(b"\x00binary index")  # strfile's index: never read
    (root / "riddles").write_text("Why do we have two eyes?\n%\nKeep away from fire or flame.\n")
    return root


def test_sentences_are_cut_at_sentence_ends_filtered_and_distinct(fortunes):
    assert corpus.candidate_sentences(fortunes) == [
        "A tall, dark stranger will have more fun than you.",
        "Buy the negatives at any price!",
        "Keep away from fire or flame.",
        "Why do we have two eyes?",
    ]


def test_the_installed_fortune_files_hold_the_default_builds_sentences():
    """`build_corpus`'s default (6,000 sentences) is possible on a machine set up by scripts/setup.sh."""
    default = inspect.signature(corpus.build_corpus).parameters["sentences"].default
    assert len(corpus.candidate_sentences()) >= default


def test_no_fortune_files_names_the_package(tmp_path):
    with pytest.raises(FileNotFoundError, match="install Debian's fortunes"):
        corpus.candidate_sentences(tmp_path)


def test_a_sentence_is_held_out_by_its_text_whatever_its_position():
    texts = [f"Sentence number {i} is here." for i in range(2000)]
    held = [t for t in texts if corpus.heldout(t, 0.1)]
    assert 150 < len(held) < 250  # about a tenth
    assert held == [t for t in reversed(texts) if corpus.heldout(t, 0.1)][::-1]
    assert not any(corpus.heldout(t, 0.0) for t in texts) and all(corpus.heldout(t, 1.0) for t in texts)


def test_build_speaks_every_sentence_in_every_voice_and_keeps_one_split_per_sentence(fortunes, tmp_path):
    out = corpus.build_corpus(
        tmp_path / "corpus", sentences=3, voices=("rms", "slt"), heldout_fraction=0.5, source=fortunes, log=lambda _: 0
    )
    rows = corpus.read_manifest(out)
    assert {u.voice for u in rows} == {"rms", "slt"}
    by_text = {}
    for u in rows:
        audio, rate = sf.read(out / u.audio)
        assert rate == 16_000 and audio.ndim == 1
        assert u.seconds == pytest.approx(len(audio) / 16_000, abs=1e-3) and 1.0 <= u.seconds <= 4.0
        by_text.setdefault(u.text, set()).add(u.split)
    assert all(len(splits) == 1 for splits in by_text.values())  # held out in every voice or in none
    assert corpus.read_manifest(out, voice="rms", split="train") == [
        u for u in rows if u.voice == "rms" and u.split == "train"
    ]
    summary = json.loads((out / "corpus.json").read_text())
    kept = sum(sum(v.values()) for v in summary["utterances"].values())
    assert summary["voices"] == ["rms", "slt"] and kept == len(rows)


def test_bad_inputs_fail_early_naming_what_is_wrong(fortunes, tmp_path):
    with pytest.raises(ValueError, match="no voice \\['nobody'\\]"):
        corpus.build_corpus(tmp_path / "c", sentences=1, voices=("nobody",), source=fortunes)
    with pytest.raises(ValueError, match="only 4 that pass the filters .*installs fortunes"):
        corpus.build_corpus(tmp_path / "c", sentences=5, voices=("rms",), source=fortunes)
    with pytest.raises(FileNotFoundError, match="lacks manifest.jsonl"):
        corpus.read_manifest(tmp_path)


def test_changing_speed_scales_frequency_and_duration_by_the_factor():
    rate = corpus.SAMPLE_RATE
    tone = np.sin(2 * np.pi * 200 * np.arange(rate) / rate).astype(np.float32)
    for factor, expected_length in ((1.1, 14546), (0.9, 17778)):  # ceil(16000 x 100 / (100 f))
        played = corpus.change_speed(tone, factor)
        assert played.dtype == np.float32 and len(played) == expected_length
        spectrum = np.abs(np.fft.rfft(played))
        peak_hz = np.argmax(spectrum) * rate / len(played)
        assert peak_hz == pytest.approx(200 * factor, abs=1.0)


def test_speed_perturbation_adds_a_voice_per_factor_with_the_same_sentences_and_splits(tiny_corpus, tmp_path):
    root = shutil.copytree(tiny_corpus, tmp_path / "corpus")
    before = corpus.read_manifest(root)
    added = corpus.perturb_speed(root, [0.9, 1.1], log=lambda _: None)
    assert corpus.read_manifest(root) == before + added
    assert {u.voice for u in added} == {"rms-sp90", "rms-sp110", "slt-sp90", "slt-sp110"}
    sources = {(u.voice, u.id): u for u in before}
    for u in added:
        base, _, speed = u.voice.partition("-sp")
        source, factor = sources[(base, u.id)], int(speed) / 100
        assert corpus.is_perturbed(u.voice) and not corpus.is_perturbed(base)
        assert (u.text, u.split) == (source.text, source.split)
        expected = corpus.change_speed(corpus.load_audio(root, source), factor)
        np.testing.assert_allclose(corpus.load_audio(root, u), expected, atol=1.5 / 32768)  # FLAC keeps 16 bits
        assert u.seconds == pytest.approx(source.seconds / factor, abs=1e-3) and 1.0 <= u.seconds <= 4.0
    summary = json.loads((root / "corpus.json").read_text())
    assert summary["speeds"] == [0.9, 1.1] and summary["utterances"]["rms-sp90"]["train"] == sum(
        u.voice == "rms-sp90" and u.split == "train" for u in added
    )
    # a second call adds nothing; a copy outside the durations is not kept
    assert corpus.perturb_speed(root, [0.9, 1.1], log=lambda _: None) == []
    assert corpus.read_manifest(root) == before + added
    shortest = min(u.seconds for u in before)
    kept = corpus.perturb_speed(root, [0.5], max_seconds=2 * shortest + 1e-3, log=lambda _: None)
    assert kept and all(u.seconds <= 2 * shortest + 1e-3 for u in kept)
    assert len(kept) == sum(2 * u.seconds <= 2 * shortest + 1e-3 for u in before)


def test_bad_speeds_fail_naming_what_is_valid(tmp_path, capsys):
    for factor in (1.0, float("nan"), 3.0, 0.1):
        with pytest.raises(ValueError, match=f"speed factor {factor}: want a number in 0.5..2.0 other than 1"):
            corpus.check_speed(factor)
    empty, built = tmp_path / "empty", tmp_path / "built"
    (built / "manifest.jsonl").parent.mkdir()
    (built / "manifest.jsonl").touch()
    for out, options, message in (
        (empty, ["--speeds", "1.0"], "--speeds: speed factor 1.0"),
        (empty, ["--speeds", "0.9", "--reuse"], "--reuse: .*empty holds no corpus"),
        (built, ["--reuse", "--speeds"], "--reuse only adds --speeds"),
    ):
        with pytest.raises(SystemExit):
            build_corpus_command.parse_args(["--out", str(out), *options])
        assert re.search(message, capsys.readouterr().err)
