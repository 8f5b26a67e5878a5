"""Forward + backward time of `maspo` with each built-in segmenter against veRL's `gspo` and `vanilla`.

All losses run on the same tensors in one process; the table prints medians and ratios to `gspo` (target: at most
1.5x for every built-in segmenter). Usage::

    python benchmarks/bench_maspo_loss.py [--repeats 15] [--threads 2] [--shapes 64x2048 8x8192]
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
from maspo_verl.config import MaspoPolicyLossConfig
from maspo_verl.llasa.tokens import CODEC_OFFSET as LLASA_CODEC_OFFSET
from maspo_verl.loss_inputs import provide_loss_inputs

SEGMENTERS = {
    "maspo/fixed W=5": {"name": "fixed", "window": 5},
    "maspo/logprob z": {"name": "logprob", "threshold": 1.0},
    "maspo/token_jump": {"name": "token_jump", "threshold": 4096},
    "maspo/fsq l1": {"name": "fsq", "threshold": 4},
    "maspo/fsq+min/max": {"name": "fsq", "threshold": 4, "min_len": 2, "max_len": 16},
}


def speech_like_batch(batch: int, width: int, seed: int = 0):
    """Log-probs near the old policy, right padding, and codec ids that drift in runs like speech tokens."""
    generator = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, width, generator=generator) * 4
    new = (old + 0.05 * torch.randn(batch, width, generator=generator)).requires_grad_(True)
    advantages = torch.randn(batch, 1, generator=generator).expand(batch, width).contiguous()
    lengths = torch.randint(width // 2, width + 1, (batch,), generator=generator)
    mask = torch.arange(width) < lengths.unsqueeze(1)  # bool, as veRL's ppo_loss passes it
    change = torch.rand(batch, width, generator=generator) < 0.3
    step = torch.randint(0, 65536, (batch, width), generator=generator)
    codes = torch.cummax(torch.where(change, torch.arange(width).expand(batch, width), 0), dim=1).indices
    codes = torch.gather(step, 1, codes)
    response_ids = LLASA_CODEC_OFFSET + codes
    return old, new, advantages, mask, response_ids


def actor_config(loss_mode: str, segmenter: dict | None = None) -> ActorConfig:
    policy_loss = MaspoPolicyLossConfig(loss_mode=loss_mode, maspo={"segmenter": segmenter or {"name": "fixed"}})
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, policy_loss=policy_loss)


def time_forward_backward(loss_mode, config, old, new, advantages, mask, response_ids, repeats):
    loss_fn = get_policy_loss_fn(loss_mode)
    times = []
    for i in range(repeats + 2):
        new.grad = None
        start = time.perf_counter()
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
        elapsed = time.perf_counter() - start
        if i >= 2:  # two warm-up runs
            times.append(elapsed)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--shapes", nargs="+", default=["64x2048", "8x8192"])
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    worst = 0.0
    print(f"forward+backward, float32, {args.threads} threads, median of {args.repeats} runs")
    for shape in args.shapes:
        batch, width = (int(x) for x in shape.split("x"))
        tensors = speech_like_batch(batch, width)
        rows = {
            "vanilla": time_forward_backward("vanilla", actor_config("vanilla"), *tensors, args.repeats),
            "gspo": time_forward_backward("gspo", actor_config("gspo"), *tensors, args.repeats),
        }
        for label, segmenter in SEGMENTERS.items():
            rows[label] = time_forward_backward("maspo", actor_config("maspo", segmenter), *tensors, args.repeats)
        print(f"\nB={batch}, T={width}")
        print(f"  {'loss':<20} {'ms':>8} {'x gspo':>8} {'x vanilla':>10}")
        for label, seconds in rows.items():
            ratio = seconds / rows["gspo"]
            if label.startswith("maspo"):
                worst = max(worst, ratio)
            print(f"  {label:<20} {seconds * 1e3:8.2f} {ratio:8.2f} {seconds / rows['vanilla']:10.2f}")
        sys.stdout.flush()
    print(f"\nworst maspo / gspo ratio: {worst:.2f} (target <= 1.5)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
