"""The speech reward on Ray Serve (`reward_fns.ray_serve`) on CPU: responses/s with 1 and 2 replicas, by concurrency.

Two applications run side by side in one Ray instance, one of 1 replica and one of 2 (one torch thread each, the
tiny random XCodec2 and Paraformer of the tests), and are measured in the same run, interleaved: each round takes
every concurrency level in turn and, at each, both applications in an order that alternates by round; a
measurement sends ``--requests`` responses (random codes, ``--codes`` each: 50 codes = 1 s of speech) through
`ServeRewardClient` (what veRL's reward function awaits) with at most C in flight, and divides by its wall time.
Per concurrency the median over rounds of each application's responses/s and of the within-round ratio
2 replicas / 1 replica are printed and written (``--out``: CSV, JSON, PNG). Wall time on a machine shared with
other jobs: read the ratios, not the absolute figures. Usage::

    .venv/bin/python benchmarks/bench_reward_serve.py --out benchmarks/results/reward_serve
    .venv/bin/python benchmarks/bench_reward_serve.py --replot benchmarks/results/reward_serve.json  # PNG only
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from reward_fns.testing.tiny_models import random_codes, speech_response, write_tiny_paraformer, write_tiny_xcodec2

TEXT = "你好世界今天天气很不错"


def deploy(models: Path, replicas: int, max_batch: int, max_ongoing: int | None):
    from ray import serve

    from reward_fns.ray_serve import QUIET, build_app
    from reward_fns.reward_settings import BatchSettings, ModelSettings, ServeSettings

    name = f"reward_{replicas}"
    model = ModelSettings(
        codec=str(models / "codec"), asr=f"zh=paraformer:{models / 'para'}", default_language="zh", num_threads=1
    )
    settings = ServeSettings(serve_app=name, serve_replicas=replicas, serve_cpus=1, serve_max_ongoing=max_ongoing)
    batch = BatchSettings(max_batch=max_batch, max_wait_ms=10, max_queue=1024)
    serve.run(build_app(model, batch, settings), name=name, route_prefix=None, logging_config=QUIET)
    return name


async def measure(client, requests: list[dict], concurrency: int) -> float:
    """Responses/s of ``requests`` with at most ``concurrency`` in flight."""
    room = asyncio.Semaphore(concurrency)

    async def one(request):
        async with room:
            result = await client.score(request)
            assert result["speech_reason"] != "reward_unavailable", result["speech_detail"]

    start = time.perf_counter()
    await asyncio.gather(*(one(r) for r in requests))
    return len(requests) / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--requests", type=int, default=64, help="responses per measurement")
    p.add_argument("--codes", type=int, default=150, help="speech codes per response (50 = 1 s)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--max-ongoing", type=int, default=None, help="serve_max_ongoing (default 2 * max batch)")
    p.add_argument("--out", default=None, help="path prefix of the CSV, JSON and PNG")
    p.add_argument("--replot", type=Path, default=None, help="redraw the PNG beside a results JSON and exit")
    args = p.parse_args()
    if args.replot:
        results = json.loads(args.replot.read_text())
        plot(results["rows"], args.replot.with_suffix(".png"), argparse.Namespace(**results["settings"]))
        return

    import ray
    from ray import serve

    from reward_fns.ray_serve import ServeRewardClient
    from reward_fns.verl_reward import build_request

    models = Path(tempfile.mkdtemp(prefix="bench_serve_"))
    write_tiny_xcodec2(models / "codec")
    write_tiny_paraformer(models / "para")
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, _temp_dir=tempfile.mkdtemp(dir="/tmp"))
    serve.start(proxy_location="Disabled")
    apps = {n: deploy(models, n, args.max_batch, args.max_ongoing) for n in (1, 2)}
    clients = {n: ServeRewardClient(app, max_in_flight=1024) for n, app in apps.items()}
    requests = [
        build_request(speech_response(random_codes(args.codes, seed=i)), TEXT, {"language": "zh"})
        for i in range(args.requests)
    ]
    rates: dict[tuple[int, int], list[float]] = {}
    ratios: dict[int, list[float]] = {}

    async def run():
        for n in clients:  # warm-up: every replica loads and runs a batch
            await measure(clients[n], requests[:16], 16)
        for k in range(args.rounds):
            for c in args.concurrency:
                order = (1, 2) if k % 2 == 0 else (2, 1)
                got = {n: await measure(clients[n], requests, c) for n in order}
                for n, rate in got.items():
                    rates.setdefault((n, c), []).append(rate)
                ratios.setdefault(c, []).append(got[2] / got[1])
                print(f"round {k} concurrency {c:3d}: 1 replica {got[1]:6.2f}/s, 2 replicas {got[2]:6.2f}/s")

    asyncio.run(run())
    serve.shutdown()
    ray.shutdown()

    rows = [
        {
            "concurrency": c,
            "responses_per_s_1_replica": statistics.median(rates[(1, c)]),
            "responses_per_s_2_replicas": statistics.median(rates[(2, c)]),
            "ratio_2_to_1": statistics.median(ratios[c]),
            "ratio_min": min(ratios[c]),
            "ratio_max": max(ratios[c]),
        }
        for c in args.concurrency
    ]
    print(
        f"\n{args.requests} responses of {args.codes} codes, max_batch {args.max_batch}, {args.rounds} rounds, "
        f"{os.cpu_count()} CPUs (median over rounds)"
    )
    print("concurrency | 1 replica /s | 2 replicas /s | ratio 2:1 [min, max]")
    for r in rows:
        print(
            f"{r['concurrency']:11d} | {r['responses_per_s_1_replica']:12.2f} | "
            f"{r['responses_per_s_2_replicas']:13.2f} | {r['ratio_2_to_1']:.2f} "
            f"[{r['ratio_min']:.2f}, {r['ratio_max']:.2f}]"
        )
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out.with_suffix(".csv"), "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        meta = {k: v for k, v in vars(args).items() if k != "out"}
        out.with_suffix(".json").write_text(
            json.dumps({"settings": meta, "cpus": os.cpu_count(), "rows": rows}, indent=1)
        )
        plot(rows, out.with_suffix(".png"), args)


def plot(rows: list[dict], path: Path, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = [r["concurrency"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(c, [r["responses_per_s_1_replica"] for r in rows], "o-", label="1 replica")
    left.plot(c, [r["responses_per_s_2_replicas"] for r in rows], "s-", label="2 replicas")
    left.set(xscale="log", xlabel="requests in flight", ylabel="responses/s", title="Serve reward on CPU")
    left.legend()
    right.plot(c, [r["ratio_2_to_1"] for r in rows], "o-", color="C2")
    right.fill_between(c, [r["ratio_min"] for r in rows], [r["ratio_max"] for r in rows], color="C2", alpha=0.2)
    right.axhline(1, color="grey", lw=0.5)
    right.axhline(2, color="grey", lw=0.5, ls="--")
    right.set(xscale="log", xlabel="requests in flight", ylabel="2 replicas / 1 replica", title="ratio (median, range)")
    fig.suptitle(f"tiny random models, {args.codes} codes per response, max_batch {args.max_batch}, wall time")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
