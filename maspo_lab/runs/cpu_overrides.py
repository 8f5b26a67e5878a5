"""The Hydra overrides veRL 0.9.1's trainer needs on a CPU-only machine, next to ``MASPO_VERL_CPU=1``.

``install()`` (this package) changes veRL's code paths; these settings change its configuration. Each line says
what it avoids:
"""

from __future__ import annotations

CPU_SHORTCUTS: tuple[str, ...] = (
    # packed sequences (veRL's remove-padding path: one row, sequences kept apart by their position ids, which
    # transformers' sdpa attention honours on CPU too) and activation checkpointing run on CPU. The demo keeps
    # padding, with which the actor computes logits at the response positions only (`maspo_verl.cpu.response_logits`;
    # the demo's figures were measured so; packed, one smoke-sized mini-batch took about as long), and skips the
    # recomputation: the tiny model's activations fit in memory
    "actor_rollout_ref.model.use_remove_padding=False",
    "actor_rollout_ref.model.enable_gradient_checkpointing=False",
)
"""Settings CPU does not need, taken by the demo and recipes/cpu_smoke: ``overrides`` includes them, ``overrides
needed`` leaves them out (the Llasa-1B recipe's CPU smoke keeps the recipe's own)."""

CPU_NEEDS: tuple[str, ...] = (
    "trainer.device=cpu",
    "trainer.nnodes=1",
    "trainer.n_gpus_per_node=1",
    # the `hf` rollout (maspo_verl.cpu.hf_rollout): one process, weights through the naive checkpoint engine
    "actor_rollout_ref.rollout.name=hf",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=naive",
    "actor_rollout_ref.rollout.agent.num_workers=1",
    # FSDP1 insists on an accelerator when it syncs module states; FSDP2 runs on CPU
    "actor_rollout_ref.actor.strategy=fsdp2",
    # FlashAttention 2 is the default and needs CUDA
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    # torch.compile buys nothing on CPU
    "actor_rollout_ref.actor.use_torch_compile=False",
    "actor_rollout_ref.actor.fsdp_config.use_torch_compile=False",
    # fp32 compute: FSDP's default mixed precision (bf16 params under CPU autocast) runs matmuls through torch's
    # scalar bf16 fallback on CPUs without bf16 units (docs/cpu-trainer.md: what it costs the tiny Llasa), and bf16
    # actor log-probs stray from the fp32 rollout's (veRL's rollout/actor gap metrics would measure bf16 rounding)
    "actor_rollout_ref.actor.fsdp_config.dtype=float32",
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
    "+actor_rollout_ref.ref.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
    # few CPUs: one worker process each, no data-loader processes, no wandb
    "reward.num_workers=1",
    "data.dataloader_num_workers=0",
    "trainer.logger=[console]",
    # the default (v1) trainer's transfer queue starts 8 storage actors by default; one holds a CPU run's data
    "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    # veRL asks Ray for the resource named "GPU": a logical one, plus logical CPUs for its many small actors
    "+ray_kwargs.ray_init.num_gpus=1",
    "ray_kwargs.ray_init.num_cpus=16",
    "+ray_kwargs.ray_init.include_dashboard=False",
)
"""What veRL's trainer needs on a CPU-only machine, or what it cannot do there at a bearable cost (bf16)."""

CPU_OVERRIDES: tuple[str, ...] = CPU_NEEDS + CPU_SHORTCUTS
"""Overrides for ``python -m verl.trainer.main_ppo`` on CPU (add `ray_temp_dir_override` for a short Ray dir)."""

RAY_GCS_WAIT_ENV = "RAY_gcs_server_port_wait_time_s"
"""Seconds ``ray.init`` waits for its GCS server to write its port (Ray 2.60: 30). On 2 cores under the test suite's
load, 30 s ran out (``Timed out waiting for file .../gcs_server_port_...``); 120 is what Ray itself allows a slow
RocksDB-backed GCS."""

ENV: dict[str, str] = {
    "MASPO_VERL_CPU": "1",
    "VERL_PLATFORM": "cpu",
    "HF_HUB_OFFLINE": "1",
    "WANDB_MODE": "disabled",
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_DEDUP_LOGS": "0",
    RAY_GCS_WAIT_ENV: "120",
}
"""Environment of a CPU run: the switch, the platform, no hub, no wandb, Ray's patience on a loaded machine
(`cpu_environment` adds the threads)."""


def threads_per_run(runs_at_a_time: int = 1) -> int:
    """The cores each of ``runs_at_a_time`` runs side by side has to itself (at least 1)."""
    import os

    return max(1, (os.cpu_count() or 1) // max(1, runs_at_a_time))


def cpu_environment(threads: int = 1) -> dict[str, str]:
    """`ENV` with a run's share of the cores: ``threads`` torch/OpenMP threads per process (the actor, whose phases
    run alone, and the reward), one for the rollout server.

    The rollout generates while the reward hears the responses that have ended (`maspo_verl.cpu.hf_rollout`), so
    the two share the cores; a decoding step of a small model gains little from a second thread. Give a run
    ``threads`` = the cores it has to itself: runs side by side (``ablate --jobs``) take one each, since OpenMP
    threads spin-wait for each other on oversubscribed cores (docs/benchmarks.md has the step's figures for each
    setting)."""
    if threads < 1:
        raise ValueError(f"threads={threads} must be >= 1")
    from maspo_verl.cpu.hf_rollout import ROLLOUT_THREADS_ENV

    return {**ENV, "OMP_NUM_THREADS": str(threads), ROLLOUT_THREADS_ENV: "1"}


def ray_temp_dir_override(path: str) -> str:
    """``+ray_kwargs.ray_init._temp_dir=<path>``. Ray's socket paths must stay under 108 bytes: keep ``path``
    short (e.g. ``/tmp/ray_<id>``)."""
    if len(path) > 40:
        raise ValueError(
            f"Ray temp dir {path!r} is {len(path)} characters; keep it under 40 (socket paths < 108 bytes)"
        )
    return f"+ray_kwargs.ray_init._temp_dir={path}"
