"""``maspo-verl fidelity``: how well each policy loss's gradient follows the on-policy gradient when data is stale.

On a task (``--task``, `maspo_lab.runs.tasks`), which supplies the policy, its texts and its reward:

- ``speech`` (default): the shipped mini-llasa (``--model``: another checkpoint in its layout), the first
  ``--texts`` of its training sentences (``--data``: a parquet of the speech task), the real speech reward in
  process (the mini codec, Whisper tiny.en, ``1 - tanh(3 CER)``;
  `maspo_lab.analysis.fidelity_scoring.SpeechTaskScorer`), responses up to 4 s (201 tokens). Whisper hears every
  response on the CPU (what that costs: docs/fidelity.md), so the reference's fresh responses (``--reference-groups``
  x n per prompt at every k) cost most: progress lines give the time left, ``fidelity.json`` the measured seconds per
  scored response;
- ``synthetic``: the demo's warm-started tiny Llasa model, its training texts, the synthetic reward (``--long-texts``:
  texts about 4x longer, with a 4x response budget; ``--model PATH --data PARQUET``: a checkpoint and a parquet of
  the synthetic task).

For each of ``--repeats`` stale batches and each ``k`` of ``--updates``: the cosine of every estimator's gradient
(clip on and off) with the on-policy gradient at pi_theta, its relative norm and clip fraction, veRL's ppo_kl, and
the structure of the log-ratios (`maspo_lab.analysis.fidelity`, `maspo_lab.analysis.log_ratios`). Writes
``fidelity.png``, ``log_ratios.png``, ``fidelity.csv`` and ``fidelity.json`` to ``--out`` and prints a table;
``--reference-groups 0`` measures the log-ratios alone (``log_ratios.png`` and ``fidelity.json``).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from maspo_lab.runs.task import Task

LONG_TEXT_RESPONSE_FACTOR = 4
"""``--long-texts`` multiplies the task's response budget by this, about the ratio of its texts' units to the
default texts' (docs/fidelity.md)."""


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The flags; ``settings``: the measurement's `FidelitySettings`, the task's defaults under the flags given."""
    from maspo_base.typed_settings import parse_arguments_or_exit
    from maspo_lab.analysis.fidelity import FidelitySettings
    from maspo_lab.runs.tasks import add_task_argument, task_of

    task = task_of(argv)
    d = FidelitySettings.for_task(task.name)
    speech = task.name == "speech"
    parser = argparse.ArgumentParser(prog="maspo-verl fidelity", description=__doc__.split("\n\n")[0])
    add_task_argument(parser)
    (_speech_arguments if speech else _synthetic_arguments)(parser, task)
    _measurement_arguments(parser, task, d)
    args = parser.parse_args(argv)
    if speech:
        _check_speech(parser, args)
        _check_pilot(parser, args)
    else:
        _check_synthetic(parser, args)
    if args.texts < 1:
        parser.error(f"--texts must be >= 1, got {args.texts}")
    if getattr(args, "long_texts", False):
        d = dataclasses.replace(d, response_length=d.response_length * LONG_TEXT_RESPONSE_FACTOR)
    args.settings = parse_arguments_or_exit(parser, args, FidelitySettings, "fidelity", defaults=d)
    return args


def _speech_arguments(parser: argparse.ArgumentParser, task: Task) -> None:
    """The speech task's flags: its model, codec and data, the reward's threads and device, ``--reference-pilot``."""
    parser.add_argument("--model", type=Path, help="a mini-llasa checkpoint (default: the shipped one)")
    parser.add_argument("--codec", type=Path, help="the mini codec's checkpoint (default: the shipped one)")
    parser.add_argument("--data", type=Path, help="a parquet of the speech task (default: --texts sentences)")
    parser.add_argument(
        "--reward-threads",
        type=int,
        default=None,
        help="CPU threads of the reward (default: torch's); the reward sets torch's thread count in this process, "
        "so the policy's CPU work runs with it too",
    )
    parser.add_argument("--reward-device", default="cpu", help="device of the codec and Whisper (default cpu)")
    parser.add_argument(
        "--reference-pilot",
        default=None,
        metavar="DESIGNS",
        help="instead of the measurement: what a reference costs under each route (reward: CER, likelihood, "
        "composite; baseline: GRPO, leave-one-out; parameters: all, head, last layer), one pilot per sampling "
        "design PROMPTSxGROUP (comma-separated, e.g. 128x4,32x16; maspo_lab.analysis.reference_cost)",
    )
    parser.add_argument(
        "--gate",
        default=None,
        metavar="DESIGNS",
        help="instead of the measurement: the half-split cosine of the batch gradient under the CER reward, "
        "Whisper's word credit, the code ear's PER and likelihood and per-phoneme credit, on the same fresh "
        "responses, one run per design PROMPTSxGROUP (maspo_lab.analysis.gate)",
    )
    parser.add_argument("--ear", type=Path, help="the code ear of --gate (default: the shipped one)")
    parser.add_argument(
        "--splits", type=int, default=200, help="random halvings per pilot (the half-split's spread; default 200)"
    )


def _synthetic_arguments(parser: argparse.ArgumentParser, task: Task) -> None:
    """The synthetic task's flags: a model and data of one's own, or the task built with longer texts."""
    parser.add_argument("--model", type=Path, help="a Llasa-shaped HF checkpoint (default: the demo's tiny model)")
    parser.add_argument("--data", type=Path, help="a veRL parquet of the synthetic task (with --model)")
    parser.add_argument("--long-texts", action="store_true", help="the synthetic task with texts about 4x longer")
    parser.add_argument(
        "--warm-start-steps", type=int, default=task.defaults["warm_start_steps"], help="synthetic task"
    )


def _measurement_arguments(parser: argparse.ArgumentParser, task: Task, d) -> None:
    """The flags of the measurement itself, on both tasks: `FidelitySettings`'s (``d``: the task's defaults)."""
    from maspo_base.typed_settings import add_arguments
    from maspo_lab.analysis.fidelity import TASK_TEXTS, FidelitySettings

    add_arguments(parser, FidelitySettings, skip=("task", "extra"), defaults=d, into=parser)
    texts = TASK_TEXTS.get(task.name, task.defaults["texts"])
    parser.add_argument("--texts", type=int, default=texts, help="training texts (sentences)")
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: a new temp dir)")


def _check_synthetic(parser, args) -> None:
    if (args.model is None) != (args.data is None):
        parser.error("--model and --data go together (or neither: the synthetic task)")
    if args.model is not None:
        if not (args.model / "config.json").is_file():
            parser.error(f"--model {args.model}: no HF checkpoint there (no config.json)")
        if not args.data.is_file():
            parser.error(f"--data {args.data}: no such file")
        if args.long_texts:
            parser.error("--long-texts builds the synthetic task; it does not apply to --model/--data")


def _check_speech(parser, args) -> None:
    from maspo_lab.runs import speech_run

    if args.model is not None and not (args.model / "config.json").is_file():
        parser.error(f"--model {args.model}: no HF checkpoint there (no config.json)")
    if args.codec is not None and not (args.codec / "config.json").is_file():
        parser.error(f"--codec {args.codec}: no mini codec checkpoint there (no config.json)")
    if args.data is not None and not args.data.is_file():
        parser.error(f"--data {args.data}: no such file")
    if args.data is None and not 1 <= args.texts <= len(speech_run.training_texts()):
        parser.error(f"--texts must be in [1, {len(speech_run.training_texts())}] (the shipped training sentences)")
    if args.reward_threads is not None and args.reward_threads < 1:
        parser.error(f"--reward-threads must be >= 1, got {args.reward_threads}")


def _check_pilot(parser, args) -> None:
    from maspo_lab.analysis.reference_cost import Design
    from maspo_lab.runs import speech_run

    if args.reference_pilot is not None and args.gate is not None:
        parser.error("--reference-pilot and --gate are two measurements: run one at a time")
    flag, designs = ("--gate", args.gate) if args.gate is not None else ("--reference-pilot", args.reference_pilot)
    if designs is None:
        return
    try:
        args.designs = [Design.parse(text) for text in designs.split(",") if text.strip()]
    except ValueError as error:
        parser.error(f"{flag}: {error}")
    if not args.designs:
        parser.error(f"{flag} names no design; e.g. 128x4,32x16")
    largest, shipped = max(d.prompts for d in args.designs), len(speech_run.training_texts())
    if args.data is None and largest > shipped:
        parser.error(f"{flag}: {largest} prompts; the shipped training sentences are {shipped}")
    if args.splits < 2:
        parser.error(f"--splits must be >= 2, got {args.splits}")
    args.texts = max(args.texts, largest)


class Task(NamedTuple):
    """What the measurement runs on: the policy and its tokenizer, the prompts, their scorer, what the task is."""

    model: Any
    tokenizer: Any
    prompts: list
    scorer: Any
    regime: str


def synthetic_task(args, out: Path) -> Task:
    """The synthetic task (`Task`): the demo's tiny model and texts (built under
    ``out/task``, reused when there) or ``--model``/``--data``."""
    from maspo_lab.analysis import fidelity_scoring
    from maspo_lab.sampler import load_model

    regime = "model" if args.model else ("long texts" if args.long_texts else "default texts")
    if args.model is None:
        from maspo_lab.runs.synthetic_run import prepare_task

        print(
            f"[fidelity] building the tiny Llasa model and the synthetic task ({regime}) in {out / 'task'}", flush=True
        )
        task = prepare_task(
            out / "task",
            warm_start_steps=args.warm_start_steps,
            n_train=args.texts,
            n_val=16,
            reuse=(out / "task" / "model" / "config.json").exists(),
            seed=args.settings.seed,
            text_length="long" if args.long_texts else "default",
        )
        args.model, args.data = task.model, task.train
    model, tokenizer = load_model(args.model, args.settings.dtype, args.settings.device)
    prompts = fidelity_scoring.load_prompts(args.data, tokenizer)
    return Task(model, tokenizer, prompts, fidelity_scoring.SyntheticScorer(tokenizer), regime)


def speech_task(args, out: Path) -> Task:
    """The speech task (`Task`): mini-llasa (shipped or ``--model``, checked to be in
    mini-llasa's layout), the first ``--texts`` training sentences (or ``--data``), the speech reward in process."""
    from maspo_lab.analysis import fidelity_scoring
    from maspo_lab.runs import speech_run
    from maspo_lab.sampler import load_model
    from maspo_lab.speaking_model.model import layout_of_checkpoint

    if args.data is None:
        task = speech_run.prepare_task(
            out / "task", n_train=args.texts, n_heldout=0, model=args.model, codec=args.codec
        )
        args.model, args.codec, args.data = task.model, task.codec, task.train
    else:
        paths = speech_run.task_paths(out / "task", args.model, args.codec)
        args.model, args.codec = paths.model, paths.codec
    model, tokenizer = load_model(args.model, args.settings.dtype, args.settings.device)
    layout = layout_of_checkpoint(args.model, tokenizer)
    if layout.name != speech_run.TASK.model_layout():
        raise SystemExit(
            f"[fidelity] --model {args.model} speaks the {layout.name!r} layout; the speech task's model speaks "
            f"{speech_run.TASK.model_layout()!r} (its speech_tokens.json)"
        )
    print(f"[fidelity] loading the speech reward: mini codec {args.codec}, Whisper tiny.en", flush=True)
    scorer = fidelity_scoring.SpeechTaskScorer.load(args.codec, threads=args.reward_threads, device=args.reward_device)
    prompts = fidelity_scoring.load_prompts(args.data, tokenizer, scorer.sources)
    return Task(model, tokenizer, prompts, scorer, "speech")


def speech_reward(args, **changes):
    """The speech task's reward in this process (`maspo_lab.analysis.fidelity_scoring.speech_task_reward`: the
    testbed's, in the layout of ``--model``, with the run's reward threads and device) with the measurement's
    ``changes``."""
    from maspo_lab.analysis.fidelity_scoring import speech_task_reward
    from maspo_lab.runs import speech_run

    layout = speech_run.TASK.model_layout(args.model)
    return speech_task_reward(args.codec, layout, num_threads=args.reward_threads, device=args.reward_device, **changes)


def reference_pilot(args, out: Path) -> int:
    """``--reference-pilot``: one pilot per design (`maspo_lab.analysis.reference_cost.pilot`); writes
    ``reference_cost.csv``, ``reference_cost.json`` and ``reference_cost.png`` after each, prints the routes' table."""
    from maspo_lab.analysis import reference_cost
    from maspo_lab.runs import speech_run
    from maspo_lab.speaking_model.hearing import whisper_tiny_en

    start = time.monotonic()
    task = speech_task(args, out)
    reward = speech_reward(  # the anchors' reward: the likelihood of the reference under Whisper tiny.en
        args, likelihood={speech_run.LANGUAGE: whisper_tiny_en()}, reward_config={"intelligibility": "anchors"}
    )
    pilots = []
    for design in args.designs:
        print(f"[fidelity] reference pilot {design}: {design.prompts * design.group} responses", flush=True)
        pilots.append(
            reference_cost.pilot(
                task.model,
                task.tokenizer,
                task.prompts,
                reward,
                design,
                temperature=args.settings.temperature,
                max_new_tokens=args.settings.response_length,
                seed=args.settings.seed,
                splits=args.splits,
                progress=lambda line: print(line, flush=True),
            )
        )
        rows = [row for p in pilots for row in p["rows"]]
        reference_cost.write_pilots(
            pilots, rows, out
        )  # after every design: a long pilot's finished designs survive an interruption
    print()
    print(reference_cost.pilot_table(rows))
    print(f"\n[fidelity] reference pilots: {time.monotonic() - start:.0f}s wall; outputs in {out}")
    return 0


def gate(args, out: Path) -> int:
    """``--gate``: the gate's routes per design (`maspo_lab.analysis.gate`); writes ``gate.json`` and ``gate.md``
    after each design and prints the table."""
    import json

    from maspo_lab.analysis import gate as gate_analysis
    from maspo_lab.runs import speech_run
    from maspo_lab.speaking_model import SHIPPED_EAR

    start = time.monotonic()
    task = speech_task(args, out)
    audio = speech_reward(args, reward_config={"frame_errors": True})  # the gate reads the per-frame figures too
    ear = speech_reward(args, ear=args.ear or SHIPPED_EAR, reward_config={"frame_errors": True, "frame_words": True})
    runs = []
    for design in args.designs:
        print(f"[fidelity] gate {design}: {design.prompts * design.group} responses", flush=True)
        runs.append(
            gate_analysis.gate(
                task.model,
                task.tokenizer,
                task.prompts,
                audio,
                ear,
                design,
                temperature=args.settings.temperature,
                max_new_tokens=args.settings.response_length,
                layout=speech_run.TASK.model_layout(args.model),
                seed=args.settings.seed,
                splits=args.splits,
                progress=lambda line: print(line, flush=True),
            )
        )
        (out / "gate.json").write_text(json.dumps(runs, indent=1) + "\n")
        tables = [f"## {r['design']}\n\n{gate_analysis.gate_table(r['rows'])}" for r in runs]
        (out / "gate.md").write_text("\n\n".join(tables) + "\n")
    print("\n" + (out / "gate.md").read_text())
    print(f"[fidelity] gate: {time.monotonic() - start:.0f}s wall; outputs in {out}")
    return 0


def main(argv: list[str]) -> int:
    import torch

    from maspo_lab.analysis import fidelity
    from maspo_lab.analysis.fidelity_report import write_measurement

    args = parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="maspo_fidelity_"))
    out.mkdir(parents=True, exist_ok=True)
    if getattr(args, "reference_pilot", None):
        return reference_pilot(args, out)
    if getattr(args, "gate", None):
        return gate(args, out)
    start = time.monotonic()
    task = (speech_task if args.task == "speech" else synthetic_task)(args, out)
    ready = time.monotonic() - start
    settings = args.settings
    gradients = (
        f"{len(settings.estimators)} estimators (clip on/off)"
        if settings.reference_groups
        else "no reference (the log-ratios only)"
    )
    print(
        f"[fidelity] ready in {ready:.0f}s; {settings.repeats} repeats x k in {list(settings.updates)} x "
        f"{gradients}, torch threads {torch.get_num_threads()}; {fidelity.planned_responses(settings)} responses to "
        f"score ({settings.batch * settings.n * settings.reference_groups} per reference)",
        flush=True,
    )
    result = fidelity.measure(
        task.model, task.tokenizer, task.prompts, task.scorer, settings, progress=lambda line: print(line, flush=True)
    )
    elapsed, scoring = time.monotonic() - start, result["scoring"]
    about = {
        "task": args.task,
        "regime": task.regime,
        "model": str(args.model),
        "data": str(args.data),
        **({"codec": str(args.codec)} if args.task == "speech" else {}),
        "settings": {k: v for k, v in vars(settings).items() if k != "extra"},
        "seconds": {"setup": ready, "total": elapsed, "scoring": scoring["seconds"]},
    }
    print(
        "\n" + write_measurement(out, result, about, f"maspo-verl fidelity: {task.regime}, {settings.repeats} repeats")
    )
    print(
        f"\n[fidelity] {task.regime}: {elapsed:.0f}s wall ({ready:.0f}s setup); scored {scoring['responses']} "
        f"responses in {scoring['seconds']:.0f}s ({scoring['seconds_per_response']:.3g} s each); outputs in {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
