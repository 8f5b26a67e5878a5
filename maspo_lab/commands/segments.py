"""``maspo-verl segments``: how segmenters cut responses, as a table and a histogram of segment lengths.

Runs the segmenter of every chosen MASPO method (`maspo_lab.methods`, as the task runs it; ``--set KEY=VALUE``
refines them) on a set of responses and reports segments per response, segment length and, where the true unit
boundaries are known, boundary precision / recall / F1. The responses, by ``--task``:

- ``speech`` (default): real speech codes in mini-llasa's layout (1,024 FSQ codes of the mini codec, 50 per second),
  with the speech task's refinements (``trainer_config/task/speech.yaml``): ``--source sampled`` (default), the
  shipped mini-llasa (``--model``: another) saying ``--count`` of its training sentences once each as the rollout
  samples, with their log-probs; ``--source corpus``, the held-out sentences' recordings encoded by the shipped
  codec (``--codec``), with the model's log-probs of them (what the ``logprob`` segmenter reads). No true boundaries;
- ``synthetic``: reference utterances of the synthetic TTS task (`maspo_lab.data.synthetic_tts`), whose true
  boundaries are the changes of spoken unit (what a phoneme-level segmenter should find);
- ``--responses FILE``: a JSON-lines file with ``response_ids`` (vocabulary ids) and optionally ``old_log_probs``
  per line (e.g. dumped from a rollout): on speech, mini-llasa's (the task's refinements apply); on synthetic,
  real Llasa-1B outputs (the methods as defined: the synthetic refinements hold for its utterances only).

Writes ``<out>/segments.png``: one histogram of segment lengths per method.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch

from maspo_base.speech_tokens import llasa_tokens as lt
from maspo_lab.data import synthetic_tts
from maspo_lab.figures import pyplot, save
from maspo_lab.methods import (
    MASPO_KEY,
    Method,
    MethodError,
    add_set_argument,
    parse_method,
    refine,
)
from maspo_lab.runs.tasks import add_task_argument, task_of

DEFAULT_METHODS = {
    "synthetic": ("maspo-fixed4", "maspo-token-jump", "maspo-fsq"),
    "speech": ("maspo-fixed4", "maspo-token-jump", "maspo-fsq", "maspo-logprob"),
}
"""The MASPO methods of `maspo_lab.methods` whose segmenters read token ids, and on speech ``maspo-logprob`` (its
responses come with log-probs); ``maspo-heard`` needs the reward's heard words, which no source here has."""
SOURCES = ("sampled", "corpus")
DEFAULT_COUNT = {"synthetic": 200, "speech": 16}
"""Responses cut when no file is given; speech: the 16 sentences RL trains on (`maspo_lab.runs.speech_run`)."""


def method_maspo(method: Method) -> dict:
    """The MASPO settings a method sets (its segmenter block, and ``codec`` where the task refines the layout);
    `MethodError` for a method that selects no segmenter."""
    block = method.settings.maspo_block
    if not block.get("segmenter") or "name" not in block["segmenter"]:
        raise MethodError(f"--method {method.name!r} selects no MASPO segmenter (the maspo-* methods do)")
    return block


def method_segmenter(method: Method) -> dict:
    """The segmenter block a MASPO method sets; `MethodError` for a method that sets none."""
    return method_maspo(method)["segmenter"]


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


def sampled_responses(
    count: int, model_dir: Path | None = None, seed: int = 0, max_new_tokens: int | None = None
) -> tuple[list[list[int]], list[list[float]]]:
    """The speech task's model (the shipped mini-llasa by default) saying its first ``count`` training sentences once
    each, sampled as the rollout samples (`maspo_lab.sampler.Sampler`: the task's temperature and
    response budget, or ``max_new_tokens``), with the log-probs of the sampled tokens at that temperature."""
    from maspo_base.speech_tokens.llasa_prompt import render_prompt_ids
    from maspo_lab.runs import speech_run
    from maspo_lab.sampler import Sampler, load_model
    from maspo_lab.speaking_model import SHIPPED_MODEL

    model, tokenizer = load_model(model_dir or SHIPPED_MODEL, "float32", "cpu")
    d = speech_run.TASK_DEFAULTS
    sampler = Sampler(model, tokenizer, seed, d["temperature"], max_new_tokens or d["response_length"])
    prompts = [render_prompt_ids(tokenizer, text) for text in speech_run.training_texts()[:count]]
    responses = sampler.sample(prompts, version=1, log_probs=True)
    return [list(ids) for ids, _ in responses], [list(lp) for _, lp in responses]


def corpus_responses(
    count: int, model_dir: Path | None = None, codec: Path | None = None
) -> tuple[list[list[int]], list[list[float]]]:
    """The first ``count`` held-out sentences' recordings encoded by the speech task's codec (the shipped mini codec
    by default), as mini-llasa responses (the codes, then the end tag), with the model's log-probs of them at the
    task's temperature (teacher-forced, as the trainer recomputes pi_old's)."""
    import soundfile
    import torch

    from maspo_base.codecs import load_encoder
    from maspo_base.speech_tokens.llasa_prompt import render_prompt_ids
    from maspo_lab.analysis.policy_gradients import Batch, response_log_probs
    from maspo_lab.runs import speech_run
    from maspo_lab.sampler import load_model
    from maspo_lab.speaking_model import SHIPPED, SHIPPED_CODEC, SHIPPED_MODEL
    from maspo_lab.speaking_model.model import layout_of_checkpoint

    model, tokenizer = load_model(model_dir or SHIPPED_MODEL, "float32", "cpu")
    layout = layout_of_checkpoint(model_dir or SHIPPED_MODEL, tokenizer)
    encoder = load_encoder(f"{layout.codec}:{codec or SHIPPED_CODEC}")
    held = speech_run.heldout_texts()[:count]
    responses, prompts = [], []
    for sentence in held:
        audio, _ = soundfile.read(SHIPPED / "heldout" / sentence["audio"], dtype="float32")
        responses.append([layout.offset + int(c) for c in encoder.encode(audio)] + [layout.end_id])
        prompts.append(render_prompt_ids(tokenizer, sentence["text"]))
    ids, mask = pad(responses, 0), pad([[1.0] * len(r) for r in responses], 0.0)
    zeros = torch.zeros(len(responses))
    batch = Batch(prompts, ids, mask, zeros, zeros)
    pad_id = model.generation_config.pad_token_id
    log_probs = []
    with torch.no_grad():
        for start in range(0, len(responses), 8):
            part = batch.rows(slice(start, start + 8))
            values = response_log_probs(model, part, speech_run.TASK_DEFAULTS["temperature"], pad_id)
            log_probs += [row[: int(m.sum())].tolist() for row, m in zip(values, part.mask)]
    return responses, log_probs


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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    task = task_of(list(argv or []))
    defaults = DEFAULT_METHODS[task.name]
    parser = argparse.ArgumentParser(prog="maspo-verl segments", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "methods",
        nargs="*",
        default=defaults,
        metavar="METHOD",
        help="a MASPO method of maspo_verl/trainer_config/method/ or NAME:key=value,... "
        f"(default: {' '.join(defaults)}; with the task's refinements, trainer_config/task/{task.name}.yaml)",
    )
    add_task_argument(parser)
    add_set_argument(parser, f"{MASPO_KEY}.segmenter.threshold=3")
    parser.add_argument("--responses", type=Path, help="JSON lines with response_ids (and old_log_probs)")
    parser.add_argument(
        "--count",
        type=int,
        default=DEFAULT_COUNT[task.name],
        help="responses when no file is given (speech: "
        "sentences sampled or recordings encoded; synthetic: reference utterances)",
    )
    if task.name == "speech":
        parser.add_argument(
            "--source",
            choices=SOURCES,
            default=SOURCES[0],
            help="sampled (default): the model says training sentences; corpus: held-out recordings encoded",
        )
        parser.add_argument("--model", type=Path, help="a mini-llasa checkpoint (default: the shipped one)")
        parser.add_argument("--codec", type=Path, help="the mini codec's checkpoint (default: the shipped one)")
        parser.add_argument("--seed", type=int, default=0, help="sampling seed (--source sampled)")
    parser.add_argument("--out", type=Path, default=Path("."), help="directory for segments.png")
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error(f"--count must be >= 1, got {args.count}")
    for flag in ("model", "codec"):
        path = getattr(args, flag, None)
        if path is not None and not (path / "config.json").is_file():
            parser.error(f"--{flag} {path}: no checkpoint there (no config.json)")
    try:  # the synthetic task's refinements hold for its utterances, not for --responses of a real Llasa-1B
        args.methods = [
            refine(parse_method(spec), args.refinements)
            if args.responses and task.name == "synthetic"
            else task.method(spec, args.refinements, getattr(args, "model", None))
            for spec in args.methods
        ]
        args.segmenters = [(method, method_maspo(method)) for method in args.methods]
    except MethodError as error:
        parser.error(str(error))
    return args


def main(argv: list[str] | None = None) -> int:
    from maspo_verl.config import MaspoConfig

    args = parse_args(argv)
    # every method's settings are checked before any response is made (a bad --set fails in seconds)
    configs = [(method, block, MaspoConfig.from_mapping(block, key="maspo")) for method, block in args.segmenters]

    truth = None
    if args.responses:
        responses, log_probs = load_responses(args.responses)
        source = str(args.responses)
    elif args.task == "speech" and args.source == "sampled":
        print(f"[segments] mini-llasa says {args.count} of its training sentences...", flush=True)
        responses, log_probs = sampled_responses(args.count, args.model, args.seed)
        source = f"{len(responses)} responses of mini-llasa saying its training sentences (sampled)"
    elif args.task == "speech":
        responses, log_probs = corpus_responses(args.count, args.model, args.codec)
        source = f"{len(responses)} held-out recordings encoded by the mini codec (corpus codes)"
    else:
        (responses, truth), log_probs = synthetic_responses(args.count), None
        source = f"{len(responses)} synthetic TTS reference utterances (true unit boundaries known)"
    ids = pad(responses, 0)
    mask = pad([[True] * len(row) for row in responses], False)
    old_log_prob = pad(log_probs, 0.0).float() if log_probs else torch.zeros(ids.shape)
    truth_starts = pad(truth, False) if truth else None

    results = []
    for method, block, settings in configs:
        name = block["segmenter"]["name"]
        if name == "logprob" and log_probs is None:
            print(f"skipping {method.name}: `logprob` needs old_log_probs in --responses", file=sys.stderr)
            continue
        if name == "heard_words":
            print(f"skipping {method.name}: `heard_words` needs the reward's heard words", file=sys.stderr)
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
    if not results:
        print("no method could cut these responses", file=sys.stderr)
        return 1

    columns = [c for c in ("segments/response", "mean length", "precision", "recall", "F1") if c in results[0]]
    tokens = [len(r) for r in responses]
    print(f"segments of {source}; {sum(tokens) / len(tokens):.1f} tokens per response ({min(tokens)}-{max(tokens)})\n")
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
