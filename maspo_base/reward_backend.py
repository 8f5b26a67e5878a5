"""Which backend scores the speech reward: the one ``reward_kwargs.backend`` names, never one guessed from other keys.

The speech reward (``pkg://reward_fns.verl_reward``) runs in one of three places. The Hydra group
``maspo_verl/trainer_config/speech_reward/`` is where a run chooses it, and each of its options writes its name into
``reward_kwargs.backend`` (a config without it, or a direct call, runs `DEFAULT_BACKEND`):

- ``in_process``: veRL's reward workers load ``codec`` and ``asr`` themselves (both required);
- ``server``: a running ``maspo-verl reward-server`` scores at ``server_url`` (required; its models are its own flags);
- ``serve``: the Ray Serve application ``serve_app`` scores (required). With ``codec`` and ``asr`` given the first call
  deploys it (``deploys``: its models are in this config), without them the run attaches to it.

One rule for conflicting settings: a key that only another backend reads (`BACKEND_KEYS`: the reward server's
``server_url`` and ``client_*``, the Serve application's ``serve_*``) is an error that names it, its backend and
``reward_kwargs.backend``; so is a required key left out (`RewardBackend.missing`). The model keys (``codec``,
``asr``, ``reward_config``, ...) are read in process and by a Serve application this run deploys; a reward server
has its own (a ``codec`` here still gives the listening page its decoder).

The reward dispatches on it (`reward_fns.verl_reward`) and the plugin's driver checks it before Ray
(`maspo_verl.verl_patches.trainer.check_speech_reward`); it lives in the base because both read it and neither may
import the other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from maspo_base.typed_settings import SettingsError

BackendName = Literal["in_process", "server", "serve"]
BACKENDS: tuple[BackendName, ...] = get_args(BackendName)
BACKEND_KEY = "backend"
"""The ``reward_kwargs`` key that names the backend; the ``speech_reward`` config group sets it."""
DEFAULT_BACKEND: BackendName = "in_process"
BACKEND_KEYS: dict[BackendName, tuple[str, ...]] = {"server": ("server_url", "client_"), "serve": ("serve_",)}
"""The keys only one backend reads, by name or prefix: the reward server's client settings and the Serve
application's (the fields of `reward_fns.reward_settings.ClientSettings` and ``ServeSettings``, which
tests/reward/test_reward_backend.py holds to these)."""
REQUIRED_KEYS: dict[BackendName, tuple[str, ...]] = {
    "in_process": ("codec", "asr"),
    "server": ("server_url",),
    "serve": ("serve_app",),
}
KEY = "reward_kwargs"


class RewardBackendError(SettingsError):
    """The speech reward's backend is unknown, or its settings belong to another backend or lack a required key."""


@dataclass(frozen=True)
class RewardBackend:
    name: BackendName
    models_here: bool
    """Whether this config holds the reward's models and ``reward_config`` (in process, or a Serve application this
    run deploys), so that what the reward reports can be read from it."""

    def missing(self, reward_kwargs: Mapping[str, Any] | None) -> list[str]:
        """The keys this backend needs that ``reward_kwargs`` leaves unset (`REQUIRED_KEYS`)."""
        kwargs = reward_kwargs or {}
        return [key for key in REQUIRED_KEYS[self.name] if not _given(kwargs, key)]


def backend_of_key(key: str) -> BackendName | None:
    """The one backend that reads ``key`` (`BACKEND_KEYS`), None for a key every backend may hold."""
    for name, owned in BACKEND_KEYS.items():
        if any(key == prefix or (prefix.endswith("_") and key.startswith(prefix)) for prefix in owned):
            return name
    return None


def _given(kwargs: Mapping[str, Any], key: str) -> bool:
    return kwargs.get(key, None) not in (None, "", {}, [])


def reward_backend(reward_kwargs: Mapping[str, Any] | None, key: str = KEY) -> RewardBackend:
    """The backend ``reward_kwargs.backend`` names (`DEFAULT_BACKEND` when it is absent), checked against the other
    keys by the module's one rule; `RewardBackendError` names ``key.backend`` and every key of another backend."""
    kwargs = reward_kwargs or {}
    chosen = kwargs.get(BACKEND_KEY, None)
    name = DEFAULT_BACKEND if chosen is None else chosen
    if name not in BACKENDS:
        raise RewardBackendError(
            f"{key}.{BACKEND_KEY}={name!r} is not a backend of the speech reward; valid: {list(BACKENDS)} "
            "(the config group speech_reward=in_process|server|serve sets it)"
        )
    foreign = [(k, backend_of_key(k)) for k in kwargs if _given(kwargs, k) and backend_of_key(k) not in (None, name)]
    if foreign:
        said = f"{key}.{BACKEND_KEY}={name!r}" + (" (the default)" if chosen is None else "")
        others = ", ".join(f"{key}.{k} (backend {owner!r})" for k, owner in foreign)
        raise RewardBackendError(
            f"{said} chooses where the speech reward runs, but {others} "
            f"{'is a setting' if len(foreign) == 1 else 'are settings'} of another: choose one backend "
            "(speech_reward=in_process|server|serve) and give only its keys"
        )
    models_here = name == "in_process" or (name == "serve" and _given(kwargs, "codec") and _given(kwargs, "asr"))
    return RewardBackend(name, models_here=models_here)
