"""veRL entry point: ``reward.custom_reward_function.path=pkg://reward_fns.verl_reward``, ``name=compute_score``.

veRL's reward loop awaits `compute_score` once per response, many at a time. The ``reward_kwargs`` are the fields of
`reward_fns.reward_settings` and ``backend``, the backend the config group ``speech_reward`` chose
(`maspo_base.reward_backend`: one rule for keys of another backend, an error naming them):

- ``backend=server``: post to the running ``maspo-verl reward-server`` at ``server_url`` (`ClientSettings`:
  ``client_timeout_s``, ``client_retries``, ``client_backoff_s``); retries, then `RewardServerUnavailable`.
- ``backend=serve``: the Ray Serve application ``serve_app`` in veRL's Ray cluster (`reward_fns.ray_serve`,
  `ServeSettings`), reached by deployment handle; deployed by the first call when ``codec`` and ``asr`` are given
  too (replicas and their resources from ``serve_*``), else attached to as it runs. A response its replicas cannot
  score after ``serve_retries`` resends scores ``invalid_score`` with ``speech_reason=reward_unavailable``.
- ``backend=in_process`` (the default): `ModelSettings` (``codec`` and ``asr`` required) and `BatchSettings`
  (``max_batch``, ``max_wait_ms``, ``max_queue``). The models load once per process on first use; concurrent calls
  are batched, and calls beyond ``max_queue`` wait for room (back-pressure) rather than fail.

An unknown key, a wrong type or a NaN/inf is an error naming ``reward_kwargs.<key>``. Per sample, from the dataset:
``reward_model.ground_truth`` is the target text (a string, or a dict with ``text``); ``extra_info.language`` picks the
ASR (else ``default_language``); ``extra_info.prompt_codes`` are the voice-cloning prompt's codec ids (never scored;
decoded for speaker similarity); ``extra_info.second_ear`` (true on evaluation rows) asks the second ear
(``second_asr``) to hear the response too. A sample that cannot be scored scores ``invalid_score`` with its
``speech_reason``; it never raises.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from typing import Any

from maspo_base.reward_backend import BACKEND_KEY, RewardBackend, reward_backend
from maspo_base.typed_settings import SettingsError, to_plain
from reward_fns.batching import DynamicBatcher
from reward_fns.client import RewardClient, RewardServerUnavailable
from reward_fns.reward_settings import (
    IN_PROCESS_SETTINGS,
    REMOTE_SETTINGS,
    BatchSettings,
    ClientSettings,
    ModelSettings,
    ServeSettings,
    split,
)

__all__ = ["compute_score", "RewardServerUnavailable"]

_VERL_KEYS = {"reward_router_address", "reward_model_tokenizer"}  # passed by veRL's reward loop; unused here
_KEY = "reward_kwargs"

_rewards: dict[str, Any] = {}
_rewards_lock = threading.Lock()
_batchers: dict[str, DynamicBatcher] = {}  # a batcher follows the running event loop by itself
_clients: dict[str, tuple[asyncio.AbstractEventLoop, RewardClient]] = {}  # httpx pools belong to one loop


def build_request(solution_str: Any, ground_truth: Any, extra_info: dict | None) -> dict[str, Any]:
    """The request of one veRL sample; values are passed as they are (the scorer checks them per sample)."""
    extra_info = extra_info or {}
    text = ground_truth.get("text") if isinstance(ground_truth, dict) else ground_truth
    request: dict[str, Any] = {"solution_str": solution_str, "ground_truth": "" if text is None else str(text)}
    if extra_info.get("language"):  # None or "": the default language; anything else is checked by the scorer
        request["language"] = extra_info["language"]
    if extra_info.get("prompt_codes") is not None:
        request["prompt_codes"] = to_plain(extra_info["prompt_codes"])
    if extra_info.get("second_ear"):  # an evaluation row: heard by the second ear too
        request["second_ear"] = True
    return request


def _key(*settings: Any) -> str:
    return json.dumps([dataclasses.asdict(s) for s in settings], sort_keys=True, default=str)


def _load_reward(key: str, model: ModelSettings):
    with _rewards_lock:
        if key not in _rewards:
            from reward_fns.pipeline import SpeechReward

            _rewards[key] = SpeechReward.from_settings(model)
        return _rewards[key]


async def _score_in_process(request: dict[str, Any], model: ModelSettings, batch: BatchSettings) -> dict[str, Any]:
    key = _key(model, batch)
    if key not in _batchers:
        reward = await asyncio.to_thread(_load_reward, _key(model), model)
        _batchers.setdefault(
            key,
            DynamicBatcher(
                reward.score_batch,
                max_batch=batch.max_batch,
                max_wait_s=batch.max_wait_ms / 1000,
                max_queue=batch.max_queue,
                block=True,  # veRL awaits one call per response of its chunk: wait for room, never fail
            ),
        )
    return await _batchers[key].submit(request)


async def _score_remote(request: dict[str, Any], client_settings: ClientSettings) -> dict[str, Any]:
    key, loop = _key(client_settings), asyncio.get_running_loop()
    if key not in _clients or _clients[key][0] is not loop:
        client = RewardClient(
            str(client_settings.server_url),
            timeout_s=client_settings.client_timeout_s,
            retries=client_settings.client_retries,
            backoff_s=client_settings.client_backoff_s,
        )
        _clients[key] = (loop, client)
    return await _clients[key][1].score(request)


@dataclasses.dataclass(frozen=True)
class RewardSettings:
    """A run's ``reward_kwargs``, checked: the backend (`maspo_base.reward_backend`) and every settings block."""

    backend: RewardBackend
    model: ModelSettings
    batch: BatchSettings
    client: ClientSettings
    serve: ServeSettings


_parsed: dict[str, RewardSettings] = {}


def parse_reward_kwargs(reward_kwargs: dict[str, Any]) -> RewardSettings:
    """The settings of ``reward_kwargs`` (OmegaConf or plain), checked once per process for each distinct mapping
    (veRL passes the same kwargs with every response): every block, then the backend ``backend`` chooses and the
    keys it needs (`maspo_base.reward_backend`); veRL's own keys are ignored."""
    options = {k: v for k, v in to_plain(dict(reward_kwargs)).items() if k not in _VERL_KEYS}
    key = json.dumps(options, sort_keys=True, default=str)
    if key not in _parsed:
        classes = (*IN_PROCESS_SETTINGS, *REMOTE_SETTINGS)
        model, batch, client, serve = split(options, classes, _KEY, read_elsewhere=(BACKEND_KEY,))
        backend = reward_backend(options, _KEY)
        missing = backend.missing(options)
        if missing:
            raise SettingsError(
                f"{_KEY} lack {missing}: {_KEY}.{BACKEND_KEY}={backend.name!r} needs them (in process: codec and asr; "
                "server: server_url; serve: serve_app; maspo_base/reward_backend.py)"
            )
        _parsed[key] = RewardSettings(backend, model, batch, client, serve)
    return _parsed[key]


async def _score_serve(
    request: dict[str, Any], model: ModelSettings, batch: BatchSettings, serve: ServeSettings
) -> dict[str, Any]:
    from reward_fns.ray_serve import client_for, existing_client  # imports Ray Serve: only on this path

    client = existing_client(serve.serve_app)
    if client is None:
        client = await asyncio.to_thread(client_for, model, batch, serve)  # the first call may deploy the app
    return await client.score(request)


async def compute_score(
    data_source: str, solution_str: Any, ground_truth: Any, extra_info: dict | None = None, **reward_kwargs
) -> dict[str, Any]:
    """Score one Llasa response: veRL's dict form, ``score`` plus the ``speech_*`` components (see `pipeline`)."""
    settings = parse_reward_kwargs(reward_kwargs)
    request = build_request(solution_str, ground_truth, to_plain(extra_info))
    if settings.backend.name == "server":
        return await _score_remote(request, settings.client)
    if settings.backend.name == "serve":
        return await _score_serve(request, settings.model, settings.batch, settings.serve)
    return await _score_in_process(request, settings.model, settings.batch)
