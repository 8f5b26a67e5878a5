"""veRL's actor update on one device, without FSDP: what `tests/test_dynamic_micro_batches.py` and
`benchmarks/bench_step_at_size.py` run veRL's own worker and engine code through.

Only what needs an initialised FSDP module is stood in for: the engine's constructor (a plain module on one device;
its micro-batching, forward step, loss call, gradient clipping and optimizer step stay veRL's). veRL is imported
when the engine class is first asked for, so importing this module imports no veRL.
"""

from __future__ import annotations

import functools
import tempfile
from contextlib import contextmanager
from types import SimpleNamespace

import torch


@functools.cache
def single_device_engine_class() -> type:
    """``SingleDeviceEngine(module, autocast_dtype, lr=1e-6)``: veRL's ``FSDPEngineWithLMHead`` around a plain module.

    ``autocast_dtype`` is the forward's autocast (``torch.float32``: none, as veRL reads it). With
    ``record_gradients`` set, the optimizer step appends the mini-batch's gradient (one tensor per parameter) to
    ``gradients`` instead of stepping; ``input_shapes`` collects the shape of every micro-batch's ``input_ids``.
    """
    import verl.workers.engine.fsdp.transformer_impl as transformer_impl

    class SingleDeviceEngine(transformer_impl.FSDPEngineWithLMHead):
        def __init__(self, module, autocast_dtype: torch.dtype, lr: float = 1e-6):
            self.module = module
            self.ulysses_sequence_parallel_size, self.ulysses_device_mesh, self.use_ulysses_sp = 1, None, False
            self.pad_to_length = False
            self._autocast_dtype = autocast_dtype
            self._qat_enabled = False
            self.engine_config = SimpleNamespace(
                use_no_sync_for_gradient_accumulation=False, entropy_checkpointing=False
            )
            self.optimizer_config = SimpleNamespace(clip_grad=1.0)
            fused = next(module.parameters()).is_cuda
            self.optimizer = torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=0.01, fused=fused)
            self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: 1.0)
            self.record_gradients = False
            self.gradients: list[list[torch.Tensor]] = []
            self.input_shapes: list[tuple[int, ...]] = []

        def prepare_model_inputs(self, micro_batch):
            model_inputs, output_args = super().prepare_model_inputs(micro_batch)
            self.input_shapes.append(tuple(model_inputs["input_ids"].shape))
            return model_inputs, output_args

        def optimizer_step(self):
            if self.record_gradients:
                grads = [p.grad.detach().clone() for p in self.module.parameters() if p.grad is not None]
                self.gradients.append(grads)
                return 0.0
            return super().optimizer_step()

        def is_mp_src_rank_with_outputs(self):
            return True

        def get_data_parallel_rank(self):
            return 0

        def get_data_parallel_size(self):
            return 1

        @contextmanager
        def train_mode(self, **kwargs):
            self.module.train()
            yield

    return SingleDeviceEngine


def update_fields(mini_batch: int, temperature: float = 1.0) -> dict:
    """The non-tensor fields the legacy trainer's ``_update_actor`` sets on its batch: mini-batches of ``mini_batch``
    responses, one epoch, in order."""
    return dict(
        temperature=temperature,
        calculate_entropy=False,
        distillation_use_topk=False,
        distillation_only=False,
        global_batch_size=mini_batch,
        mini_batch_size=mini_batch,
        epochs=1,
        seed=1,
        dataloader_kwargs={"shuffle": False},
        compute_loss=True,
    )


@contextmanager
def verl_on_cpu():
    """veRL's device lookups pointed at the CPU (it falls back to "cuda" where no accelerator is found)."""
    import verl.utils.seqlen_balancing as seqlen_balancing
    import verl.workers.engine.fsdp.transformer_impl as transformer_impl

    lookups = [
        (transformer_impl, "get_device_name"),
        (seqlen_balancing, "get_device_name"),
        (transformer_impl, "get_device_id"),
    ]
    saved = [(module, name, getattr(module, name)) for module, name in lookups]
    for module, name, _ in saved:
        setattr(module, name, lambda: "cpu")
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


@contextmanager
def single_process_group(device_type: str = "cpu"):
    """A one-rank process group (gloo, with nccl for cuda tensors), as the engine all-reduces token counts over its
    data-parallel group; an existing group is used as it is."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    with tempfile.TemporaryDirectory() as folder:
        backend = "cpu:gloo,cuda:nccl" if device_type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=f"file://{folder}/store", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()
