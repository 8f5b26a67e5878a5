"""The ``hf`` rollout backend: a token-in/token-out server on HF ``generate`` that serves the policy's current weights.

veRL 0.9.1 registers vllm/sglang/trtllm rollouts only, all GPU servers. This backend plugs into the same three
surfaces, so veRL's agent loop, server manager and checkpoint engine drive it unchanged:

- `HFRolloutServer`: a Ray actor holding a ``transformers`` copy of the policy. ``generate(prompt_ids,
  sampling_params)`` samples one response with ``model.generate`` (stopping at the model's
  ``generation_config.eos_token_id``) and returns its token ids with their log-probs under the sampling
  temperature, ``log softmax(z_t / T)[y_t]`` -- what the actor recomputes, so veRL's rollout/actor log-prob gap
  metrics stay meaningful.
- `HFReplica` (``RolloutReplicaRegistry`` name ``hf``): launches one server per replica.
- `HFServerAdapter` (``get_rollout_class("hf", "async")``): lives in the actor worker; veRL's ``naive``
  checkpoint engine hands it the trained weights after every update, and it loads them into the server.

Hybrid mode (``actor_rollout_ref.hybrid_engine=True``, veRL's default) with one rollout rank per replica
(tensor/data/pipeline parallel size 1) is what it supports; anything else fails at start with the key to change.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import ray
import torch
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput

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


class HFRolloutServer:
    """One replica's generation server (a Ray actor): HF ``generate``, one request at a time, weights on request.

    Args:
        config: veRL's ``RolloutConfig`` (``response_length``, ``prompt_length``, ``seed`` are used).
        model_config: ``actor_rollout_ref.model`` (``path``, ``trust_remote_code``).
        replica_rank: seeds the sampler (``config.seed + replica_rank``).
    """

    def __init__(self, config: Any, model_config: Any, replica_rank: int = 0, num_threads: int = 1) -> None:
        from transformers import AutoModelForCausalLM, GenerationConfig

        torch.set_num_threads(num_threads)
        self.config = config
        self.replica_rank = replica_rank
        path = _model_path(model_config)
        trust = bool(model_config.get("trust_remote_code", False)) if hasattr(model_config, "get") else False
        self.model = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, attn_implementation="sdpa", trust_remote_code=trust
        ).eval()
        generation_config = self.model.generation_config or GenerationConfig()
        eos = generation_config.eos_token_id
        self.stop_ids = [eos] if isinstance(eos, int) else list(eos or [])
        if not self.stop_ids:
            raise ValueError(f"model at {path} has no generation_config.eos_token_id: the rollout would never stop")
        self.pad_id = generation_config.pad_token_id if generation_config.pad_token_id is not None else self.stop_ids[0]
        self.generator = torch.Generator().manual_seed(int(getattr(config, "seed", 0)) + replica_rank)
        self.global_steps: int | None = None
        self.weight_version = 0
        self._lock = asyncio.Lock()

    async def ready(self) -> bool:
        return True

    def _max_new_tokens(self, prompt_len: int, sampling_params: dict[str, Any]) -> int:
        budget = self.config.response_length
        for key in ("max_tokens", "max_new_tokens"):
            if key in sampling_params:
                budget = min(budget, int(sampling_params.pop(key)))
        budget = min(budget, self.config.prompt_length + self.config.response_length - prompt_len)
        return max(1, budget)

    @torch.no_grad()
    def _generate(self, prompt_ids: list[int], sampling_params: dict[str, Any]) -> tuple[list[int], list[float]]:
        params = dict(sampling_params)
        max_new = self._max_new_tokens(len(prompt_ids), params)
        temperature = float(params.get("temperature", 1.0))
        top_k = int(params.get("top_k", -1) or -1)
        top_p = float(params.get("top_p", 1.0))
        do_sample = temperature > 0
        kwargs: dict[str, Any] = {"do_sample": do_sample}
        if do_sample:
            kwargs.update(temperature=temperature, top_p=top_p, top_k=top_k if top_k > 0 else 0)
        repetition_penalty = float(params.get("repetition_penalty", 1.0))
        if repetition_penalty != 1.0:
            kwargs["repetition_penalty"] = repetition_penalty
        input_ids = torch.tensor([prompt_ids], dtype=torch.long)
        # HF generate samples from the global RNG; swap in this server's generator state for reproducibility.
        state = torch.get_rng_state()
        torch.set_rng_state(self.generator.get_state())
        try:
            out = self.model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=max_new,
                eos_token_id=self.stop_ids,
                pad_token_id=self.pad_id,
                output_logits=True,
                return_dict_in_generate=True,
                **kwargs,
            )
            self.generator.set_state(torch.get_rng_state())
        finally:
            torch.set_rng_state(state)
        response = out.sequences[0, len(prompt_ids) :]
        logits = torch.stack(out.logits, dim=1)[0, : response.numel()].float()
        # log-probs the actor recomputes: log softmax(z / T) at the sampled token (T = 1 when greedy)
        log_probs = torch.log_softmax(logits / (temperature if do_sample else 1.0), dim=-1)
        token_log_probs = log_probs.gather(-1, response[:, None]).squeeze(-1)
        return response.tolist(), token_log_probs.tolist()

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
        async with self._lock:
            token_ids, log_probs = await asyncio.to_thread(self._generate, list(prompt_ids), sampling_params)
        stopped = bool(token_ids) and token_ids[-1] in self.stop_ids
        return TokenOutput(
            token_ids=token_ids,
            log_probs=log_probs,
            stop_reason="completed" if stopped else None,
            extra_fields={"global_steps": self.global_steps, "weight_version": self.weight_version},
        )

    async def update_weights(self, state: dict[str, torch.Tensor]) -> int:
        """Load ``state`` (HF parameter names, full tensors) into the served model; returns the new weight version."""
        async with self._lock:
            params = dict(self.model.named_parameters(remove_duplicate=False))
            unknown = sorted(set(state) - set(params))
            if unknown:
                raise KeyError(f"rollout.name={BACKEND}: weights the served model does not have: {unknown[:5]}")
            with torch.no_grad():
                for name, tensor in state.items():
                    params[name].copy_(tensor.to(params[name].dtype))
            self.weight_version += 1
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


def server_name(replica_rank: int, suffix: str = "", role: str = "") -> str:
    """Ray actor name of a replica's server; the adapter in the actor worker finds it by this name."""
    return f"{BACKEND}_server_{role}{replica_rank}_0{suffix}"


class HFReplica(RolloutReplica):
    """One `HFRolloutServer` per replica, on the node of the replica's first worker, reserving no resources."""

    async def launch_servers(self) -> None:
        _check_single_rank(self.config)
        role = "reward_" if self.is_reward_model else "teacher_" if self.is_teacher_model else ""
        name = server_name(self.replica_rank, self.name_suffix, role)
        threads = int(os.environ.get("MASPO_VERL_CPU_ROLLOUT_THREADS", "1"))
        server = (
            ray.remote(HFRolloutServer)
            .options(name=name, num_cpus=0, max_concurrency=self.max_concurrency)
            .remote(
                config=self.config, model_config=self.model_config, replica_rank=self.replica_rank, num_threads=threads
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
        await server.update_weights.remote(state)
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
