"""``maspo-verl segments``: how segmenters cut responses, as a table and a histogram of segment lengths.

Runs the segmenter of every chosen MASPO method (`maspo_verl.methods`; ``--set KEY=VALUE`` refines them) on a set of
responses and reports segments per response, segment length and, where the true unit boundaries are known,
boundary precision / recall / F1:

- by default, reference utterances of the built-in synthetic TTS task (`maspo_verl.data.synthetic_tts`), whose true
  boundaries are the changes of spoken unit (what a phoneme-level segmenter should find);
- ``--responses FILE``: a JSON-lines file with ``response_ids`` (vocabulary ids) and optionally ``old_log_probs``
  per line (e.g. dumped from a rollout), for tuning thresholds on real Llasa outputs.

Writes ``<out>/segments.png``: one histogram of segment lengths per method.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch

from maspo_verl.data import synthetic_tts
from maspo_verl.figures import pyplot, save
from maspo_verl.methods import (
    MASPO_KEY,
    Method,
    MethodError,
    add_set_argument,
    method_settings,
    parse_method,
    refine,
    task_method,
)
from maspo_verl.runs.synthetic_run import TASK
from reward_fns.speech_tokens import llasa_tokens as lt

DEFAULT_METHODS = ("maspo-fixed4", "maspo-token-jump", "maspo-fsq")
"""The MASPO methods of `maspo_verl.methods` whose segmenters read token ids (``maspo-logprob`` needs log-probs)."""


def method_segmenter(method: Method) -> dict:
    """The segmenter block a MASPO method sets; `MethodError` for a method that sets none."""
    actor = method_settings(method).get("actor_rollout_ref", {}).get("actor", {})
    block = actor.get("policy_loss", {}).get("maspo", {}).get("segmenter")
    if not block or "name" not in block:
        raise MethodError(f"--method {method.name!r} selects no MASPO segmenter (the maspo-* methods do)")
    return block


def synthetic_responses(count: int, seed: int = 0) -> tuple[list[list[int]], list[list[bool]]]:
    """Reference utterances of the synthetic task, as vocabulary ids, and their true unit starts."""
    rng = random.Random(seed)
    responses, truth = [], []
    for text in synthetic_tts.make_texts(count, seed=seed):
        codes = synthetic_tts.speak(text, rng)
        labels = [synthetic_tts.label(code) for code in codes]
        unit_starts = [i == 0 or labels[i] != labels[i - 1] for i in range(len(codes))]
        responses.append([lt.CODEC_OFFSET + code for code in codes] + [lt.SPEECH_GENERATION_END_ID])
        truth.append(unit_starts + [True])  # the end tag is a unit of its own
    return responses, truth


def load_responses(path: Path) -> tuple[list[list[int]], list[list[float]] | None]:
    ids, log_probs = [], []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        if "response_ids" not in row:
            raise ValueError(f"{path}:{number}: no `response_ids` field (keys: {sorted(row)})")
        ids.append([int(i) for i in row["response_ids"]])
        log_probs.append(row.get("old_log_probs"))
    return ids, (log_probs if all(lp is not None for lp in log_probs) else None)


def pad(rows: list[list], value) -> torch.Tensor:
    width = max(len(row) for row in rows)
    return torch.tensor([row + [value] * (width - len(row)) for row in rows])


def boundary_scores(starts: torch.Tensor, truth: torch.Tensor, mask: torch.Tensor) -> tuple[float, float, float]:
    """Precision, recall and F1 of predicted segment starts against true unit starts (first tokens excluded)."""
    inner = mask.clone()
    inner[:, 0] = False
    predicted, actual = starts & inner, truth & inner
    hits = int((predicted & actual).sum())
    precision = hits / max(int(predicted.sum()), 1)
    recall = hits / max(int(actual.sum()), 1)
    return precision, recall, 2 * precision * recall / max(precision + recall, 1e-12)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="maspo-verl segments", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "methods",
        nargs="*",
        default=DEFAULT_METHODS,
        metavar="METHOD",
        help="a MASPO method of maspo_verl/trainer_config/method/ or NAME:key=value,... "
        f"(default: {' '.join(DEFAULT_METHODS)}; on the synthetic task with its refinements, task/synthetic.yaml)",
    )
    add_set_argument(parser, f"{MASPO_KEY}.segmenter.threshold=3")
    parser.add_argument("--responses", type=Path, help="JSON lines with response_ids (and old_log_probs)")
    parser.add_argument("--count", type=int, default=200, help="synthetic utterances when no file is given")
    parser.add_argument("--out", type=Path, default=Path("."), help="directory for segments.png")
    args = parser.parse_args(argv)
    try:  # the synthetic task's refinements hold for its utterances, not for --responses of a real model
        methods = [
            refine(parse_method(spec), args.refinements)
            if args.responses
            else task_method(spec, TASK, args.refinements)
            for spec in args.methods
        ]
        segmenters = [(method, method_segmenter(method)) for method in methods]
    except MethodError as error:
        parser.error(str(error))

    from maspo_verl.config import MaspoConfig

    if args.responses:
        responses, log_probs = load_responses(args.responses)
        truth = None
    else:
        (responses, truth), log_probs = synthetic_responses(args.count), None
    ids = pad(responses, 0)
    mask = pad([[True] * len(row) for row in responses], False)
    old_log_prob = pad(log_probs, 0.0).float() if log_probs else torch.zeros(ids.shape)
    truth_starts = pad(truth, False) if truth else None

    results = []
    for method, block in segmenters:
        settings = MaspoConfig.from_mapping({"segmenter": block}, key="segmenter")
        if block["name"] == "logprob" and log_probs is None:
            print(f"skipping {method.name}: `logprob` needs old_log_probs in --responses", file=sys.stderr)
            continue
        layout = settings.segment_layout(old_log_prob, mask, ids)
        lengths = layout.lengths[1 : layout.num_segments + 1]  # slot 0 counts padding
        row = {
            "segmenter": method.name,
            "segments/response": layout.num_segments / len(responses),
            "mean length": float(lengths.mean()),
            "lengths": lengths.long().tolist(),
        }
        if truth_starts is not None:
            row["precision"], row["recall"], row["F1"] = boundary_scores(layout.starts, truth_starts, mask)
        results.append(row)

    columns = [c for c in ("segments/response", "mean length", "precision", "recall", "F1") if c in results[0]]
    source = args.responses or f"{len(responses)} synthetic TTS reference utterances (true unit boundaries known)"
    print(f"segments of {source}\n")
    print(f"{'method':<28}" + "".join(f"{c:>19}" for c in columns))
    for row in results:
        print(f"{row['segmenter']:<28}" + "".join(f"{row[c]:>19.3f}" for c in columns))

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "segments.png"
    plot_histograms(results, path)
    print(f"\nhistograms: {path}")
    return 0


def plot_histograms(results: list[dict], path: Path) -> None:
    plt = pyplot()

    fig, axes = plt.subplots(1, len(results), figsize=(3.2 * len(results), 3.0), squeeze=False)
    longest = max(max(row["lengths"], default=1) for row in results)
    for axis, row in zip(axes[0], results):
        axis.hist(row["lengths"], bins=range(1, min(longest, 40) + 2), color="tab:blue", edgecolor="white")
        title = row["segmenter"] + (f"\nF1 {row['F1']:.2f}" if "F1" in row else "")
        axis.set_title(title, fontsize=9)
        axis.set_xlabel("segment length (tokens)")
    axes[0][0].set_ylabel("segments")
    save(fig, path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
