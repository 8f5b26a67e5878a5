"""Which response lengths the synthetic task's content score favours, under two listeners.

Samples responses from a (warm-started) tiny Llasa model the way the rollout does (the lab's sampler,
`maspo_lab.sampler.Sampler`: temperature 1, no top-k/top-p, 24 new tokens at most, stopping at the checkpoint's stop
ids), sorts them by length over the expected length (`FRAMES_PER_UNIT` frames per target unit),
and prints the mean content (1 - unit error rate) per length quartile twice: as the synthetic ASR scores it
(`MIN_UNIT_FRAMES` = 2: a one-frame blip is not heard) and as a listener that hears every frame (1). If content
falls from the shortest quartile to the one at the expected length, the content part of the reward rewards
speaking less. Usage::

    python scripts/length_preference.py --model DIR [--texts 32] [--samples 4] [--seed 0]

``DIR``: a model from `maspo_lab.runs.synthetic_run.prepare_task` (``<out>/task/model`` of ``maspo-verl demo`` or
``maspo-verl ablate``).
"""

from __future__ import annotations

import argparse
import statistics

from maspo_base.speech_tokens import llasa_tokens as lt
from maspo_base.speech_tokens.llasa_prompt import render_prompt_ids
from maspo_lab.data import synthetic_tts
from maspo_lab.sampler import Sampler, load_model


def sample_codes(model, tokenizer, text: str, samples: int, max_new_tokens: int = 24, seed: int = 0) -> list[list[int]]:
    """``samples`` responses to ``text`` at temperature 1 (top-k and top-p off), each drawn from its own stream
    keyed by ``seed`` and ending at its first stop id, as codec ids (the end tag and other tokens dropped)."""
    sampler = Sampler(model, tokenizer, seed, temperature=1.0, max_new_tokens=max_new_tokens)
    responses = sampler.sample([render_prompt_ids(tokenizer, text)] * samples, version=0)
    codec = range(lt.CODEC_OFFSET, lt.CODEC_OFFSET + lt.CODEBOOK_SIZE)
    return [[t - lt.CODEC_OFFSET for t in response if t in codec] for response in responses]


def content(codes: list[int], text: str, min_unit_frames: int) -> float:
    """1 - unit error rate (floored at 0) with the synthetic ASR's shortest heard unit set to ``min_unit_frames``."""
    target = synthetic_tts.units_of_text(text)
    heard = synthetic_tts.transcribe(codes, min_unit_frames)
    return max(0.0, 1.0 - synthetic_tts.edit_distance(heard, target) / len(target))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="tiny Llasa model directory")
    parser.add_argument("--texts", type=int, default=32, help="task texts (the first N training texts)")
    parser.add_argument("--samples", type=int, default=4, help="responses per text")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed; the texts are the task's seed-0 texts")
    args = parser.parse_args()
    model, tokenizer = load_model(args.model)
    model.eval()
    rows = []
    for text in synthetic_tts.make_texts(args.texts, seed=0):
        expected = synthetic_tts.FRAMES_PER_UNIT * len(synthetic_tts.units_of_text(text))
        for codes in sample_codes(model, tokenizer, text, args.samples, seed=args.seed):
            rows.append(
                (len(codes) / expected, content(codes, text, synthetic_tts.MIN_UNIT_FRAMES), content(codes, text, 1))
            )
    rows.sort(key=lambda row: row[0])  # by length only: ties keep their sampling order
    quarter = len(rows) // 4
    print(f"{len(rows)} responses, {args.texts} texts x {args.samples}, temperature 1")
    print("length quartile | length / expected | content (blips not heard) | content (every frame heard)")
    for q in range(4):
        part = rows[q * quarter : (q + 1) * quarter]
        means = [statistics.mean(r[k] for r in part) for k in range(3)]
        print(f"{q + 1:15d} | {means[0]:17.2f} | {means[1]:25.3f} | {means[2]:27.3f}")
    totals = [statistics.mean(r[k] for r in rows) for k in range(3)]
    print(f"{'all':>15} | {totals[0]:17.2f} | {totals[1]:25.3f} | {totals[2]:27.3f}")


if __name__ == "__main__":
    main()
