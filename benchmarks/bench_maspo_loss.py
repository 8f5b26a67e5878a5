"""Forward + backward time of `maspo` with each built-in segmenter against veRL's `gspo` and `vanilla`.

All losses run on the same tensors in one process. They are interleaved in rounds (every loss once per round, in a
rotating order), and each round gives a ratio to `gspo` measured within that round, so that a slow minute of a shared
machine slows numerator and denominator alike. Time is the process's CPU time by default (``--clock cpu``: what the
loss computes, not how long it waited for a core on a busy machine); ``--clock wall`` measures elapsed time. The table
prints the median per-round ratio and its spread (interquartile range), the median time, and the verdict against the
targets: every built-in segmenter at most 1.2x `gspo`, at most 1.5x with ``min_len``/``max_len``.

``--device cuda`` puts the same tensors (drawn on the CPU, then moved) on the GPU and times elapsed time between two
``torch.cuda.synchronize()`` calls (``--clock wall``, the only clock there: the process's CPU time says nothing about
GPU work); ``--dtype bfloat16`` casts the log-probs and advantages. Usage::

    python benchmarks/bench_maspo_loss.py [--rounds 31] [--threads 1] [--clock cpu] [--shapes 64x2048 8x8192]
    python benchmarks/bench_maspo_loss.py --device cuda [--dtype bfloat16] [--shapes 64x2048 8x8192 256x4096]
    python benchmarks/bench_maspo_loss.py --device cuda --compile --kernels   # with maspo.compile, kernels counted

``--compile`` adds each segmenter with ``maspo.compile`` (rows marked "(c)"; the first call compiles, in the
warm-up rounds); ``--kernels`` counts each loss's CUDA kernels per call with torch's profiler.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.workers.config import ActorConfig

import maspo_verl.loss  # noqa: F401 - registers loss_mode=maspo
from maspo_base.speech_tokens.llasa_tokens import CODEC_OFFSET
from maspo_verl.config import MaspoPolicyLossConfig, maspo_settings
from maspo_verl.loss_inputs import provide_loss_inputs

SEGMENTERS = {
    "maspo/fixed W=5": {"name": "fixed", "window": 5},
    "maspo/logprob z": {"name": "logprob", "threshold": 1.0},
    "maspo/token_jump": {"name": "token_jump", "threshold": 4096},
    "maspo/fsq l1": {"name": "fsq", "threshold": 4},
    "maspo/fsq+min/max": {"name": "fsq", "threshold": 4, "min_len": 2, "max_len": 16},
}
TARGET = 1.2
TARGET_MIN_MAX = 1.5


def speech_like_batch(batch: int, width: int, seed: int = 0, device: str = "cpu", dtype: torch.dtype = torch.float32):
    """Log-probs near the old policy, right padding, and codec ids that drift in runs like speech tokens.

    Drawn on the CPU whatever ``device`` is, so every device gets the same values."""
    generator = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, width, generator=generator) * 4
    new = old + 0.05 * torch.randn(batch, width, generator=generator)
    advantages = torch.randn(batch, 1, generator=generator).expand(batch, width).contiguous()
    lengths = torch.randint(width // 2, width + 1, (batch,), generator=generator)
    mask = torch.arange(width) < lengths.unsqueeze(1)  # bool, as veRL's ppo_loss passes it
    change = torch.rand(batch, width, generator=generator) < 0.3
    step = torch.randint(0, 65536, (batch, width), generator=generator)
    codes = torch.cummax(torch.where(change, torch.arange(width).expand(batch, width), 0), dim=1).indices
    codes = torch.gather(step, 1, codes)
    response_ids = CODEC_OFFSET + codes
    old, new, advantages = (t.to(device=device, dtype=dtype) for t in (old, new, advantages))
    return old, new.requires_grad_(True), advantages, mask.to(device), response_ids.to(device)


def actor_config(loss_mode: str, segmenter: dict | None = None, compile: bool = False) -> ActorConfig:
    maspo = {"segmenter": segmenter or {"name": "fixed"}, "compile": compile}
    policy_loss = MaspoPolicyLossConfig(loss_mode=loss_mode, maspo=maspo)
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, policy_loss=policy_loss)


def synchronized_wall_time() -> float:
    """Elapsed-time clock for the GPU: waits for every queued kernel, so a difference of two readings covers them."""
    torch.cuda.synchronize()
    return time.perf_counter()


CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def forward_backward(loss_mode, config, old, new, advantages, mask, response_ids, clock=time.process_time):
    """One timed call: the loss as veRL's ``ppo_loss`` calls it, then its backward."""
    loss_fn = get_policy_loss_fn(loss_mode)

    def run() -> float:
        new.grad = None
        start = clock()
        with provide_loss_inputs(response_ids=response_ids):
            loss, _ = loss_fn(
                old_log_prob=old,
                log_prob=new,
                advantages=advantages,
                response_mask=mask,
                loss_agg_mode="token-mean",
                config=config,
            )
        loss.backward()
        return clock() - start

    return run


def segmentation_only(segmenter, old, new, advantages, mask, response_ids, clock=time.process_time):
    """One timed segmentation of the batch as the loss does it (segmenter, canonical starts, bounds, layout)."""
    settings = maspo_settings(actor_config("maspo", segmenter).policy_loss)

    def run() -> float:
        start = clock()
        settings.segment_layout(old, mask, response_ids)
        return clock() - start

    return run


def cuda_kernels_per_call(run, calls: int = 5) -> float:
    """CUDA kernels one timed call launches (forward and backward), counted by torch's profiler over ``calls``
    calls after a warm-up; memory copies and fills are not kernels here."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    run()
    with profile(activities=[ProfilerActivity.CUDA]) as trace:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    names = [e.name for e in trace.events() if e.device_type == DeviceType.CUDA]
    kernels = [n for n in names if not n.lower().startswith(("memcpy", "memset"))]
    return len(kernels) / calls


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, median, q3


def measure(runs: dict, rounds: int) -> dict[str, list[float]]:
    """Time every run once per round, rotating the order; two warm-up rounds are discarded."""
    names = list(runs)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds + 2):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            elapsed = runs[name]()
            if r >= 2:
                times[name].append(elapsed)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=tuple(CLOCKS), default=None, help="default: cpu on cpu, wall on cuda")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="float32", help="of log-probs and advantages")
    parser.add_argument("--shapes", nargs="+", default=["64x2048", "8x8192"])
    parser.add_argument("--compile", action="store_true", help="also each segmenter with maspo.compile (cuda)")
    parser.add_argument("--kernels", action="store_true", help="also count each loss's CUDA kernels (cuda)")
    args = parser.parse_args(argv)
    if (args.compile or args.kernels) and args.device != "cuda":
        parser.error("--compile and --kernels are for --device cuda (the CPU runs the eager path)")
    if args.compile:  # one compiled graph per segmenter's settings: past dynamo's limit it would run eagerly
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 4 * len(SEGMENTERS))
    torch.set_num_threads(args.threads)

    verdicts = []
    if args.device == "cuda":
        if args.clock == "cpu":
            parser.error("--clock cpu measures no GPU work; on --device cuda the clock is wall")
        args.clock, clock = "wall", synchronized_wall_time
        where = f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    else:
        args.clock = args.clock or "cpu"
        clock = CLOCKS[args.clock]
        where = f"{args.threads} thread(s)"
    print(f"forward+backward, {args.dtype}, {where}, {args.clock} time, {args.rounds} interleaved rounds")
    for shape in args.shapes:
        batch, width = (int(x) for x in shape.split("x"))
        tensors = speech_like_batch(batch, width, device=args.device, dtype=DTYPES[args.dtype])
        runs = {
            "vanilla": forward_backward("vanilla", actor_config("vanilla"), *tensors, clock=clock),
            "gspo": forward_backward("gspo", actor_config("gspo"), *tensors, clock=clock),
        }
        for label, segmenter in SEGMENTERS.items():
            runs[label] = forward_backward("maspo", actor_config("maspo", segmenter), *tensors, clock=clock)
            runs["segments:" + label] = segmentation_only(segmenter, *tensors, clock=clock)
            if args.compile:
                compiled = actor_config("maspo", segmenter, compile=True)
                runs[label + " (c)"] = forward_backward("maspo", compiled, *tensors, clock=clock)
        losses = [label for label in runs if not label.startswith("segments:")]
        kernels = {label: cuda_kernels_per_call(runs[label]) for label in losses} if args.kernels else {}
        times = measure(runs, args.rounds)
        print(f"\nB={batch}, T={width}")
        print(
            f"  {'loss':<20} {'ms':>8} {'x gspo (median, IQR)':>24} {'x vanilla':>10} {'target':>7}  verdict"
            f"  {'segmentation ms':>15}" + (f"  {'kernels':>7}" if kernels else "")
        )
        for label, seconds in times.items():
            if label.startswith("segments:"):
                continue
            q1, ratio, q3 = quartiles([t / g for t, g in zip(seconds, times["gspo"])])
            to_vanilla = statistics.median(t / v for t, v in zip(seconds, times["vanilla"]))
            line = f"  {label:<20} {statistics.median(seconds) * 1e3:8.2f} {ratio:8.2f} [{q1:5.2f}, {q3:5.2f}]"
            line += f"    {to_vanilla:10.2f}"
            if label.startswith("maspo"):
                target = TARGET_MIN_MAX if "min/max" in label else TARGET  # the same for " (c)", compiled
                met = ratio <= target
                verdicts.append(met)
                line += f" {target:7.1f}  {'met    ' if met else 'NOT MET'}"
                segmentation = times.get("segments:" + label)  # none for a compiled row: it is inside the graph
                line += f"  {statistics.median(segmentation) * 1e3:15.2f}" if segmentation else " " * 17
            elif kernels:
                line += " " * 34
            if kernels:
                line += f"  {kernels[label]:7.0f}"
            print(line)
        sys.stdout.flush()
    print(f"\n{sum(verdicts)} of {len(verdicts)} targets met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
