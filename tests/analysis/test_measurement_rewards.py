"""The measurements that score as the speaking testbed does (fidelity's scorer, its pilot and gate, build-ear's check)
build their reward from the testbed's one definition (`maspo_lab.runs.speech_run.reward_settings`), each with its
changes stated. No model is loaded: the reward's constructor records what it is given."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from maspo_lab.analysis import ear_check, fidelity_scoring
from maspo_lab.commands import fidelity as fidelity_command
from maspo_lab.runs import speech_run
from maspo_lab.speaking_model import SHIPPED_MODEL
from maspo_lab.speaking_model.hearing import whisper_tiny_en
from reward_fns.pipeline import SpeechReward

CODEC, EAR = Path("/c/codec"), Path("/e/ear")


@pytest.fixture
def built(monkeypatch):
    calls: list[dict] = []
    monkeypatch.setattr(SpeechReward, "from_spec", classmethod(lambda cls, **values: calls.append(values) or cls))
    return calls


def without_second_ear(settings: dict) -> dict:
    return {key: value for key, value in settings.items() if key != "second_asr"}


def test_the_testbeds_reward_and_its_overrides():
    whisper = f"faster_whisper:{whisper_tiny_en()}"
    assert speech_run.reward_settings(CODEC, EAR) == {
        "codec": f"mel_fsq:{CODEC}",
        "asr": {"en": whisper},
        "second_asr": {"en": "pocketsphinx"},
        "default_language": "en",
        "reward_config": {"error_unit": "char", "recogniser": "ear"},
        "ear": str(EAR),
    }
    kw = "+reward.custom_reward_function.reward_kwargs"
    audio = [
        f"{kw}.codec=mel_fsq:{CODEC}",
        f"{kw}.asr.en={whisper}",
        f"{kw}.second_asr.en=pocketsphinx",
        f"{kw}.default_language=en",
        f"{kw}.reward_config.error_unit=char",
    ]
    assert speech_run.reward_settings_overrides(CODEC) == audio
    assert sorted(speech_run.reward_settings_overrides(CODEC, EAR)) == sorted(
        [*audio, f"{kw}.ear={EAR}", f"{kw}.reward_config.recogniser=ear"]
    )


def test_each_measurement_is_the_testbeds_reward_with_its_changes_stated(built):
    layout = speech_run.TASK.model_layout()
    audio, by_ear = speech_run.reward_settings(CODEC), speech_run.reward_settings(CODEC, EAR)
    fidelity_scoring.SpeechTaskScorer.load(CODEC, threads=3)
    args = SimpleNamespace(codec=CODEC, model=SHIPPED_MODEL, reward_threads=3, reward_device="cpu")
    fidelity_command.speech_reward(args, reward_config={"frame_errors": True})
    fidelity_command.speech_reward(args, ear=EAR, reward_config={"frame_errors": True, "frame_words": True})
    ear_check._rewards(CODEC, EAR, layout)
    process = {"layout": layout, "num_threads": 3, "device": "cpu"}
    frames = {"error_unit": "char", "frame_errors": True}
    assert built == [
        {**without_second_ear(audio), **process},  # no request of a measurement asks for the second ear
        {**without_second_ear(audio), **process, "reward_config": frames},
        {
            **without_second_ear(by_ear),
            **process,
            "reward_config": {**frames, "recogniser": "ear", "frame_words": True},
        },
        {**audio, "layout": layout, "num_threads": 2},  # build-ear's check: heard by both audio ears
        {**without_second_ear(by_ear), "layout": layout, "num_threads": 2},
    ]


def test_a_change_to_the_testbeds_reward_reaches_every_measurement(built, monkeypatch):
    testbed = speech_run.reward_settings
    monkeypatch.setattr(speech_run, "reward_settings", lambda codec, ear=None: {**testbed(codec, ear), "max_codes": 7})
    fidelity_scoring.SpeechTaskScorer.load(CODEC)
    fidelity_command.speech_reward(
        SimpleNamespace(codec=CODEC, model=SHIPPED_MODEL, reward_threads=1, reward_device="cpu")
    )
    ear_check._rewards(CODEC, EAR, "mini-llasa")
    assert len(built) == 4 and all(values["max_codes"] == 7 for values in built)
