"""``use_dynamic_bsz`` (veRL regroups a mini-batch's rows into micro-batches by token count) and
``use_remove_padding`` (each micro-batch one packed row): MASPO's update, loss and metrics per mini-batch are those of
fixed, padded micro-batches, and the token ids reaching the loss are the rows'. The Llasa-1B recipe sets both.

The actor update runs veRL 0.9.1's own code from the worker down: ``TrainingWorker.train_mini_batch`` and
``train_batch`` (the plugin's subclass), the FSDP engine's ``forward_backward_batch`` and ``forward_step``
(``prepare_micro_batches``, ``rearrange_micro_batches``, the model's forward, ``prepare_model_outputs``, veRL's
metric aggregation) and ``ppo_loss`` (the plugin's wrapper), on a real (tiny, float64) Llama in one process. Only
what needs an initialised FSDP module is stood in for: the engine's constructor
(`maspo_lab.single_device_actor`, shared with `benchmarks/bench_step_at_size.py`) and the optimizer step, which
records the gradients instead. veRL's device lookups are pointed at the CPU.
"""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import pytest
import torch
import verl.trainer.ppo.core_algos as core_algos
import verl.workers.engine_workers as engine_workers
from loss_helpers import actor_config
from tensordict import TensorDict
from transformers import LlamaConfig, LlamaForCausalLM
from verl.utils import tensordict_utils as tu
from verl.utils.profiler import DistProfiler
from verl.workers.utils.padding import left_right_2_no_padding

from maspo_lab.single_device_actor import single_device_engine_class, single_process_group, update_fields, verl_on_cpu
from maspo_verl.config import maspo_settings
from maspo_verl.loss import METRIC_PREFIX, compute_policy_loss_maspo
from maspo_verl.loss_inputs import current_loss_inputs

VOCAB, CODEC_OFFSET = 64, 8
"""Ids 1-7 are text tokens, 8-63 codec ids (``maspo.codec``), 0 pads."""
ROWS, MINI_BATCH, MICRO_BATCH = 12, 6, 2
MAX_TOKENS_PER_MICRO_BATCH = 24
"""``ppo_max_token_len_per_gpu``: rows of 4 to 22 tokens make micro-batches of one to four rows."""
SEGMENTER = {"name": "token_jump", "threshold": 6}
CODEC = {"offset": CODEC_OFFSET, "codebook_size": VOCAB - CODEC_OFFSET}


def fingerprint(response_ids: torch.Tensor) -> torch.Tensor:
    """The rollout log-prob the batch gives token t of a response: a function of its id and position only, so the
    loss can tell whether the ids it was handed belong to the row of its ``old_log_probs``."""
    positions = torch.arange(response_ids.shape[-1], dtype=torch.float64)
    return -3.9 + 0.6 * torch.sin(1.7 * response_ids.double() + 0.3 * positions)


def rollout_batch() -> dict[str, torch.Tensor]:
    """Left-padded prompts, right-padded responses of ragged lengths (one of length 1), codec runs with jumps."""
    generator = torch.Generator().manual_seed(0)
    prompt_lengths = torch.randint(2, 7, (ROWS,), generator=generator)
    response_lengths = torch.randint(1, 17, (ROWS,), generator=generator)
    response_lengths[0], response_lengths[1] = 16, 1
    prompt_width, response_width = 6, 16
    prompt_mask = (torch.arange(prompt_width) >= prompt_width - prompt_lengths[:, None]).long()
    response_mask = (torch.arange(response_width) < response_lengths[:, None]).long()
    prompts = torch.randint(1, CODEC_OFFSET, (ROWS, prompt_width), generator=generator) * prompt_mask
    # codec runs: each token repeats the previous one or jumps anywhere in the codebook; a text token here and there
    jumps = torch.rand(ROWS, response_width, generator=generator) < 0.4
    codes = torch.randint(CODEC_OFFSET, VOCAB, (ROWS, response_width), generator=generator)
    for t in range(1, response_width):
        codes[:, t] = torch.where(jumps[:, t], codes[:, t], codes[:, t - 1])
    text = torch.rand(ROWS, response_width, generator=generator) < 0.1
    responses = torch.where(text, torch.randint(1, CODEC_OFFSET, codes.shape, generator=generator), codes)
    responses = responses * response_mask
    advantages = torch.randn(ROWS, 1, generator=generator, dtype=torch.float64).expand(-1, response_width)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    return {
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(dim=1) - 1).clamp(min=0),
        "prompts": prompts,
        "responses": responses,
        "response_mask": response_mask.double(),
        "old_log_probs": fingerprint(responses) * response_mask,
        "advantages": advantages * response_mask,
    }


def legacy_layout(batch):
    """What the legacy trainer's ``_update_actor`` hands the worker: veRL's own ``left_right_2_no_padding``."""
    return left_right_2_no_padding(TensorDict(dict(batch), batch_size=[ROWS]))


def v1_layout(batch):
    """What the v1 trainer hands the worker: every per-token field nested to each row's own length."""
    prompt_valid = batch["attention_mask"][:, : batch["prompts"].shape[1]].bool()
    response_valid = batch["response_mask"].bool()

    def nested(rows):
        return torch.nested.as_nested_tensor(rows, layout=torch.jagged)

    valid = batch["attention_mask"].bool()
    fields = {
        "input_ids": nested([ids[v] for ids, v in zip(batch["input_ids"], valid)]),
        "position_ids": nested([ids[v] for ids, v in zip(batch["position_ids"], valid)]),
        "prompts": nested([ids[v] for ids, v in zip(batch["prompts"], prompt_valid)]),
    }
    for name in ("responses", "response_mask", "old_log_probs", "advantages"):
        fields[name] = nested([values[v] for values, v in zip(batch[name], response_valid)])
    fields["loss_mask"] = fields["response_mask"]
    return TensorDict(fields, batch_size=[ROWS])


@pytest.fixture(scope="module")
def process_group():
    with single_process_group():
        yield


@pytest.fixture
def on_cpu(monkeypatch, process_group):
    """veRL's device lookups pointed at the CPU, and one torch thread: on a model this small, several only wait for
    each other (4x slower here, as `maspo_lab.runs.cpu_overrides.cpu_environment` notes for the trainer)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with verl_on_cpu():
        yield
    torch.set_num_threads(threads)


@pytest.fixture
def loss_calls(monkeypatch):
    """Every MASPO loss call, checked on entry: the token ids handed to it are its rows' (their padding is the
    response mask's, and the rollout log-probs are those rows' fingerprints)."""
    calls = []

    def checked_loss(old_log_prob, log_prob, advantages, response_mask, **kwargs):
        ids = current_loss_inputs().response_ids
        mask = response_mask.bool()
        assert ids is not None and ids.shape == mask.shape
        assert torch.equal(ids != 0, mask), "token ids padded unlike the response mask: rows permuted"
        torch.testing.assert_close(old_log_prob * mask, fingerprint(ids) * mask, rtol=0, atol=1e-12)
        loss, metrics = compute_policy_loss_maspo(old_log_prob, log_prob, advantages, response_mask, **kwargs)
        segments = maspo_settings(kwargs["config"].policy_loss).segment_layout(old_log_prob, mask, ids).num_segments
        calls.append(
            {
                "rows": old_log_prob.sum(dim=-1).tolist(),
                "tokens": int(mask.sum()),
                "segments": segments,
                "metrics": metrics,
            }
        )
        return loss, metrics

    monkeypatch.setitem(core_algos.POLICY_LOSS_REGISTRY, "maspo", checked_loss)
    return calls


def update(layout, agg, dynamic, packed=False):
    """One actor update of the rollout batch (two mini-batches of six rows) through veRL's worker."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    engine = single_device_engine_class()(LlamaForCausalLM(config).double(), autocast_dtype=torch.float32)
    engine.record_gradients = True  # the optimizer step records each mini-batch's gradient instead of stepping
    worker = object.__new__(engine_workers.ActorRolloutRefWorker.actor_worker_cls)
    worker.engine = engine
    worker.engine_config = SimpleNamespace(
        use_dynamic_bsz=dynamic,
        max_token_len_per_gpu=MAX_TOKENS_PER_MICRO_BATCH,
        micro_batch_size_per_gpu=MICRO_BATCH,
        use_fused_kernels=False,
        forward_only=False,
    )
    worker.model_config = {"use_remove_padding": packed}
    worker.flops_counter, worker.device_name = None, "cpu"
    worker.profiler = DistProfiler(rank=0, config=None, tool_config=None)
    actor = actor_config(segmenter=SEGMENTER, codec=CODEC, loss_agg_mode=agg, clip_ratio_low=0.05)
    worker.loss_fn = functools.partial(engine_workers.ppo_loss, config=actor)

    data = layout(rollout_batch())
    tu.assign_non_tensor(data, **update_fields(MINI_BATCH))  # as the trainer's _update_actor sets them
    metrics = tu.get(worker.train_mini_batch(data), "metrics")
    # the model saw one packed row per micro-batch, or every row padded
    rows_seen = sum(shape[0] for shape in engine.input_shapes)
    assert rows_seen == (len(engine.input_shapes) if packed else ROWS) and len(engine.input_shapes) < ROWS
    return metrics, [torch.cat([g.flatten() for g in gradient]) for gradient in engine.gradients]


COMPARED = [
    "actor/pg_loss",
    "actor/pg_clipfrac",
    "actor/ppo_kl",
    "actor/pg_clipfrac_lower",
    *(
        METRIC_PREFIX + name
        for name in (
            "segments_per_response",
            "mean_segment_length",
            "clipfrac_high",
            "clipfrac_low",
            "segment_log_ratio_std",
        )
    ),
]


@pytest.mark.parametrize("agg", ["token-mean", "seg-mean", "seq-mean-seg-mean"])
@pytest.mark.parametrize("layout", [legacy_layout, v1_layout], ids=["legacy", "v1"])
def test_dynamic_micro_batches_and_packing_give_the_fixed_ones_update_loss_and_metrics(on_cpu, loss_calls, layout, agg):
    fixed, fixed_gradients = update(layout, agg, dynamic=False)
    fixed_groups = [c["rows"] for c in loss_calls]
    assert all(len(rows) == MICRO_BATCH for rows in fixed_groups)
    assert len(set(sum(fixed_groups, []))) == ROWS  # the row keys tell every row apart
    assert fixed[METRIC_PREFIX + "clipfrac_low"] != [0.0, 0.0]  # ratios moved: the clip statistics say something

    for packed in (False, True):
        loss_calls.clear()
        dynamic, dynamic_gradients = update(layout, agg, dynamic=True, packed=packed)
        # veRL did regroup: the same rows, in micro-batches of other sizes and another order
        dynamic_groups = [c["rows"] for c in loss_calls]
        assert {len(rows) for rows in dynamic_groups} != {MICRO_BATCH}
        assert sorted(sum(dynamic_groups, [])) == sorted(sum(fixed_groups, []))

        assert len(fixed_gradients) == len(dynamic_gradients) == ROWS // MINI_BATCH
        for fixed_gradient, dynamic_gradient in zip(fixed_gradients, dynamic_gradients):
            assert fixed_gradient.abs().sum() > 0
            torch.testing.assert_close(dynamic_gradient, fixed_gradient, rtol=1e-10, atol=1e-13)
        for key in COMPARED:
            assert len(fixed[key]) == ROWS // MINI_BATCH, key
            assert dynamic[key] == pytest.approx(fixed[key], rel=1e-10, abs=1e-13), (key, packed)
            assert all(math.isfinite(value) for value in fixed[key]), key
        if agg == "seg-mean":  # counted before veRL cuts the mini-batch, whatever the cut
            assert dynamic[METRIC_PREFIX + "minibatch_segments"] == fixed[METRIC_PREFIX + "minibatch_segments"]


def test_reported_metrics_are_the_mini_batch_values_not_verl_means_over_micro_batches(on_cpu, loss_calls):
    """veRL averages a loss's metrics over micro-batches with equal weight; on this batch, cut into micro-batches of
    unequal sizes, that mean is not the mini-batch's value, which is what the worker reports."""
    metrics, _ = update(legacy_layout, "token-mean", dynamic=True)
    key = METRIC_PREFIX + "mean_segment_length"
    mini_batches, rows_seen = [[]], 0
    for call in loss_calls:
        if rows_seen == MINI_BATCH:
            mini_batches.append([])
            rows_seen = 0
        mini_batches[-1].append(call)
        rows_seen += len(call["rows"])
    assert len(mini_batches) == ROWS // MINI_BATCH
    exact = [sum(c["tokens"] for c in calls) / sum(c["segments"] for c in calls) for calls in mini_batches]
    verl_mean = [sum(c["metrics"][key] for c in calls) / len(calls) for calls in mini_batches]
    assert metrics[key] == pytest.approx(exact, rel=1e-12)
    assert verl_mean != pytest.approx(exact, rel=1e-3)
