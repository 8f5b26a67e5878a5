"""veRL entry point: ``reward.custom_reward_function.path=pkg://reward_fns.verl_reward``, ``name=compute_score``.

veRL's reward loop awaits `compute_score` once per response, many at a time. The ``reward_kwargs`` choose the
backend:

- ``server_url``: post to a running ``maspo-verl reward-server`` (retries, then `RewardServerUnavailable`);
  ``client_timeout_s``, ``client_retries``, ``client_backoff_s`` tune the client.
- otherwise in process: ``codec`` and ``asr`` (required), ``device``, ``dtype``, ``default_language``, ``speaker``,
  ``reward_config`` (dict of `RewardConfig` fields), ``max_codes``, ``max_batch``, ``max_wait_ms``. The models load
  once per process on first use; concurrent calls are batched.

Per sample, from the dataset: ``reward_model.ground_truth`` is the target text (a string, or a dict with ``text``);
``extra_info.language`` picks the ASR (else ``default_language``); ``extra_info.prompt_codes`` are the voice-cloning
prompt's codec ids (never scored; decoded for speaker similarity).
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from .batching import DynamicBatcher
from .client import RewardClient, RewardServerUnavailable

__all__ = ["compute_score", "RewardServerUnavailable"]

_IN_PROCESS_KEYS = {
    "codec",
    "asr",
    "device",
    "dtype",
    "default_language",
    "speaker",
    "reward_config",
    "max_codes",
    "codec_max_batch",
    "num_threads",
    "asr_batch_size",
    "codec_pad_multiple",
}
_BATCH_KEYS = {"max_batch", "max_wait_ms"}
_CLIENT_KEYS = {"server_url", "client_timeout_s", "client_retries", "client_backoff_s"}
_VERL_KEYS = {"reward_router_address", "reward_model_tokenizer"}  # passed by veRL's reward loop; unused here

_rewards: dict[str, Any] = {}
_rewards_lock = threading.Lock()
_batchers: dict[str, DynamicBatcher] = {}  # a batcher follows the running event loop by itself
_clients: dict[str, tuple[asyncio.AbstractEventLoop, RewardClient]] = {}  # httpx pools belong to one loop


def _plain(value: Any) -> Any:
    """OmegaConf containers (Hydra's ``reward_kwargs``) -> dicts and lists."""
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple) or type(value).__name__ == "ListConfig":
        return [_plain(v) for v in value]
    return value


def build_request(solution_str: str, ground_truth: Any, extra_info: dict | None) -> dict[str, Any]:
    extra_info = extra_info or {}
    text = ground_truth.get("text") if isinstance(ground_truth, dict) else ground_truth
    request: dict[str, Any] = {"solution_str": solution_str, "ground_truth": "" if text is None else str(text)}
    if extra_info.get("language"):
        request["language"] = str(extra_info["language"])
    if extra_info.get("prompt_codes") is not None:
        request["prompt_codes"] = [int(c) for c in extra_info["prompt_codes"]]
    return request


def _load_reward(key: str, options: dict[str, Any]):
    with _rewards_lock:
        if key not in _rewards:
            from .pipeline import SpeechReward

            _rewards[key] = SpeechReward.from_spec(**options)
        return _rewards[key]


async def _score_in_process(request: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    missing = [k for k in ("codec", "asr") if k not in options]
    if missing:
        raise ValueError(
            f"reward_kwargs lack {missing}: set server_url for the reward server, or codec and asr to score in process"
        )
    batch = {k: options.pop(k) for k in _BATCH_KEYS if k in options}
    key = json.dumps(options, sort_keys=True, default=str)
    if key not in _batchers:
        reward = await asyncio.to_thread(_load_reward, key, options)
        _batchers.setdefault(
            key,
            DynamicBatcher(
                reward.score_batch,
                max_batch=int(batch.get("max_batch", 64)),
                max_wait_s=float(batch.get("max_wait_ms", 20)) / 1000,
            ),
        )
    return await _batchers[key].submit(request)


async def _score_remote(request: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    key, loop = json.dumps(options, sort_keys=True, default=str), asyncio.get_running_loop()
    if key not in _clients or _clients[key][0] is not loop:
        client = RewardClient(
            str(options["server_url"]),
            timeout_s=float(options.get("client_timeout_s", 600)),
            retries=int(options.get("client_retries", 3)),
            backoff_s=float(options.get("client_backoff_s", 1.0)),
        )
        _clients[key] = (loop, client)
    return await _clients[key][1].score(request)


async def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, **reward_kwargs
) -> dict[str, Any]:
    """Score one Llasa response: veRL's dict form, ``score`` plus the ``speech_*`` components (see `pipeline`)."""
    options = {k: _plain(v) for k, v in reward_kwargs.items() if k not in _VERL_KEYS}
    unknown = sorted(set(options) - _IN_PROCESS_KEYS - _BATCH_KEYS - _CLIENT_KEYS)
    if unknown:
        valid = sorted(_IN_PROCESS_KEYS | _BATCH_KEYS | _CLIENT_KEYS)
        raise ValueError(f"unknown reward_kwargs {unknown}; valid: {valid}")
    request = build_request(solution_str, ground_truth, extra_info)
    if options.get("server_url"):
        return await _score_remote(request, {k: v for k, v in options.items() if k in _CLIENT_KEYS})
    return await _score_in_process(request, {k: v for k, v in options.items() if k not in _CLIENT_KEYS})
