"""The listening page (`maspo_verl.listening`): which responses, their wavs from the reward's decoder, the parts
shown, the settings' errors, the page in headless Chromium, tensorboard's audio."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from browser import chromium, read_samples_page
from omegaconf import OmegaConf

from maspo_base.typed_settings import SettingsError
from maspo_base.xcodec2_decoder import HOP_LENGTH, SAMPLE_RATE, XCodec2Decoder
from maspo_verl.listening import (
    PAGE,
    SampleSettings,
    decode_response,
    read_rows,
    render_page,
    sample_parts,
    sample_settings,
    spread,
    write_samples,
)
from reward_fns.testing.tiny_models import random_codes, speech_response


def test_spread_covers_the_batch_evenly_and_handles_the_edges():
    assert spread(32, 8) == [0, 4, 9, 13, 18, 22, 27, 31]
    assert spread(5, 8) == [0, 1, 2, 3, 4]
    assert spread(7, 1) == [0]
    assert spread(1, 3) == [0]
    assert spread(0, 3) == [] and spread(4, 0) == []


def test_sample_parts_keeps_finite_numbers_and_short_texts():
    extras = {
        "speech_error_rate": [0.25, float("nan")],
        "speech_valid": [True, np.float32(1.0)],
        "speech_transcript": ["hello", "x" * 500],
        "frame_errors": ["0101", "1"],
        "reward": [0.5, 0.1],
        "speech_n_codes": [np.int64(12), None],
    }
    numeric, text = sample_parts(extras, 0)
    assert numeric == {"speech_error_rate": 0.25, "speech_valid": 1.0, "speech_n_codes": 12.0}
    assert text == {"speech_transcript": "hello"}
    numeric, text = sample_parts(extras, 1)
    assert numeric == {"speech_valid": 1.0}  # NaN and None are not shown as numbers
    assert text == {}  # an encoded signal is not something to read


def _config(**trainer):
    return OmegaConf.create(
        {
            "trainer": {"default_local_dir": "/runs/a", **trainer},
            "reward": {"custom_reward_function": {"reward_kwargs": {"codec": "/models/xcodec2"}}},
        }
    )


def test_settings_default_to_the_run_folder_and_the_rewards_codec():
    settings = sample_settings(_config())
    assert settings == SampleSettings(count=8, train_every=0, dir="/runs/a/samples", codec="/models/xcodec2")
    own = sample_settings(_config(samples={"dir": "/tmp/page", "codec": "/other", "count": 2}))
    assert (own.dir, own.codec, own.count) == ("/tmp/page", "/other", 2)
    assert sample_settings(OmegaConf.create({"trainer": {}})).codec is None  # the synthetic task: no audio


@pytest.mark.parametrize(
    ("samples", "trainer", "message"),
    [
        ({"count": -1}, {}, "trainer.samples.count"),
        ({"train_every": -2}, {}, "trainer.samples.train_every"),
        ({"count": "many"}, {}, "trainer.samples.count"),
        ({"every": 2}, {}, "unknown key"),
        ({"train_every": 2}, {}, "needs trainer.rollout_data_dir"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(samples, trainer, message):
    with pytest.raises(SettingsError, match=message):
        sample_settings(_config(samples=samples, **trainer))


def test_train_every_with_a_rollout_dir_is_accepted():
    assert sample_settings(_config(samples={"train_every": 2}, rollout_data_dir="/r")).train_every == 2


def _dump(n_codes=(12, 7), bad: bool = True):
    outputs = [speech_response(random_codes(n, seed=n)) for n in n_codes]
    gts = [f"text {n}" for n in n_codes]
    scores = [0.1 * (i + 1) for i in range(len(outputs))]
    extras = {"speech_error_rate": [0.5 - 0.1 * i for i in range(len(outputs))], "speech_transcript": gts}
    if bad:
        outputs.append("no speech at all")
        gts.append("text bad")
        scores.append(0.0)
        extras["speech_error_rate"].append(1.0)
        extras["speech_transcript"].append("")
    return {"inputs": [f"prompt {g}" for g in gts], "outputs": outputs, "gts": gts, "scores": scores, "extras": extras}


def test_samples_are_the_rewards_decode_and_the_page_holds_their_scores(tmp_path, tiny_codec_dir):
    settings = SampleSettings(count=8, dir=str(tmp_path), codec=str(tiny_codec_dir))
    dump = _dump()
    rows = write_samples(settings=settings, step=3, kind="validation", **dump)
    assert [r["index"] for r in rows] == [0, 1, 2]
    decoder = XCodec2Decoder.from_pretrained(tiny_codec_dir)
    import soundfile

    for row, n in zip(rows[:2], (12, 7)):
        wav, rate = soundfile.read(tmp_path / row["audio"], dtype="float32")
        assert rate == SAMPLE_RATE and len(wav) == HOP_LENGTH * n
        assert row["duration_s"] == pytest.approx(HOP_LENGTH * n / SAMPLE_RATE)
        expected = np.clip(decoder.decode([random_codes(n, seed=n)])[0], -1, 1)
        np.testing.assert_allclose(wav, expected, atol=1 / 2**15)  # 16-bit PCM of the reward's own decode
    assert rows[2]["audio"] is None and rows[2]["note"].startswith("no speech codes (no_speech_tokens)")
    assert [r["parts"]["speech_error_rate"] for r in rows] == dump["extras"]["speech_error_rate"]
    assert read_rows(tmp_path) == json.loads(json.dumps(rows))
    page = (tmp_path / PAGE).read_text()
    assert page.count("<audio ") == 2 and "no audio: no speech codes" in page
    assert f'data-key="score" data-value="{0.2!r}"' in page


def test_a_response_cut_at_the_length_limit_is_still_heard(tiny_codec_dir):
    wav, note = decode_response(speech_response(random_codes(5, seed=1), end=False), str(tiny_codec_dir))
    assert note == "" and len(wav) == 5 * HOP_LENGTH


def test_the_mini_codec_decodes_by_spec_and_bounds_the_codes(tmp_path):
    """``mel_fsq:PATH``: the mini codec decodes, and its 1,024 codes (not XCodec2's 65,536) bound a response's."""
    import torch

    from maspo_base.mel_codec import MelFsqCodec

    torch.manual_seed(0)
    path = MelFsqCodec(channels=16, griffin_lim_iters=2).save_pretrained(tmp_path / "mini_codec")
    codes = [0, 1023, 512, 7]
    wav, note = decode_response(speech_response(codes), f"mel_fsq:{path}")
    assert note == "" and len(wav) == 4 * HOP_LENGTH
    np.testing.assert_array_equal(wav, MelFsqCodec.from_pretrained(path).decode([np.array(codes)])[0])
    wav, note = decode_response(speech_response([5, 1024]), f"mel_fsq:{path}")
    assert wav is None and note == "codes out of range (code 1024 at position 1; valid: [0, 1024))"
    wav, note = decode_response(speech_response([5]), str(tmp_path / "absent"))
    assert wav is None and note.startswith("codec failed to load: ")


def test_without_a_codec_the_page_has_no_players_and_newest_step_first(tmp_path):
    settings = SampleSettings(count=2, dir=str(tmp_path))
    for step, kind in ((0, "validation"), (2, "training"), (2, "validation")):
        write_samples(settings=settings, step=step, kind=kind, **_dump(bad=False))
    page = (tmp_path / PAGE).read_text()
    assert "<audio" not in page and "no audio" not in page
    order = [
        page.index(f'data-step="{s}" data-kind="{k}"')
        for s, k in ((2, "validation"), (2, "training"), (0, "validation"))
    ]
    assert order == sorted(order)
    assert "speech_transcript" in page and "text 12" in page


def test_a_step_sampled_again_by_a_resumed_run_is_on_the_page_once_with_its_later_scores(tmp_path):
    settings = SampleSettings(count=2, dir=str(tmp_path))
    write_samples(settings=settings, step=0, kind="validation", **_dump(bad=False))
    write_samples(settings=settings, step=5, kind="validation", **_dump(bad=False))
    again = _dump(bad=False)
    again["scores"] = [s + 1.0 for s in again["scores"]]
    write_samples(settings=settings, step=5, kind="validation", **again)  # the resumed run validates step 5 again
    rows = read_rows(tmp_path)
    assert [(r["step"], r["index"]) for r in rows] == [(0, 0), (0, 1), (5, 0), (5, 1)]
    assert [r["score"] for r in rows[2:]] == again["scores"]
    assert "step 5, validation (2 responses)" in (tmp_path / PAGE).read_text()


def test_an_empty_page_says_when_samples_come():
    assert "trainer.test_freq" in render_page([])


def test_tensorboard_gets_the_same_audio(tmp_path, tiny_codec_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    settings = SampleSettings(count=8, dir=str(tmp_path / "page"), codec=str(tiny_codec_dir))
    tb = tmp_path / "tb"
    write_samples(
        settings=settings,
        step=4,
        kind="validation",
        loggers=("console", "tensorboard"),
        tensorboard_dir=str(tb),
        **_dump(),
    )
    events = EventAccumulator(str(tb), size_guidance={"audio": 0}).Reload()
    tags = sorted(events.Tags()["audio"])
    assert tags == ["samples/validation/0", "samples/validation/1"]  # the response without speech has no audio
    clip = events.Audio("samples/validation/1")[0]
    assert clip.step == 4 and clip.sample_rate == SAMPLE_RATE and clip.length_frames == HOP_LENGTH * 7


@pytest.mark.skipif(chromium() is None, reason="chromium is not installed (scripts/setup.d/browser.sh)")
def test_the_page_plays_in_headless_chromium(tmp_path, tiny_codec_dir):
    settings = SampleSettings(count=8, dir=str(tmp_path), codec=str(tiny_codec_dir))
    rows = write_samples(settings=settings, step=1, kind="validation", **_dump())
    shown = read_samples_page(tmp_path)
    assert shown["sources"] == [r["audio"] for r in rows if r["audio"]]
    assert shown["durations"] == pytest.approx([r["duration_s"] for r in rows if r["audio"]], abs=1e-3)
    scores = {(c["index"], c["key"]): c["value"] for c in shown["cells"]}
    for row in rows:
        assert scores[(row["index"], "score")] == row["score"]
        assert all(math.isclose(scores[(row["index"], k)], v) for k, v in row["parts"].items())


def test_wandb_gets_the_same_audio_offline(tmp_path, tiny_codec_dir, monkeypatch):
    import wandb

    monkeypatch.setenv("WANDB_SILENT", "true")
    settings = SampleSettings(count=8, dir=str(tmp_path / "page"), codec=str(tiny_codec_dir))
    wandb.init(mode="offline", dir=str(tmp_path), project="listening-test")
    try:
        write_samples(settings=settings, step=5, kind="validation", loggers=("wandb",), **_dump())
    finally:
        wandb.finish()
    import soundfile

    media = sorted((tmp_path / "wandb").glob("offline-run-*/files/media/audio/**/*.wav"))
    lengths = sorted(len(soundfile.read(path)[0]) for path in media)
    assert lengths == sorted(HOP_LENGTH * n for n in (12, 7))  # the two responses with speech, not the third


def test_after_dump_samples_validations_and_every_nth_training_step(tmp_path):
    """The hook's dispatch (`after_dump`, run after veRL's ``_dump_generations``): by dump folder and step."""
    from types import SimpleNamespace

    from maspo_verl.listening import after_dump

    config = OmegaConf.create(
        {
            "trainer": {
                "validation_data_dir": "val",
                "rollout_data_dir": "roll",
                "samples": {"dir": str(tmp_path), "count": 1, "train_every": 2},
                "logger": ["console"],
                "project_name": "p",
                "experiment_name": "e",
            }
        }
    )
    dump = _dump(bad=False)
    args = (dump["inputs"], dump["outputs"], dump["gts"], dump["scores"], dump["extras"])
    for step, path in ((3, "val"), (3, "roll"), (4, "roll"), (4, "elsewhere")):
        after_dump(SimpleNamespace(config=config, global_steps=step), *args, path)
    assert [(r["step"], r["kind"]) for r in read_rows(tmp_path)] == [(3, "validation"), (4, "training")]


def test_the_page_sets_the_same_sentence_before_and_after_side_by_side_with_its_set(tmp_path, tiny_codec_dir):
    from maspo_verl.listening import SETS, write_page

    settings = SampleSettings(count=8, dir=str(tmp_path), codec=str(tiny_codec_dir))
    before, after = _dump(), _dump()
    after["scores"] = [0.9, 0.8, 0.7]
    write_samples(settings=settings, step=0, kind="validation", **before)
    assert 'id="before-after"' not in (tmp_path / PAGE).read_text()  # one validation: nothing to compare
    write_samples(settings=settings, step=6, kind="validation", **after)
    write_samples(settings=settings, step=6, kind="training", **_dump())  # not a validation: not compared
    (tmp_path / SETS).write_text(json.dumps({before["gts"][0]: "training", before["gts"][1]: "held-out"}))
    page = write_page(tmp_path).read_text()
    table = page[page.index('id="before-after"') : page.index("</table>")]
    assert "before (step 0) and after (step 6)" in table
    rows = table.split("<tr data-set=")[1:]
    assert [r.split('"')[1] for r in rows] == ["training", "held-out", "-"]
    first = rows[0]
    assert first.count("<audio ") == 2 and "score 0.1" in first and "score 0.9" in first
    assert first.index("score 0.1") < first.index("score 0.9")  # before, then after
    assert page.index('id="before-after"') < page.index('id="step6-validation"')
