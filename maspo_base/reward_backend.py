"""Which backend scores the speech reward, decided in one place from its ``reward_kwargs``.

The speech reward (``pkg://reward_fns.verl_reward``) runs in one of three places, chosen by its ``reward_kwargs``:

- ``server``: ``server_url`` is set; a running ``maspo-verl reward-server`` scores (its models are its own flags);
- ``serve``: ``serve_app`` is set; the Ray Serve application of that name scores. With ``codec`` and ``asr`` given
  the first call deploys it (``deploys``: its models are in this config), without them the run attaches to it;
- ``in_process``: neither; veRL's reward workers load ``codec`` and ``asr`` themselves.

The reward dispatches on it (`reward_fns.verl_reward`) and the plugin's driver check reads it (a reward served
elsewhere carries its ``reward_config`` in its own flags, so this config cannot say whether it reports heard words).
It lives in the base because both read it and neither may import the other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

BackendName = Literal["in_process", "server", "serve"]


@dataclass(frozen=True)
class RewardBackend:
    name: BackendName
    models_here: bool
    """Whether this config holds the reward's models and ``reward_config`` (in process, or a Serve application this
    run deploys), so that what the reward reports can be read from it."""


def reward_backend(reward_kwargs: Mapping[str, Any] | None) -> RewardBackend:
    """The backend ``reward_kwargs`` select (module docstring); setting both ``server_url`` and ``serve_app`` is an
    error of the settings (`reward_fns.verl_reward.parse_reward_kwargs`), here the server wins."""
    kwargs = reward_kwargs or {}
    if kwargs.get("server_url"):
        return RewardBackend("server", models_here=False)
    if kwargs.get("serve_app"):
        return RewardBackend("serve", models_here=bool(kwargs.get("codec") and kwargs.get("asr")))
    return RewardBackend("in_process", models_here=True)
