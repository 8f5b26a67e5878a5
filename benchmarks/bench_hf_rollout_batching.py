"""The `hf` rollout server on a demo step's requests: one by one (the server before batching) against batched.

A demo step sends 8 prompts x 4 responses = 32 concurrent ``generate`` calls, each up to 24 new tokens, to
`HFRolloutServer` on the tiny Llasa-shaped model (193,800-id vocabulary). ``one-by-one`` is the same server with
``max_batch_size=1`` (what it did before dynamic batching: a lock, HF ``generate`` on one row at a time);
``batched`` is the default (all 32 in one batch). The random-weight model never stops early, so every response
is the full budget. The two are interleaved in rounds, and each round gives a ratio measured within it, so that
a slow minute of a shared machine slows both alike. Time is the process's CPU time (``--clock cpu``, all threads)
or elapsed time (``--clock wall``). Usage::

    python benchmarks/bench_hf_rollout_batching.py [--rounds 5] [--prompts 8] [--n 4] [--prompt-len 55] [--clock cpu]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace

import torch

from maspo_base.speech_tokens import llasa_tokens as lt
from maspo_lab.data.tiny_llasa import build_tiny_llasa
from maspo_verl.cpu.hf_rollout import DEFAULT_MAX_BATCH, HFRolloutServer

SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0}


def _step(server: HFRolloutServer, prompts: list[list[int]], clock) -> float:
    async def run():
        return await asyncio.gather(*(server.generate(p, dict(SAMPLING)) for p in prompts))

    start = clock()
    outputs = asyncio.run(run())
    elapsed = clock() - start
    assert all(len(o.token_ids) == len(o.log_probs) > 0 for o in outputs)
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4, help="responses per prompt")
    parser.add_argument("--prompt-len", type=int, default=55, help="a Llasa prompt of the demo is about 55 tokens")
    parser.add_argument("--response-length", type=int, default=24)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    args = parser.parse_args(argv)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter

    with tempfile.TemporaryDirectory() as tmp:
        print("building the tiny Llasa model ...", file=sys.stderr, flush=True)
        path = build_tiny_llasa(tmp, seed=0)
        config = SimpleNamespace(response_length=args.response_length, prompt_length=args.prompt_len, seed=0)
        servers = {
            "one-by-one": HFRolloutServer(config, {"path": str(path)}, num_threads=args.threads, max_batch_size=1),
            "batched": HFRolloutServer(
                config, {"path": str(path)}, num_threads=args.threads, max_batch_size=DEFAULT_MAX_BATCH
            ),
        }
    gen = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(lt.CODEC_OFFSET, lt.VOCAB_SIZE, (args.prompt_len,), generator=gen).tolist()
        for _ in range(args.prompts)
    ]
    requests = [p for p in prompts for _ in range(args.n)]
    for server in servers.values():  # warm-up
        _step(server, requests[:2], clock)
        server.batch_sizes.clear()

    times: dict[str, list[float]] = {name: [] for name in servers}
    ratios = []
    for r in range(args.rounds):
        order = list(servers) if r % 2 == 0 else list(reversed(servers))
        measured = {name: _step(servers[name], requests, clock) for name in order}
        for name, seconds in measured.items():
            times[name].append(seconds)
        ratios.append(measured["batched"] / measured["one-by-one"])
        print(
            f"round {r + 1}/{args.rounds}: one-by-one {measured['one-by-one']:.2f} s, "
            f"batched {measured['batched']:.2f} s, ratio {ratios[-1]:.3f}",
            file=sys.stderr,
            flush=True,
        )
    batches = servers["batched"].batch_sizes
    print(
        f"{len(requests)} concurrent requests x {args.response_length} new tokens, prompts of {args.prompt_len}, "
        f"{args.clock} time, {args.rounds} rounds; batched server's batch sizes: {sorted(set(batches))}"
    )
    print("| server | median s | min s |")
    print("|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.2f} | {min(values):.2f} |")
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    print(
        f"batched / one-by-one: median {statistics.median(ratios):.3f} "
        f"(IQR {quartiles[0]:.3f}-{quartiles[2]:.3f}), speed-up {1 / statistics.median(ratios):.1f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
