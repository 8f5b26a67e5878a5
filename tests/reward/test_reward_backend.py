"""The speech reward's backend is the one ``reward_kwargs.backend`` names (`maspo_base.reward_backend`), set by the
config group ``speech_reward``; a key of another backend is an error naming both; the ``reward_kwargs`` are checked
once per process for each distinct mapping."""

from __future__ import annotations

import dataclasses

import pytest

from maspo_base.reward_backend import BACKENDS, RewardBackendError, backend_of_key, reward_backend
from maspo_base.typed_settings import SettingsError
from reward_fns import verl_reward
from reward_fns.reward_settings import ClientSettings, ModelSettings, ServeSettings, field_names

MODELS = {"codec": "/c", "asr": {"en": "x"}}


@pytest.mark.parametrize(
    ("kwargs", "name", "models_here"),
    [
        ({"backend": "in_process", **MODELS}, "in_process", True),
        (MODELS, "in_process", True),  # no choice: in process
        ({"backend": "server", "server_url": "http://h:1", "codec": "/c"}, "server", False),  # codec: the page's
        ({"backend": "serve", "serve_app": "speech_reward", **MODELS}, "serve", True),  # deploys it
        ({"backend": "serve", "serve_app": "speech_reward"}, "serve", False),  # attaches to a running one
    ],
)
def test_the_chosen_backend_is_the_backend(kwargs, name, models_here):
    backend = reward_backend(kwargs)
    assert (backend.name, backend.models_here) == (name, models_here)
    assert backend.missing(kwargs) == []


def test_a_key_is_not_a_choice():
    """Which keys are present chooses nothing: a key of another backend than the chosen one is refused, naming it,
    its backend and the choice, whichever backend the keys would suggest."""
    with pytest.raises(RewardBackendError, match=r"reward_kwargs.backend='in_process' \(the default\) .*server_url"):
        reward_backend({"server_url": "http://h:1"})
    with pytest.raises(
        RewardBackendError,
        match=r"reward_kwargs.backend='server' chooses .* but reward_kwargs.serve_app \(backend 'serve'\) is a setting",
    ):
        reward_backend({"backend": "server", "server_url": "http://h:1", "serve_app": "a"})
    with pytest.raises(RewardBackendError, match=r"reward_kwargs.client_retries \(backend 'server'\)"):
        reward_backend({"backend": "serve", "serve_app": "a", "client_retries": 2})
    with pytest.raises(RewardBackendError, match=r"backend='remote' is not a backend .* valid: \['in_process'"):
        reward_backend({"backend": "remote"})
    # a key left at its null is no setting
    assert reward_backend({"backend": "server", "server_url": "http://h:1", "serve_app": None}).name == "server"


def test_each_backend_names_the_keys_it_lacks():
    assert reward_backend({}).missing({}) == ["codec", "asr"]
    assert reward_backend({"backend": "server"}).missing({"backend": "server"}) == ["server_url"]
    assert reward_backend({"backend": "serve", **MODELS}).missing(MODELS) == ["serve_app"]


def test_the_keys_of_one_backend_are_its_settings_fields():
    """`BACKEND_KEYS`' names and prefixes are exactly the fields of the server's client and of the Serve settings, and
    no other setting of the reward falls under them."""
    assert {f for f in field_names(ClientSettings) if backend_of_key(f) == "server"} == set(field_names(ClientSettings))
    assert {f for f in field_names(ServeSettings) if backend_of_key(f) == "serve"} == set(field_names(ServeSettings))
    assert not [f.name for f in dataclasses.fields(ModelSettings) if backend_of_key(f.name)]
    assert BACKENDS == ("in_process", "server", "serve")


def test_kwargs_are_checked_once_and_every_bad_mapping_every_time(monkeypatch):
    calls = []
    real_split = verl_reward.split
    monkeypatch.setattr(verl_reward, "split", lambda *a, **k: calls.append(a) or real_split(*a, **k))
    monkeypatch.setattr(verl_reward, "_parsed", {})
    kwargs = {"backend": "server", "server_url": "http://h:1", "client_retries": 2, "reward_router_address": "veRL's"}
    first = verl_reward.parse_reward_kwargs(kwargs)
    assert verl_reward.parse_reward_kwargs(dict(kwargs)) is first and len(calls) == 1
    assert first.backend.name == "server" and first.client.client_retries == 2
    for _ in range(2):  # the one rule, in the reward as in the driver: both keys named
        with pytest.raises(SettingsError, match=r"backend='server'.*serve_app"):
            verl_reward.parse_reward_kwargs({"backend": "server", "server_url": "http://h:1", "serve_app": "a"})
    assert len(calls) == 3
    with pytest.raises(SettingsError, match=r"reward_kwargs lack \['server_url'\]"):
        verl_reward.parse_reward_kwargs({"backend": "server"})
