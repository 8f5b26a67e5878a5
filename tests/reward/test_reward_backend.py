"""The speech reward's backend is decided once (`maspo_base.reward_backend`), and its ``reward_kwargs`` are checked once
per process for each distinct mapping."""

from __future__ import annotations

import pytest

from maspo_base.reward_backend import reward_backend
from maspo_base.typed_settings import SettingsError
from reward_fns import verl_reward


@pytest.mark.parametrize(
    ("kwargs", "name", "models_here"),
    [
        ({"codec": "/c", "asr": {"en": "x"}}, "in_process", True),
        ({}, "in_process", True),
        ({"server_url": "http://h:1", "codec": "/c"}, "server", False),
        ({"serve_app": "speech_reward", "codec": "/c", "asr": {"en": "x"}}, "serve", True),  # deploys it
        ({"serve_app": "speech_reward"}, "serve", False),  # attaches to a running one
    ],
)
def test_the_kwargs_select_one_backend(kwargs, name, models_here):
    backend = reward_backend(kwargs)
    assert (backend.name, backend.models_here) == (name, models_here)


def test_kwargs_are_checked_once_and_every_bad_mapping_every_time(monkeypatch):
    calls = []
    real_split = verl_reward.split
    monkeypatch.setattr(verl_reward, "split", lambda *a: calls.append(a) or real_split(*a))
    monkeypatch.setattr(verl_reward, "_parsed", {})
    kwargs = {"server_url": "http://h:1", "client_retries": 2, "reward_router_address": "veRL's own"}
    first = verl_reward.parse_reward_kwargs(kwargs)
    assert verl_reward.parse_reward_kwargs(dict(kwargs)) is first and len(calls) == 1
    assert first.backend.name == "server" and first.client.client_retries == 2
    for _ in range(2):
        with pytest.raises(SettingsError, match="server_url.*serve_app"):
            verl_reward.parse_reward_kwargs({"server_url": "http://h:1", "serve_app": "a"})
    assert len(calls) == 3
