"""The ``hf`` rollout backend: a token-in/token-out server on a ``transformers`` model serving the policy's weights.

veRL 0.9.1 registers vllm/sglang/trtllm rollouts only, all GPU servers. This backend plugs into the same three
surfaces, so veRL's agent loop, server manager and checkpoint engine drive it unchanged:

- `HFRolloutServer`: a Ray actor holding a ``transformers`` copy of the policy. ``generate(prompt_ids,
  sampling_params)`` samples one response (`maspo_verl.cpu.generation.generate_responses`, stopping at the
  checkpoint's stop ids, `maspo_base.speech_tokens.llasa_generation.stop_ids`) and returns its token ids with their
  log-probs under the sampling temperature, ``log softmax(z_t / T)[y_t]`` -- what the actor recomputes, so veRL's
  rollout/actor log-prob gap metrics stay meaningful. Concurrent requests with the same sampling parameters are
  generated together, as one left-padded batch (dynamic batching, `HFRolloutServer` says how); each request samples
  from its own random stream (`maspo_verl.cpu.sampling_streams`), so its tokens do not depend on the batch it
  shared.
- `HFReplica` (``RolloutReplicaRegistry`` name ``hf``): launches one server per replica.
- `HFServerAdapter` (``get_rollout_class("hf", "async")``): lives in the actor worker; veRL's ``naive``
  checkpoint engine hands it the trained weights after every update, and it loads them into the server.

Hybrid mode (``actor_rollout_ref.hybrid_engine=True``, veRL's default) with one rollout rank per replica
(tensor/data/pipeline parallel size 1) is what it supports; anything else fails at start with the key to change.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray
import torch
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput

from maspo_base.speech_tokens.llasa_generation import checkpoint_stop_ids
from maspo_verl.cpu.generation import SamplingKey, generate_responses, pad_id
from maspo_verl.cpu.sampling_streams import RequestStreams

ROLLOUT_THREADS_ENV = "MASPO_VERL_CPU_ROLLOUT_THREADS"
"""torch threads of the ``hf`` rollout server (default 1; `maspo_lab.runs.cpu_overrides.cpu_environment`)."""

logger = logging.getLogger(__name__)

BACKEND = "hf"


def _rollout_world_size(config: Any) -> int:
    return config.tensor_model_parallel_size * config.data_parallel_size * config.pipeline_model_parallel_size


def _check_single_rank(config: Any) -> None:
    sizes = {
        "actor_rollout_ref.rollout.tensor_model_parallel_size": config.tensor_model_parallel_size,
        "actor_rollout_ref.rollout.data_parallel_size": config.data_parallel_size,
        "actor_rollout_ref.rollout.pipeline_model_parallel_size": config.pipeline_model_parallel_size,
    }
    wrong = {key: value for key, value in sizes.items() if value != 1}
    if wrong:
        raise ValueError(
            f"rollout.name={BACKEND} runs one process per replica; set {', '.join(f'{k}=1' for k in wrong)} "
            f"(got {wrong})"
        )


def _model_path(model_config: Any) -> str:
    get = (
        model_config.get
        if hasattr(model_config, "get")
        else lambda key, default=None: getattr(model_config, key, default)
    )
    return get("local_path", None) or get("path")


MAX_BATCH_ENV = "MASPO_VERL_CPU_ROLLOUT_MAX_BATCH"
BATCH_WINDOW_ENV = "MASPO_VERL_CPU_ROLLOUT_BATCH_WINDOW_MS"
DEFAULT_MAX_BATCH = 64
DEFAULT_BATCH_WINDOW_MS = 50.0
MAX_BATCH_WAIT_S = 2.0
"""The longest an idle server waits for more requests before starting a batch, however they trickle in."""


def _finite(sampling_params: dict[str, Any], key: str, default: float) -> float:
    value = float(sampling_params.get(key, default))
    if not math.isfinite(value):
        raise ValueError(f"rollout.name={BACKEND}: sampling_params[{key!r}] must be finite, got {value}")
    return value


def sampling_key(
    sampling_params: dict[str, Any], prompt_len: int, response_length: int, max_model_len: int
) -> SamplingKey:
    """The request's `SamplingKey`; bad values fail here, for this request only.

    ``max_new_tokens`` = min(``response_length``, ``max_tokens``/``max_new_tokens`` if given, room left in
    ``max_model_len`` after the prompt), at least 1.
    """
    temperature = _finite(sampling_params, "temperature", 1.0)
    top_p = _finite(sampling_params, "top_p", 1.0)
    top_k = int(sampling_params.get("top_k", -1) or -1)
    repetition_penalty = _finite(sampling_params, "repetition_penalty", 1.0)
    if temperature < 0:
        raise ValueError(
            f"rollout.name={BACKEND}: sampling_params['temperature'] must be >= 0 (0 = greedy), got {temperature}"
        )
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"rollout.name={BACKEND}: sampling_params['top_p'] must be in (0, 1], got {top_p}")
    if repetition_penalty <= 0:
        raise ValueError(
            f"rollout.name={BACKEND}: sampling_params['repetition_penalty'] must be > 0 (1 = off), "
            f"got {repetition_penalty}"
        )
    budget = min(response_length, max_model_len - prompt_len)
    for key in ("max_tokens", "max_new_tokens"):
        if key in sampling_params:
            budget = min(budget, int(sampling_params[key]))
    if temperature == 0:
        top_p, top_k = 1.0, 0
    return SamplingKey(temperature, top_p, max(top_k, 0), repetition_penalty, max(1, budget))


@dataclass
class _Request:
    prompt_ids: list[int]
    key: SamplingKey
    result: asyncio.Future


class HFRolloutServer:
    """One replica's generation server (a Ray actor): `generate_responses` on batches of requests, weights on request.

    Dynamic batching: an idle server that receives a request waits until ``batch_window_ms`` pass without another
    (at most `MAX_BATCH_WAIT_S`), so that the requests veRL's agent loop sends one after the other for a step are
    generated together rather than in batches run one after the other; then the oldest waiting request's
    `SamplingKey` picks the batch, which takes every waiting request with that key, in arrival order, up to
    ``max_batch_size``. Requests arriving while a batch runs form the next one. A batch is
    left-padded with the model's pad id under an attention mask (HF derives positions from the mask), so each
    row's tokens are those of the row alone up to float rounding; a row that samples a stop id is returned to its
    caller at once (veRL's agent loop then sends it to the reward while the batch runs on), padded by HF from there,
    and cut at its first stop id. Weight updates wait for the running batch and the next batch waits for them.

    Reproducibility: a sampled request draws from its own stream (`maspo_verl.cpu.sampling_streams`), keyed by
    ``config.seed + replica_rank``, the weight version, its prompt and the number of earlier requests with the same
    prompt under these weights (counted as batches start, so a waiting request is keyed by the weights that serve
    it). Neither greedy nor sampled responses depend on the batching (up to float rounding of a padded batch), and
    the same prompts sent to the same weights get the same responses, for each prompt the same set whatever the
    order in which its requests arrived: at the first step every method of an ablation sees the same rollouts.

    Args:
        config: veRL's ``RolloutConfig`` (``response_length``, ``prompt_length``, ``seed`` are used).
        model_config: ``actor_rollout_ref.model`` (``path``, ``trust_remote_code``).
        replica_rank: seeds the sampling streams (``config.seed + replica_rank``).
        num_threads: torch threads of the server process.
        max_batch_size: most requests generated together (``MASPO_VERL_CPU_ROLLOUT_MAX_BATCH``, default 64).
        batch_window_ms: the quiet time after the last request before an idle server starts a batch
            (``MASPO_VERL_CPU_ROLLOUT_BATCH_WINDOW_MS``, default 50).
    """

    def __init__(
        self,
        config: Any,
        model_config: Any,
        replica_rank: int = 0,
        num_threads: int = 1,
        max_batch_size: int = DEFAULT_MAX_BATCH,
        batch_window_ms: float = DEFAULT_BATCH_WINDOW_MS,
    ) -> None:
        from transformers import AutoModelForCausalLM, GenerationConfig

        check_batching(max_batch_size=max_batch_size, batch_window_ms=batch_window_ms)
        torch.set_num_threads(num_threads)
        self.config = config
        self.replica_rank = replica_rank
        self.max_batch_size = max_batch_size
        self.batch_window_s = batch_window_ms / 1000.0
        path = _model_path(model_config)
        trust = bool(model_config.get("trust_remote_code", False)) if hasattr(model_config, "get") else False
        self.model = AutoModelForCausalLM.from_pretrained(
            # eager attention: a decoding step is one query over a few hundred cached positions, where sdpa's CPU
            # kernel costs more
            path,
            dtype=torch.float32,
            attn_implementation="eager",
            trust_remote_code=trust,
        ).eval()
        generation_config = self.model.generation_config or GenerationConfig()
        try:
            self.stop_ids = checkpoint_stop_ids(path, generation_config, trust_remote_code=trust)
        except ValueError as error:
            raise ValueError(f"model at {path}: {error}") from None
        self.pad_id = pad_id(generation_config, self.stop_ids)
        self.seed = int(getattr(config, "seed", 0)) + replica_rank
        self.global_steps: int | None = None
        self.weight_version = 0
        self._streams = RequestStreams(self.seed, self.weight_version)  # requests per prompt under these weights
        self._lock = asyncio.Lock()
        self._waiting: list[_Request] = []
        self._batcher: asyncio.Task | None = None
        self.batch_sizes: deque[int] = deque(maxlen=4096)  # of the batches generated so far (the latest 4096)

    async def ready(self) -> bool:
        return True

    def next_stream(self, prompt_ids: list[int]) -> int:
        """The stream of a new request for ``prompt_ids`` (`request_stream`), counting it under the current weights."""
        return self._streams.next(prompt_ids)

    def generate_batch(
        self,
        prompts: list[list[int]],
        key: SamplingKey,
        streams: list[int],
        on_finished: Callable[[int, list[int], list[float]], None] | None = None,
    ) -> list[tuple[list[int], list[float]]]:
        """`generate_responses` with the served model."""
        return generate_responses(self.model, prompts, key, streams, self.stop_ids, self.pad_id, on_finished)

    def _next_batch(self) -> list[_Request]:
        """The oldest waiting request and those waiting with its key, in arrival order, up to the cap."""
        key = self._waiting[0].key
        batch = [r for r in self._waiting if r.key == key][: self.max_batch_size]
        taken = {id(r) for r in batch}
        self._waiting = [r for r in self._waiting if id(r) not in taken]
        return batch

    async def _run_batches(self) -> None:
        deadline = asyncio.get_running_loop().time() + MAX_BATCH_WAIT_S
        seen = -1
        while len(self._waiting) != seen and asyncio.get_running_loop().time() < deadline:
            seen = len(self._waiting)
            await asyncio.sleep(self.batch_window_s)
        while self._waiting:
            async with self._lock:
                batch = self._next_batch()
                self.batch_sizes.append(len(batch))
                streams = [self.next_stream(r.prompt_ids) for r in batch]  # under the weights that will serve them
                loop = asyncio.get_running_loop()

                def hand_on(row: int, token_ids: list[int], log_probs: list[float], batch=batch, loop=loop) -> None:
                    # a response that has ended goes to its caller (and on to the reward) while the batch runs on
                    loop.call_soon_threadsafe(_resolve, batch[row].result, (token_ids, log_probs))

                try:
                    results = await asyncio.to_thread(
                        self.generate_batch, [r.prompt_ids for r in batch], batch[0].key, streams, hand_on
                    )
                except Exception as error:  # every request of the batch gets the error
                    for request in batch:
                        if not request.result.done():
                            request.result.set_exception(error)
                else:
                    for request, result in zip(batch, results, strict=True):
                        if not request.result.done():
                            request.result.set_result(result)

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str | None = None,
        image_data: Any = None,
        video_data: Any = None,
        **kwargs: Any,
    ) -> TokenOutput:
        if image_data is not None or video_data is not None or kwargs.get("audio_data") is not None:
            raise NotImplementedError(f"rollout.name={BACKEND} generates from token ids only (no multi-modal input)")
        prompt_ids = list(prompt_ids)
        if not prompt_ids:
            raise ValueError(f"rollout.name={BACKEND}: prompt_ids is empty")
        key = sampling_key(
            sampling_params,
            len(prompt_ids),
            self.config.response_length,
            self.config.prompt_length + self.config.response_length,
        )
        request = _Request(prompt_ids, key, asyncio.get_running_loop().create_future())
        self._waiting.append(request)
        if self._batcher is None or self._batcher.done():
            self._batcher = asyncio.create_task(self._run_batches())
        token_ids, log_probs = await request.result
        stopped = bool(token_ids) and token_ids[-1] in self.stop_ids
        return TokenOutput(
            token_ids=token_ids,
            log_probs=log_probs,
            stop_reason="completed" if stopped else None,
            extra_fields={"global_steps": self.global_steps, "weight_version": self.weight_version},
        )

    async def update_weights(self, state: dict[str, torch.Tensor], global_steps: int | None = None) -> int:
        """Load ``state`` (HF parameter names, full tensors) into the served model; returns the new weight version.

        The sampling streams are keyed by the trainer's step when it comes with the weights (``global_steps + 1``,
        which is the load count of a run that started at step 0), so a run resumed from a checkpoint draws what the
        uninterrupted run drew, evaluations included; without it, by the load count.
        """
        async with self._lock:
            params = dict(self.model.named_parameters(remove_duplicate=False))
            unknown = sorted(set(state) - set(params))
            if unknown:
                raise KeyError(f"rollout.name={BACKEND}: weights the served model does not have: {unknown[:5]}")
            with torch.no_grad():
                for name, tensor in state.items():
                    params[name].copy_(tensor.to(params[name].dtype))
            self.weight_version += 1
            stream_version = self.weight_version if global_steps is None else global_steps + 1
            if stream_version != self._streams.weight_version:
                self._streams = RequestStreams(self.seed, stream_version)
            return self.weight_version

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    async def get_weight_version(self) -> int:
        return self.weight_version

    # Memory management and request control: weights and caches stay in host memory and requests are never
    # parked, so these are no-ops kept for veRL's replica interface.
    async def wake_up(self, tags: list[str] | None = None) -> None:
        return None

    async def sleep(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def abort_all_requests(self, reject_request: bool = False, **kwargs: Any) -> dict[str, Any]:
        return {"aborted_count": 0, "request_ids": []}

    async def resume_generation(self) -> None:
        return None

    async def start_profile(self, **kwargs: Any) -> None:
        return None

    async def stop_profile(self) -> None:
        return None


def _resolve(future: asyncio.Future, result: Any) -> None:
    if not future.done():
        future.set_result(result)


def server_name(replica_rank: int, suffix: str = "", role: str = "") -> str:
    """Ray actor name of a replica's server; the adapter in the actor worker finds it by this name."""
    return f"{BACKEND}_server_{role}{replica_rank}_0{suffix}"


_BATCHING = {
    "max_batch_size": (MAX_BATCH_ENV, int, 1, "an integer >= 1"),
    "batch_window_ms": (BATCH_WINDOW_ENV, float, 0, "a finite number of milliseconds >= 0"),
}
"""`HFRolloutServer`'s batching arguments: environment variable, type, smallest value, what is valid."""


def check_batching(**settings: float) -> None:
    """Raise ``ValueError`` naming the environment variable (and argument) of a batching setting out of range."""
    for arg, value in settings.items():
        name, _, smallest, valid = _BATCHING[arg]
        if not (math.isfinite(value) and value >= smallest):
            raise ValueError(f"{name} ({arg}) must be {valid}, got {value!r}")


def batching_from_env(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """``max_batch_size`` and ``batch_window_ms`` of `HFRolloutServer` from ``MASPO_VERL_CPU_ROLLOUT_MAX_BATCH``
    and ``MASPO_VERL_CPU_ROLLOUT_BATCH_WINDOW_MS`` (unset: the defaults, 64 and 50 ms), checked (`check_batching`)."""
    environ = os.environ if environ is None else environ
    settings: dict[str, Any] = {}
    for arg, (name, parse, _, valid) in _BATCHING.items():
        if name not in environ:
            continue
        try:
            settings[arg] = parse(environ[name])
        except ValueError:
            raise ValueError(f"{name} ({arg}) must be {valid}, got {environ[name]!r}") from None
    check_batching(**settings)
    return settings


class HFReplica(RolloutReplica):
    """One `HFRolloutServer` per replica, on the node of the replica's first worker, reserving no resources."""

    async def launch_servers(self) -> None:
        _check_single_rank(self.config)
        role = "reward_" if self.is_reward_model else "teacher_" if self.is_teacher_model else ""
        name = server_name(self.replica_rank, self.name_suffix, role)
        threads = int(os.environ.get(ROLLOUT_THREADS_ENV, "1"))
        server = (
            ray.remote(HFRolloutServer)
            .options(name=name, num_cpus=0, max_concurrency=self.max_concurrency)
            .remote(
                config=self.config,
                model_config=self.model_config,
                replica_rank=self.replica_rank,
                num_threads=threads,
                **batching_from_env(),
            )
        )
        await server.ready.remote()
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"{BACKEND}://{name}"

    async def init_standalone(self) -> None:
        raise NotImplementedError(
            f"rollout.name={BACKEND} runs in hybrid mode only: keep actor_rollout_ref.hybrid_engine=True"
        )

    async def init_colocated(self, resource_pool: Any) -> None:
        raise NotImplementedError(
            f"rollout.name={BACKEND} runs in hybrid mode only: keep actor_rollout_ref.hybrid_engine=True"
        )


class HFServerAdapter(BaseRollout):
    """The actor worker's handle on its replica's server: takes the trained weights from the checkpoint engine.

    veRL's ``naive`` checkpoint engine calls ``update_weights`` with a generator of ``(name, full tensor)``
    after every actor update; the tensors are copied to host memory and loaded into the server in one call.
    """

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1) -> None:
        super().__init__(config, model_config, device_mesh)
        _check_single_rank(self.config)
        rank = int(os.environ.get("RANK", "0"))
        world = _rollout_world_size(self.config)
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.rollout_rank = rank % world
        self.is_leader_rank = self.rollout_rank == 0
        self.server_handle = None

    def _server(self):
        if self.server_handle is None:
            # the server is launched after the hybrid engine: look it up on first use
            self.server_handle = ray.get_actor(server_name(self.replica_rank))
        return self.server_handle

    async def resume(self, tags: list[str]) -> None:
        return None

    async def release(self) -> None:
        return None

    async def update_weights(
        self, weights, wire_format: str = "named_tensors", global_steps: int | None = None, **kwargs
    ):
        if wire_format != "named_tensors":
            raise NotImplementedError(
                f"rollout.name={BACKEND} takes full tensors: "
                "use actor_rollout_ref.rollout.checkpoint_engine.backend=naive"
            )
        from verl.workers.rollout.utils import ensure_async_iterator

        state = {}
        async for name, tensor in ensure_async_iterator(weights):
            if hasattr(tensor, "full_tensor"):
                tensor = tensor.full_tensor()
            state[name] = tensor.detach().to("cpu", copy=True)
        if not self.is_leader_rank:
            return
        server = self._server()
        await server.update_weights.remote(state, global_steps)
        if global_steps is not None:
            await server.set_global_steps.remote(global_steps)


def _load_replica() -> type[RolloutReplica]:
    return HFReplica


def register() -> None:
    """Register ``hf`` in veRL's rollout-class and replica registries."""
    from verl.workers.rollout import base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    base._ROLLOUT_REGISTRY[(BACKEND, "async")] = f"{__name__}.HFServerAdapter"
    RolloutReplicaRegistry.register(BACKEND, _load_replica)
