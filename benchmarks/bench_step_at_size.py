"""A Llasa-1B-sized actor update as veRL's FSDP engine runs it: what MASPO costs in a step, against veRL's `vanilla`.

Every compared method (`grpo` = veRL's `vanilla`, `gspo`, `maspo-fixed4`, `maspo-fsq`, `maspo-heard`: the built-in
methods' actor settings) updates the same rollout batch through veRL 0.9.1's own code in one process: the actor
worker's ``train_mini_batch`` (the plugin's subclass), the FSDP engine's ``train_batch`` (zero grad, micro-batches
cut by token budget as ``use_dynamic_bsz`` and ``ppo_max_token_len_per_gpu`` set them in
`recipes/llasa_1b/llasa_1b.yaml`, each micro-batch one packed row as ``use_remove_padding`` makes it, the model's
forward under bf16 autocast with activation checkpointing, log-probs, ``ppo_loss`` with the plugin's wrapper,
backward, gradient clipping, AdamW's step). Stood in: the engine's constructor (one device, the plain module in
float32 under bf16 autocast, which is the arithmetic of FSDP's bf16 mixed precision without its sharding). The
methods take turns in rounds (every method once per round, rotating order; one warm-up round discarded); each round
gives each method's step time as a ratio to `grpo`'s in that round, and the table prints the median ratio with its
interquartile range, the median s/step, peak memory and tokens/s. The issue's goal is at most 1.02x `grpo`.

``--agreement`` also computes `maspo-fsq`'s loss and gradient (no optimizer step) on the same weights and batch
four ways: packed or padded rows, token-budget or fixed micro-batches. It prints each way's relative gradient
difference to the packed token-budget one beside bf16's own error on this step (the packed token-budget gradient in
bf16 against float32); the ways agree when no difference exceeds that.

``--size llasa-1b`` is Llama-3.2-1B's architecture with Llasa-1B's 193,800-id vocabulary (random weights); ``--size
toy`` is a 2-layer model with the same vocabulary, to test the script on a CPU. Where Ray cannot be imported (the GPU
machine: veRL imports it at the top, the step never calls it) the script puts an inert stand-in in its place and
says so; docs/benchmarks.md says how the other packages travel there. Usage::

    python benchmarks/bench_step_at_size.py --device cuda [--responses 32] [--rounds 4] [--agreement] [--out DIR]
    python benchmarks/bench_step_at_size.py --size toy --device cpu --dtype float64 --agreement   # the test's run
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import json
import os
import statistics
import sys
import time
import types
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import torch

METHODS = ("grpo", "gspo", "maspo-fixed4", "maspo-fsq", "maspo-heard")
BASELINE = "grpo"
AGREEMENT_METHOD = "maspo-fsq"
GOAL = 1.02

SIZES = {
    "llasa-1b": dict(  # Llama-3.2-1B (Llasa-1B's base) with Llasa-1B's vocabulary
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        tie_word_embeddings=True,
    ),
    "toy": dict(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    ),
}
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}


class _Inert(type):
    """Any attribute, call, subscript or union of it is itself; a decorator returns what it decorates."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return cls

    def __call__(cls, *args, **kwargs):
        return args[0] if len(args) == 1 and not kwargs and callable(args[0]) else cls

    def __getitem__(cls, item):
        return cls

    def __or__(cls, other):
        return cls

    __ror__ = __or__


class RayStandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``ray`` and every ``ray.*`` as inert modules, for importing veRL where Ray is not installed. veRL's modules
    import Ray at the top (``verl.protocol``); the update measured here never calls it."""

    absent = _Inert("RayStandIn", (), {})

    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []

        def attribute(name):
            if name.startswith("__"):
                raise AttributeError(name)
            return self.absent

        module.__getattr__ = attribute
        return module

    def exec_module(self, module):
        pass


def import_verl() -> bool:
    """Import the plugin, and with it veRL; returns whether Ray had to be stood in for."""
    try:
        import ray  # noqa: F401
    except ImportError:
        sys.meta_path.insert(0, RayStandIn())
        stood_in = True
    else:
        stood_in = False
    import maspo_verl.verl_plugin  # noqa: F401 - registers loss_mode=maspo, wraps ppo_loss and the actor worker

    return stood_in


def model_config(size: str):
    from transformers import LlamaConfig

    from maspo_base.speech_tokens import llasa_tokens

    return LlamaConfig(vocab_size=llasa_tokens.VOCAB_SIZE, **SIZES[size])


def rollout_batch(responses: int, prompt_length: int, min_length: int, max_length: int, seed: int = 0):
    """A rollout batch in the legacy trainer's layout: left-padded text prompts, right-padded responses of codec
    ids that repeat or drift like speech tokens and end with the end-of-speech tag, group advantages, rollout
    log-probs near 0 (filled in by `old_log_probs`), and the heard word of every codec token (words of 8-25
    frames, unheard gaps between them) for the ``heard_words`` segmenter."""
    from maspo_base.frame_words import NOT_A_FRAME, UNHEARD
    from maspo_base.speech_tokens import llasa_tokens as lt

    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_length, max_length + 1, (responses,), generator=generator)
    prompt_lengths = torch.randint(prompt_length // 2, prompt_length + 1, (responses,), generator=generator)
    width = int(lengths.max())
    positions = torch.arange(width)
    response_mask = positions < lengths[:, None]
    prompt_mask = torch.arange(prompt_length) >= prompt_length - prompt_lengths[:, None]
    prompts = torch.randint(1000, 128000, (responses, prompt_length), generator=generator) * prompt_mask

    change = torch.rand(responses, width, generator=generator) < 0.3
    draws = torch.randint(0, lt.CODEBOOK_SIZE, (responses, width), generator=generator)
    last_change = torch.cummax(torch.where(change, positions.expand(responses, width), 0), dim=1).values
    codes = torch.gather(draws, 1, last_change)
    frames = positions < (lengths - 1)[:, None]
    ids = torch.where(frames, lt.CODEC_OFFSET + codes, lt.SPEECH_GENERATION_END_ID) * response_mask

    word_length = torch.randint(8, 26, (responses, width), generator=generator)
    word_start = torch.cumsum(word_length, dim=1) - word_length
    word_of_frame = torch.searchsorted(word_start, positions.expand(responses, width).contiguous(), right=True) - 1
    place_in_word = positions - torch.gather(word_start, 1, word_of_frame)
    unheard = place_in_word >= torch.gather(word_length, 1, word_of_frame) - 2  # each word's last 2 frames
    heard = torch.where(unheard, UNHEARD, word_of_frame)
    heard_words = torch.where(frames & response_mask, heard, NOT_A_FRAME)

    group_advantage = torch.randn(responses, 1, generator=generator)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1).long()
    return {
        "input_ids": torch.cat([prompts, ids], dim=1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(dim=1) - 1).clamp(min=0),
        "prompts": prompts,
        "responses": ids,
        "response_mask": response_mask.float(),
        "advantages": group_advantage.expand(-1, width) * response_mask,
        "heard_words": heard_words,
    }


def actor_config(method: str):
    """veRL's ``ActorConfig`` with the built-in method's actor settings (loss mode, clip range, aggregation, MASPO
    block) over the recipe's."""
    from verl.workers.config import ActorConfig

    from maspo_lab.methods import BUILTIN_METHODS
    from maspo_verl.config import MaspoPolicyLossConfig

    actor = BUILTIN_METHODS[method].config["actor_rollout_ref"]["actor"]
    policy = actor["policy_loss"]
    loss = MaspoPolicyLossConfig(loss_mode=policy["loss_mode"], maspo=dict(policy.get("maspo", {})))
    clip = {key: actor[key] for key in ("clip_ratio_low", "clip_ratio_high") if key in actor}
    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        loss_agg_mode=actor.get("loss_agg_mode", "token-mean"),
        policy_loss=loss,
        **clip,
    )


class Harness:
    """One model, its optimizer and veRL's actor worker around it; `update` runs one mini-batch update."""

    def __init__(self, args, device: torch.device):
        import verl.workers.engine_workers as engine_workers
        from transformers import LlamaForCausalLM
        from verl.utils.profiler import DistProfiler

        from maspo_lab.single_device_actor import single_device_engine_class

        self.args, self.device = args, device
        torch.manual_seed(args.seed)
        with torch.device(device):
            module = LlamaForCausalLM(model_config(args.size)).to(DTYPES[args.weights])
        module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.parameters = sum(p.numel() for p in module.parameters())
        autocast = DTYPES[args.dtype] if args.dtype != args.weights else torch.float32  # veRL: float32 = none
        self.engine = single_device_engine_class()(module, autocast)
        self.worker = object.__new__(engine_workers.ActorRolloutRefWorker.actor_worker_cls)
        self.worker.engine = self.engine
        self.worker.flops_counter, self.worker.device_name = None, device.type
        self.worker.profiler = DistProfiler(rank=0, config=None, tool_config=None)
        self.configs = {method: actor_config(method) for method in args.methods}
        self._ppo_loss = engine_workers.ppo_loss  # the plugin's wrapper of veRL's

    def update(self, method: str, batch: dict, packed=True, dynamic=True, record_gradients=False) -> dict:
        import functools

        from tensordict import TensorDict
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import left_right_2_no_padding

        from maspo_lab.single_device_actor import update_fields
        from maspo_verl.verl_patches.actor import HEARD_WORDS_FIELD
        from maspo_verl.verl_patches.trainer import needs_heard_words

        args = self.args
        self.worker.engine_config = SimpleNamespace(
            use_dynamic_bsz=dynamic,
            max_token_len_per_gpu=args.max_tokens_per_micro_batch,
            micro_batch_size_per_gpu=args.micro_batch_size,
            use_fused_kernels=False,
            forward_only=False,
        )
        self.worker.model_config = {"use_remove_padding": packed}
        self.worker.loss_fn = functools.partial(self._ppo_loss, config=self.configs[method])
        fields = {k: v for k, v in batch.items() if k != "heard_words"}
        if needs_heard_words(self.configs[method].policy_loss):  # as the trainer hook adds them
            fields[HEARD_WORDS_FIELD] = batch["heard_words"]
        rows = batch["responses"].shape[0]
        data = left_right_2_no_padding(TensorDict(fields, batch_size=[rows]))
        tu.assign_non_tensor(data, **update_fields(rows, args.temperature))  # the batch is one mini-batch
        self.engine.record_gradients = record_gradients
        output = self.worker.train_mini_batch(data)
        return tu.get(output, "metrics")


def old_log_probs(harness: Harness, batch: dict) -> torch.Tensor:
    """The rollout log-probs: the current weights' own (ratio 1 at the first update, as veRL's actor recomputes
    them), from one no-grad forward per response."""
    module = harness.engine.module
    autocast = harness.engine._autocast_dtype
    dtype = torch.promote_types(next(module.parameters()).dtype, torch.float32)
    out = torch.zeros_like(batch["response_mask"], dtype=dtype)
    width = batch["responses"].shape[1]
    with torch.no_grad(), torch.autocast(harness.device.type, dtype=autocast, enabled=autocast != torch.float32):
        for row in range(batch["responses"].shape[0]):
            valid = batch["attention_mask"][row].bool()
            ids = batch["input_ids"][row][valid].to(harness.device)[None]
            logits = module(input_ids=ids, use_cache=False).logits[0].to(dtype) / harness.args.temperature
            length = int(batch["response_mask"][row].sum())
            log_probs = torch.log_softmax(logits[-length - 1 : -1], dim=-1)
            taken = batch["responses"][row, :length].to(harness.device)
            out[row, :length] = log_probs.gather(-1, taken[:, None])[:, 0].cpu()
    return out[:, :width]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure_steps(harness: Harness, batch: dict, rounds: int, progress) -> dict:
    """Each method's step time, peak memory and last metrics, methods rotating within rounds."""
    methods = list(harness.args.methods)
    times = {m: [] for m in methods}
    peaks = {m: 0.0 for m in methods}
    metrics = {}
    for r in range(rounds + 1):
        order = methods[r % len(methods) :] + methods[: r % len(methods)]
        for method in order:
            if harness.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            synchronize(harness.device)
            start = time.perf_counter()
            metrics[method] = harness.update(method, batch)
            synchronize(harness.device)
            elapsed = time.perf_counter() - start
            if r >= 1:
                times[method].append(elapsed)
            if harness.device.type == "cuda":
                peaks[method] = max(peaks[method], torch.cuda.max_memory_allocated() / 2**30)
            progress(f"round {r}/{rounds} {method}: {elapsed:.2f} s" + (" (warm-up)" if r == 0 else ""))
    return {"times": times, "peak_gib": peaks, "metrics": metrics}


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, median, q3


def step_table(measured: dict, tokens: int) -> list[dict]:
    times = measured["times"]
    rows = []
    for method, seconds in times.items():
        ratios = [t / b for t, b in zip(seconds, times[BASELINE])]
        q1, ratio, q3 = quartiles(ratios)
        step = statistics.median(seconds)
        rows.append(
            {
                "method": method,
                "s_per_step": step,
                "ratio_to_grpo": ratio,
                "ratio_iqr": [q1, q3],
                "peak_gib": measured["peak_gib"][method],
                "tokens_per_s": tokens / step,
                "steps": len(seconds),
            }
        )
    return rows


def agreement(harness: Harness, batch: dict) -> dict:
    """`AGREEMENT_METHOD`'s gradient on the same weights four ways (packed or padded rows, token-budget or fixed
    micro-batches), each against the packed token-budget one, beside that one's own bf16 error (against float32).
    Two gradients are held at a time: the reference and the latest."""
    ways = {
        "packed, token budget": dict(packed=True, dynamic=True),
        "padded, token budget": dict(packed=False, dynamic=True),
        "packed, fixed": dict(packed=True, dynamic=False),
        "padded, fixed": dict(packed=False, dynamic=False),
    }
    engine = harness.engine

    def gradient(**layout) -> tuple[list[torch.Tensor], dict]:
        engine.gradients.clear()
        engine.input_shapes.clear()
        metrics = harness.update(AGREEMENT_METHOD, batch, record_gradients=True, **layout)
        return engine.gradients.pop(), metrics

    reference = None
    differences, losses, shapes = {}, {}, {}
    for name, layout in ways.items():
        found, metrics = gradient(**layout)
        reference = found if reference is None else reference
        differences[name] = relative_difference(found, reference)
        losses[name], shapes[name] = _metric(metrics, "actor/pg_loss"), list(engine.input_shapes)
        del found
    own_error = None
    autocast = engine._autocast_dtype
    if autocast != torch.float32:
        engine._autocast_dtype = torch.float32
        try:
            own_error = relative_difference(reference, gradient(**ways["packed, token budget"])[0])
        finally:
            engine._autocast_dtype = autocast
    return {
        "method": AGREEMENT_METHOD,
        "pg_loss": losses,
        "gradient_relative_difference": differences,
        "gradient_norm": sum(float(g.pow(2).sum(dtype=torch.float64)) for g in reference) ** 0.5,
        "model_input_shapes": shapes,
        "autocast_own_error": own_error,
    }


def step_metrics(metrics: dict) -> dict[str, float]:
    """The metrics that show the update happened: gradient norm, clip fraction, and MASPO's segment statistics."""
    from maspo_verl.loss import METRIC_PREFIX

    keys = ["grad_norm", "actor/pg_clipfrac", "actor/pg_loss"]
    keys += [METRIC_PREFIX + name for name in ("segments_per_response", "mean_segment_length")]
    return {key: _metric(metrics, key) for key in keys if key in metrics}


def _metric(metrics: dict, key: str) -> float:
    value = metrics[key]
    return float(value[0] if isinstance(value, list) else value)


def relative_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """``||a - b|| / ||b||`` over all parameters' gradients."""
    difference = sum(float((x - y).pow(2).sum(dtype=torch.float64)) for x, y in zip(a, b))
    norm = sum(float(y.pow(2).sum(dtype=torch.float64)) for y in b)
    return (difference / norm) ** 0.5


def run(args) -> dict:
    stood_in = import_verl()
    device = torch.device(args.device)
    where = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU, {torch.get_num_threads()} thread(s)"

    def progress(line: str) -> None:
        print(f"[step-at-size] {line}", file=sys.stderr, flush=True)

    if stood_in:
        progress("Ray is not installed: an inert stand-in takes its place (the update never calls it)")
    from maspo_lab.single_device_actor import single_process_group, verl_on_cpu

    with single_process_group(device.type), verl_on_cpu() if device.type == "cpu" else nullcontext():
        harness = Harness(args, device)
        batch = rollout_batch(args.responses, args.prompt_length, args.min_length, args.max_length, args.seed)
        batch["old_log_probs"] = old_log_probs(harness, batch) * batch["response_mask"]
        tokens = int(batch["attention_mask"].sum())
        progress(
            f"{args.size}: {harness.parameters / 1e9:.3f} B parameters on {where}; {args.responses} responses, "
            f"{tokens} tokens (prompts and responses)"
        )
        measured = measure_steps(harness, batch, args.rounds, progress)
        result = {
            "date": time.strftime("%Y-%m-%d"),
            "device": where,
            "torch": torch.__version__,
            "size": args.size,
            "parameters": harness.parameters,
            "weights": args.weights,
            "autocast": args.dtype,
            "responses": args.responses,
            "tokens": tokens,
            "response_tokens": int(batch["response_mask"].sum()),
            "max_tokens_per_micro_batch": args.max_tokens_per_micro_batch,
            "rounds": args.rounds,
            "ray_stood_in": stood_in,
            "steps": step_table(measured, tokens),
            "step_times": measured["times"],
            "last_step_metrics": {m: step_metrics(v) for m, v in measured["metrics"].items()},
        }
        if args.agreement:
            progress(f"agreement: {AGREEMENT_METHOD}'s gradient four ways")
            result["agreement"] = agreement(harness, batch)
    return result


def print_result(result: dict) -> None:
    print(
        f"{result['size']} ({result['parameters'] / 1e9:.3f} B parameters, {result['weights']} weights, "
        f"{result['autocast']} autocast) on {result['device']}, torch {result['torch']}: {result['responses']} "
        f"responses, {result['tokens']} tokens, micro-batches of at most {result['max_tokens_per_micro_batch']} "
        f"tokens, {result['rounds']} rounds"
    )
    print(f"  {'method':<14} {'s/step':>8} {'x grpo [IQR]':>22} {'peak GiB':>9} {'tokens/s':>10}  goal")
    for row in result["steps"]:
        q1, q3 = row["ratio_iqr"]
        line = f"  {row['method']:<14} {row['s_per_step']:8.3f} {row['ratio_to_grpo']:8.3f} [{q1:5.3f}, {q3:5.3f}]"
        line += f" {row['peak_gib']:9.2f} {row['tokens_per_s']:10.0f}"
        if row["method"].startswith("maspo"):
            line += f"  {'met' if row['ratio_to_grpo'] <= GOAL else 'NOT MET'} (<= {GOAL})"
        print(line)
    if "agreement" in result:
        found = result["agreement"]
        own = found["autocast_own_error"]
        print(
            f"  {found['method']}: gradient relative to packed token-budget micro-batches"
            + (f" (bf16's own error on it: {own:.2e})" if own is not None else "")
        )
        for name, difference in found["gradient_relative_difference"].items():
            verdict = "" if own is None else ("  agrees" if difference <= own else "  DIFFERS")
            print(f"    {name:<22} {difference:.2e}  pg_loss {found['pg_loss'][name]:.6g}{verdict}")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=tuple(SIZES), default="llasa-1b")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--weights", choices=tuple(DTYPES), default="float32", help="the model's parameters")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="bfloat16", help="autocast (= --weights: none)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--responses", type=int, default=32)
    parser.add_argument("--prompt-length", type=int, default=100)
    parser.add_argument("--min-length", type=int, default=500, help="response tokens")
    parser.add_argument("--max-length", type=int, default=1500)
    parser.add_argument("--max-tokens-per-micro-batch", type=int, default=16384, help="ppo_max_token_len_per_gpu")
    parser.add_argument("--micro-batch-size", type=int, default=4, help="fixed micro-batches (--agreement)")
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--agreement", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch's CPU threads (default: torch's own)")
    parser.add_argument("--out", type=Path, default=None, help="folder for result.json")
    args = parser.parse_args(argv)
    if BASELINE not in args.methods:
        parser.error(f"--methods must include {BASELINE!r}, the baseline of every ratio")
    if args.agreement and AGREEMENT_METHOD not in args.methods:
        parser.error(f"--agreement needs {AGREEMENT_METHOD!r} in --methods")
    if args.agreement and args.responses % args.micro_batch_size:
        parser.error(f"--responses {args.responses} must be a multiple of --micro-batch-size {args.micro_batch_size}")
    if not 1 <= args.min_length <= args.max_length:
        parser.error(f"--min-length {args.min_length} and --max-length {args.max_length}: need 1 <= min <= max")
    if args.max_length + args.prompt_length > args.max_tokens_per_micro_batch:
        parser.error("--max-tokens-per-micro-batch must hold the longest prompt and response")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    result = run(args)
    print_result(result)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
