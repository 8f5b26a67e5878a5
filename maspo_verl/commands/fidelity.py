"""``maspo-verl fidelity``: how well each policy loss's gradient follows the on-policy gradient when data is stale.

On a task (``--task``, `maspo_verl.runs.tasks`), which supplies the policy, its texts and its reward:

- ``speech`` (default): the shipped mini-llasa (``--model``: another checkpoint in its layout), the first
  ``--texts`` of its training sentences (``--data``: a parquet of the speech task), the real speech reward in
  process (the mini codec, Whisper tiny.en, ``1 - tanh(3 CER)``; `maspo_verl.analysis.fidelity_scoring.SpeechScorer`),
  responses up to 4 s (201 tokens). Whisper hears every response on the CPU (0.3-1 s each), so the reference's
  fresh responses (``--reference-groups`` x n per prompt at every k) cost most: progress lines give the time left,
  ``fidelity.json`` the measured seconds per scored response;
- ``synthetic``: the demo's warm-started tiny Llasa model, its training texts, the synthetic reward (``--long-texts``:
  texts about 4x longer, with a 4x response budget; ``--model PATH --data PARQUET``: a checkpoint and a parquet of
  the synthetic task).

For each of ``--repeats`` stale batches and each ``k`` of ``--updates``: the cosine of every estimator's gradient
(clip on and off) with the on-policy gradient at pi_theta, its relative norm and clip fraction, veRL's ppo_kl, and
the structure of the log-ratios (`maspo_verl.analysis.fidelity`, `maspo_verl.analysis.log_ratios`). Writes
``fidelity.png``, ``log_ratios.png``, ``fidelity.csv`` and ``fidelity.json`` to ``--out`` and prints a table;
``--reference-groups 0`` measures the log-ratios alone (``log_ratios.png`` and ``fidelity.json``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

from maspo_verl.figures import pyplot, save

LONG_TEXT_RESPONSE_FACTOR = 4
"""``--long-texts`` multiplies the task's response budget by this (its texts have about 4x the units)."""


def _ints(flag: str):
    def parse(text: str) -> tuple[int, ...]:
        try:
            return tuple(int(item) for item in text.split(",") if item.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} takes comma-separated integers, got {text!r}") from None

    return parse


def parse_args(argv: list[str]) -> argparse.Namespace:
    from maspo_verl.analysis.fidelity import (
        DEFAULT_TARGET_LENGTHS,
        DEFAULT_UPDATES,
        FidelitySettings,
        builtin_estimators,
    )
    from maspo_verl.runs.tasks import TASK_NAMES, add_task_argument, task_of, task_run

    task = task_of(argv)
    run = task_run(task if task in TASK_NAMES else TASK_NAMES[0])  # argparse itself refuses a bad --task
    d = FidelitySettings.for_task(run.TASK)
    speech = run.TASK == "speech"
    parser = argparse.ArgumentParser(prog="maspo-verl fidelity", description=__doc__.split("\n\n")[0])
    add_task_argument(parser)
    if speech:
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
            "design PROMPTSxGROUP (comma-separated, e.g. 128x4,32x16; maspo_verl.analysis.reference_cost)",
        )
        parser.add_argument(
            "--splits", type=int, default=200, help="random halvings per pilot (the half-split's spread; default 200)"
        )
    else:
        parser.add_argument("--model", type=Path, help="a Llasa-shaped HF checkpoint (default: the demo's tiny model)")
        parser.add_argument("--data", type=Path, help="a veRL parquet of the synthetic task (with --model)")
        parser.add_argument("--long-texts", action="store_true", help="the synthetic task with texts about 4x longer")
        parser.add_argument(
            "--warm-start-steps", type=int, default=run.TASK_DEFAULTS["warm_start_steps"], help="synthetic task"
        )
    parser.add_argument("--updates", type=_ints("--updates"), default=DEFAULT_UPDATES, help="k values, e.g. 0,1,4")
    parser.add_argument(
        "--estimators",
        default=",".join(builtin_estimators(task=run.TASK)),
        help=f"comma-separated methods (maspo_verl/trainer_config/method/, as the {run.TASK} task runs them; "
        "maspo-fixed<W> for the windows of the default list)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="independent stale batches (default 3)")
    parser.add_argument("--batch", type=int, default=d.batch, help="prompts per batch")
    parser.add_argument("--n", type=int, default=d.n, help="responses per prompt (GRPO group)")
    parser.add_argument("--mini-batches", type=int, default=d.mini_batches, help="GRPO updates cycle over these")
    parser.add_argument("--lr", type=float, default=d.lr)
    parser.add_argument("--temperature", type=float, default=d.temperature)
    parser.add_argument(
        "--response-length", type=int, default=None, help=f"response budget in tokens (default {d.response_length})"
    )
    parser.add_argument(
        "--reference-groups",
        type=int,
        default=2,
        help="fresh groups of n per prompt for the reference at every k, in two halves (default 2); its size, and "
        "with it the half-split cosine, grows with it. 0: no reference and no estimator gradients, the log-ratios' "
        "structure only (pi_old's batches are all that is scored)",
    )
    parser.add_argument("--micro-batch", type=int, default=16, help="responses per forward/backward pass")
    parser.add_argument(
        "--score-batch", type=int, default=d.score_batch, help="responses per call of the reward (timed, reported)"
    )
    parser.add_argument(
        "--vocabulary-gradient",
        action="store_true",
        help="measure the gradient over every parameter, the vocabulary matrix too (default: all but it; far slower)",
    )
    parser.add_argument(
        "--target-length", type=_ints("--target-length"), default=DEFAULT_TARGET_LENGTHS, help="segment lengths"
    )
    parser.add_argument(
        "--window-lengths",
        type=_ints("--window-lengths"),
        default=d.window_lengths,
        help=f"window lengths L of the log-ratio's window std (default {','.join(map(str, d.window_lengths))})",
    )
    parser.add_argument(
        "--max-lag", type=int, default=d.max_lag, help=f"lags of the log-ratio's autocorrelation (default {d.max_lag})"
    )
    parser.add_argument("--texts", type=int, default=run.TASK_DEFAULTS["texts"], help="training texts (sentences)")
    parser.add_argument("--device", default="cpu", help="device of the policy (cpu, cuda, ...)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: a new temp dir)")
    args = parser.parse_args(argv)
    if speech:
        _check_speech(parser, args)
        _check_pilot(parser, args)
    else:
        _check_synthetic(parser, args)
    if args.texts < 1:
        parser.error(f"--texts must be >= 1, got {args.texts}")
    if args.response_length is None:
        long_texts = getattr(args, "long_texts", False)
        args.response_length = d.response_length * (LONG_TEXT_RESPONSE_FACTOR if long_texts else 1)
    args.settings = _settings(args)
    try:
        args.settings.validate()
    except ValueError as error:
        parser.error(str(error))
    return args


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
    from maspo_verl.runs import speech_run

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
    from maspo_verl.analysis.reference_cost import Design
    from maspo_verl.runs import speech_run

    if args.reference_pilot is None:
        return
    try:
        args.designs = [Design.parse(text) for text in args.reference_pilot.split(",") if text.strip()]
    except ValueError as error:
        parser.error(f"--reference-pilot: {error}")
    if not args.designs:
        parser.error("--reference-pilot names no design; e.g. 128x4,32x16")
    largest, shipped = max(d.prompts for d in args.designs), len(speech_run.training_texts())
    if args.data is None and largest > shipped:
        parser.error(f"--reference-pilot: {largest} prompts; the shipped training sentences are {shipped}")
    if args.splits < 2:
        parser.error(f"--splits must be >= 2, got {args.splits}")
    args.texts = max(args.texts, largest)


def _settings(args):
    from maspo_verl.analysis.fidelity import FidelitySettings

    return FidelitySettings(
        task=args.task,
        updates=tuple(args.updates),
        estimators=tuple(name.strip() for name in args.estimators.split(",") if name.strip()),
        repeats=args.repeats,
        batch=args.batch,
        n=args.n,
        mini_batches=args.mini_batches,
        lr=args.lr,
        temperature=args.temperature,
        response_length=args.response_length,
        reference_groups=args.reference_groups,
        micro_batch=args.micro_batch,
        vocabulary_gradient=args.vocabulary_gradient,
        target_lengths=tuple(args.target_length),
        window_lengths=tuple(args.window_lengths),
        max_lag=args.max_lag,
        score_batch=args.score_batch,
        seed=args.seed,
        dtype=args.dtype,
        device=args.device,
    )


def printed_table(table: list[dict], references: list[dict]) -> str:
    """Cosine with the on-policy gradient (mean over repeats) per estimator and clip, one column per k."""
    ks = sorted({row["k"] for row in table})
    cells = {(r["estimator"], r["clip"], r["k"]): r for r in table}
    names = list(dict.fromkeys(r["estimator"] for r in table))
    header = f"{'estimator':<18}{'clip':>5}" + "".join(f"{f'k={k}':>15}" for k in ks)
    lines = ["cosine with the on-policy gradient, mean +- 95 % interval over repeats", header, "-" * len(header)]
    for name in names:
        for clip in ("on", "off"):
            row = [cells.get((name, clip, k)) for k in ks]
            lines.append(
                f"{name:<18}{clip:>5}"
                + "".join(f"{c['cosine']:>8.3f}+-{c['cosine_ci95']:<5.3f}" if c else f"{'-':>15}" for c in row)
            )
    first = {k: next(r for r in table if r["k"] == k) for k in ks}
    lines.append("-" * len(header))
    for label, key in (("ppo_kl", "ppo_kl"), ("half-split", "half_split_cosine"), ("ceiling", "noise_ceiling")):
        lines.append(f"{label:<23}" + "".join(f"{first[k][key]:>15.3g}" for k in ks))
    return "\n".join(lines)


def printed_log_ratios(ratios: list[dict]) -> str:
    """Per k: the structure of the log-ratios (`summary.log_ratio_table`), of d_t and of d_t less its
    response's mean, means (and 95 % intervals where shown) over repeats."""
    from maspo_verl.analysis import summary

    lines = []
    for row in ratios:
        lags = [lag for lag in (1, 2, 4, 8, 16, 32, 50, 64) if lag <= len(row["autocorrelation"])]
        lines.append(
            f"k={row['k']:<3d} ({row['repeats']} repeats) share of the variance in the responses' means "
            f"{row['shared_fraction']:.2f}+-{row['shared_fraction_ci95']:.2f}"
        )
        for prefix, what in (("", "d_t"), ("within_", "d_t less its response's mean")):
            lines.append(
                f"  {what}: autocorrelation lag {'/'.join(map(str, lags))}: "
                + "/".join(f"{row[f'{prefix}autocorrelation'][lag - 1]:.2f}" for lag in lags)
                + f"  window std L={'/'.join(map(str, row['window_lengths']))}: "
                + "/".join(f"{s:.3g}" for s in row[f"{prefix}window_std"])
                + "  fitted exponent "
                + ", ".join(
                    f"{lengths} {row[f'{prefix}{name}length_exponent']:.2f} (per repeat "
                    f"{row[f'{prefix}{name}length_exponent_per_repeat']:.2f}"
                    f"+-{row[f'{prefix}{name}length_exponent_per_repeat_ci95']:.2f})"
                    for name, lengths in (("", "all L"), ("short_", f"L <= {summary.SHORT_WINDOW}"))
                )
            )
    lines.append("(MASPO's default clip_length_exponent 0.5 assumes independent tokens: exponent 0.5)")
    return "\n".join(lines)


def plot_fidelity(table: list[dict], path: Path, title: str) -> Path:
    """Cosine vs k per estimator (clip on, clip off), 95 % bands, the noise ceiling; clip fraction vs k."""
    plt = pyplot()

    ks = sorted({row["k"] for row in table})
    names = list(dict.fromkeys(r["estimator"] for r in table))
    cells = {(r["estimator"], r["clip"], r["k"]): r for r in table}
    x = list(range(len(ks)))
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    colours = plt.get_cmap("tab10")
    for ax, clip in zip(axes[:2], ("on", "off")):
        for i, name in enumerate(names):
            rows = [cells[(name, clip, k)] for k in ks]
            mean = [r["cosine"] for r in rows]
            style = "-" if name.startswith("maspo") else "--"
            ax.plot(x, mean, style, marker="o", ms=3, color=colours(i % 10), label=name)
            _band(ax, x, mean, [r["cosine_ci95"] for r in rows], colours(i % 10))
        ceiling = [next(r for r in table if r["k"] == k)["noise_ceiling"] for k in ks]
        ax.plot(x, ceiling, ":", color="black", label="noise ceiling")
        ax.set_title(f"cosine with the on-policy gradient, clip {clip}", fontsize=10)
        ax.set_xticks(x, [str(k) for k in ks])
        ax.set_xlabel("k (GRPO updates since the batch was sampled)")
    axes[0].legend(fontsize=7, ncol=2)
    for i, name in enumerate(names):
        axes[2].plot(
            x,
            [cells[(name, "on", k)]["clip_fraction"] for k in ks],
            marker="o",
            ms=3,
            color=colours(i % 10),
            label=name,
        )
    axes[2].set_title("clip fraction (tokens whose gradient the clip zeroes)", fontsize=10)
    axes[2].set_xticks(x, [str(k) for k in ks])
    axes[2].set_xlabel("k")
    save(fig, path, title)
    return path


def plot_log_ratios(table: list[dict], path: Path, title: str) -> Path:
    """Per k: the autocorrelation of d_t by lag and the std of the window log-ratio vs L beside the L**-1/2 line,
    of d_t (solid) and of d_t less its response's mean (dashed, "less mean"); 95 % bands over repeats."""
    plt = pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    colours = plt.get_cmap("viridis")
    for i, row in enumerate(table):
        colour = colours(i / max(len(table) - 1, 1))
        lags = list(range(1, len(row["autocorrelation"]) + 1))
        for prefix, style, label in (("", "-", f"k={row['k']}"), ("within_", "--", f"k={row['k']}, less mean")):
            mean, ci = row[f"{prefix}autocorrelation"], row[f"{prefix}autocorrelation_ci95"]
            axes[0].plot(lags, mean, style, marker="o", ms=2, color=colour, label=label)
            _band(axes[0], lags, mean, ci, colour)
            gamma = row[f"{prefix}length_exponent"]
            axes[1].loglog(
                row["window_lengths"],
                row[f"{prefix}window_std"],
                style,
                marker="o",
                ms=3,
                color=colour,
                label=f"{label} (gamma {gamma:.2f})",
            )
        first = row["window_std"][0]
        if math.isfinite(first):
            axes[1].loglog(
                row["window_lengths"], [first * L**-0.5 for L in row["window_lengths"]], ":", color=colour, alpha=0.6
            )
    axes[0].axhline(0, color="grey", lw=0.5)
    axes[0].set_title("autocorrelation of d_t within responses", fontsize=10)
    axes[0].set_xlabel("lag (tokens)")
    axes[0].legend(fontsize=7)
    axes[1].set_title("std of the window log-ratio l vs L (dotted: L^-1/2)", fontsize=10)
    axes[1].set_xlabel("window length L (tokens)")
    axes[1].legend(fontsize=6)
    save(fig, path, title)
    return path


def _band(ax, x, mean, ci, colour) -> None:
    """A 95 % band of ``mean +- ci`` (none where the interval is undefined, NaN for one repeat)."""
    ci = [c if math.isfinite(c) else 0.0 for c in ci]
    ax.fill_between(x, [m - c for m, c in zip(mean, ci)], [m + c for m, c in zip(mean, ci)], color=colour, alpha=0.12)


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
    from maspo_verl.analysis import fidelity_scoring
    from maspo_verl.cpu.generation import load_model

    regime = "model" if args.model else ("long texts" if args.long_texts else "default texts")
    if args.model is None:
        from maspo_verl.runs.synthetic_run import prepare_task

        print(
            f"[fidelity] building the tiny Llasa model and the synthetic task ({regime}) in {out / 'task'}", flush=True
        )
        task = prepare_task(
            out / "task",
            warm_start_steps=args.warm_start_steps,
            n_train=args.texts,
            n_val=16,
            reuse=(out / "task" / "model" / "config.json").exists(),
            seed=args.seed,
            text_length="long" if args.long_texts else "default",
        )
        args.model, args.data = task.model, task.train
    model, tokenizer = load_model(args.model, args.dtype, args.device)
    prompts = fidelity_scoring.load_prompts(args.data, tokenizer)
    return Task(model, tokenizer, prompts, fidelity_scoring.SyntheticScorer(tokenizer), regime)


def speech_task(args, out: Path) -> Task:
    """The speech task (`Task`): mini-llasa (shipped or ``--model``, checked to be in
    mini-llasa's layout), the first ``--texts`` training sentences (or ``--data``), the speech reward in process."""
    from maspo_verl.analysis import fidelity_scoring
    from maspo_verl.cpu.generation import load_model
    from maspo_verl.runs import speech_run
    from maspo_verl.speaking_model.model import layout_of_checkpoint

    if args.data is None:
        task = speech_run.prepare_task(
            out / "task", n_train=args.texts, n_heldout=0, model=args.model, codec=args.codec
        )
        args.model, args.codec, args.data = task.model, task.codec, task.train
    else:
        paths = speech_run.task_paths(out / "task", args.model, args.codec)
        args.model, args.codec = paths.model, paths.codec
    model, tokenizer = load_model(args.model, args.dtype, args.device)
    layout = layout_of_checkpoint(args.model, tokenizer)
    if layout.name != speech_run.LAYOUT:
        raise SystemExit(
            f"[fidelity] --model {args.model} speaks the {layout.name!r} layout; the speech task's model speaks "
            f"{speech_run.LAYOUT!r} (its speech_tokens.json)"
        )
    print(f"[fidelity] loading the speech reward: mini codec {args.codec}, Whisper tiny.en", flush=True)
    scorer = fidelity_scoring.SpeechScorer.load(args.codec, threads=args.reward_threads, device=args.reward_device)
    prompts = fidelity_scoring.load_prompts(args.data, tokenizer, scorer.sources)
    return Task(model, tokenizer, prompts, scorer, "speech")


PILOT_FIELDS = ("design", "reward", "baseline", "parameters", "responses", "half_split", "half_split_sd")
PILOT_FIELDS += ("responses_for_0.8", "hours_for_0.8")


def reference_pilot(args, out: Path) -> int:
    """``--reference-pilot``: one pilot per design (`maspo_verl.analysis.reference_cost.pilot`); writes
    ``reference_cost.csv``, ``reference_cost.json`` and ``reference_cost.png`` after each, prints the routes' table."""
    from maspo_verl.analysis import reference_cost
    from maspo_verl.runs import speech_run
    from maspo_verl.speaking_model.hearing import whisper_tiny_en
    from reward_fns.pipeline import SpeechReward

    start = time.monotonic()
    task = speech_task(args, out)
    whisper = whisper_tiny_en()
    reward = SpeechReward.from_spec(
        codec=f"mel_fsq:{args.codec}",
        asr={speech_run.LANGUAGE: f"faster_whisper:{whisper}"},
        likelihood={speech_run.LANGUAGE: whisper},
        default_language=speech_run.LANGUAGE,
        reward_config={"error_unit": "char", "intelligibility": "anchors"},
        layout=speech_run.LAYOUT,
        num_threads=args.reward_threads,
        device=args.reward_device,
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
                temperature=args.temperature,
                max_new_tokens=args.response_length,
                seed=args.seed,
                splits=args.splits,
                progress=lambda line: print(line, flush=True),
            )
        )
        rows = [row for p in pilots for row in p["rows"]]
        write_pilots(pilots, rows, out)  # after every design: a long pilot's finished designs survive an interruption
    print()
    print(pilot_table(rows))
    print(f"\n[fidelity] reference pilots: {time.monotonic() - start:.0f}s wall; outputs in {out}")
    return 0


def write_pilots(pilots: list[dict], rows: list[dict], out: Path) -> None:
    """``reference_cost.csv`` (one row per route and size), ``.json`` (the pilots) and ``.png``."""
    import csv

    with open(out / "reference_cost.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=PILOT_FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    (out / "reference_cost.json").write_text(json.dumps({"pilots": pilots}, indent=1, default=float) + "\n")
    plot_reference_cost(rows, out / "reference_cost.png")


def pilot_table(rows: list[dict]) -> str:
    """Markdown: per design, reward, baseline and parameters, the half-split at each size and what 0.8 needs."""
    lines = [
        "| design | reward | baseline | parameters | responses | half-split (sd over halvings) | responses for 0.8 | "
        "hours for 0.8 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        needed = r["responses_for_0.8"]
        lines.append(
            f"| {r['design']} | {r['reward']} | {r['baseline']} | {r['parameters']} | {r['responses']} | "
            f"{r['half_split']:.3f} ({r['half_split_sd']:.3f}) | {needed:,.0f} | {r['hours_for_0.8']:.1f} |"
            if math.isfinite(needed)
            else f"| {r['design']} | {r['reward']} | {r['baseline']} | {r['parameters']} | {r['responses']} | "
            f"{r['half_split']:.3f} ({r['half_split_sd']:.3f}) | - | - |"
        )
    return "\n".join(lines)


def plot_reference_cost(rows: list[dict], path: Path) -> Path:
    """Half-split cosine against responses, one line per route (reward, baseline) and panel per parameter group,
    with the spread over halvings; the sizing rule's curve through the largest pilot, dashed."""
    plt = pyplot()
    groups = sorted({r["parameters"] for r in rows})
    fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 3.8), squeeze=False)
    for ax, group in zip(axes[0], groups):
        for key in sorted({(r["design"], r["reward"], r["baseline"]) for r in rows if r["parameters"] == group}):
            mine = sorted(
                (r for r in rows if (r["design"], r["reward"], r["baseline"]) == key and r["parameters"] == group),
                key=lambda r: r["responses"],
            )
            xs = [r["responses"] for r in mine]
            line = ax.errorbar(
                xs,
                [r["half_split"] for r in mine],
                yerr=[r["half_split_sd"] for r in mine],
                marker="o",
                capsize=3,
                label=" ".join(key),
            )
            c, n = mine[-1]["half_split"], mine[-1]["responses"]
            if c > 0:  # c / (1 - c) proportional to responses
                grid = [n * f for f in (0.25, 0.5, 1, 2, 4, 8, 16)]
                ratio = [c / (1 - c) * x / n for x in grid]
                ax.plot(grid, [q / (1 + q) for q in ratio], ls="--", color=line[0].get_color(), alpha=0.5)
        ax.axhline(0.8, color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("responses in the reference")
        ax.set_ylabel("half-split cosine")
        ax.set_title(f"parameters: {group}", fontsize=10)
        ax.legend(fontsize=6)
    save(fig, path, "What a fidelity reference costs on speech, by route (dashed: the sizing rule)")
    return path


def main(argv: list[str]) -> int:
    import csv

    import torch

    from maspo_verl.analysis import fidelity, summary

    args = parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="maspo_fidelity_"))
    out.mkdir(parents=True, exist_ok=True)
    if getattr(args, "reference_pilot", None):
        return reference_pilot(args, out)
    start = time.monotonic()
    task = (speech_task if args.task == "speech" else synthetic_task)(args, out)
    ready = time.monotonic() - start
    settings = args.settings
    planned = fidelity.planned_responses(settings)
    gradients = (
        f"{len(settings.estimators)} estimators (clip on/off)"
        if settings.reference_groups
        else "no reference (the log-ratios only)"
    )
    print(
        f"[fidelity] ready in {ready:.0f}s; {settings.repeats} repeats x k in {list(settings.updates)} x "
        f"{gradients}, torch threads {torch.get_num_threads()}; {planned} responses to score "
        f"({settings.batch * settings.n * settings.reference_groups} per reference)",
        flush=True,
    )
    result = fidelity.measure(
        task.model, task.tokenizer, task.prompts, task.scorer, settings, progress=lambda line: print(line, flush=True)
    )
    table = summary.estimator_table(result["rows"], result["references"])
    ratios = summary.log_ratio_table(result["log_ratios"])
    elapsed = time.monotonic() - start
    title = f"maspo-verl fidelity: {task.regime}, {settings.repeats} repeats"
    if table:
        with open(out / "fidelity.csv", "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(table[0]))
            writer.writeheader()
            writer.writerows(table)
    scoring = result["scoring"]
    (out / "fidelity.json").write_text(
        json.dumps(
            {
                "task": args.task,
                "regime": task.regime,
                "model": str(args.model),
                "data": str(args.data),
                **({"codec": str(args.codec)} if args.task == "speech" else {}),
                "settings": {k: v for k, v in vars(settings).items() if k != "extra"},
                "seconds": {"setup": ready, "total": elapsed, "scoring": scoring["seconds"]},
                "scoring": scoring,
                "batches": result["batches"],
                "estimators": table,
                "references": result["references"],
                "log_ratios": ratios,
                "log_ratio_repeats": result["log_ratios"],
                "thresholds": result["thresholds"],
                "rows": result["rows"],
            },
            indent=1,
            default=float,
        )
        + "\n"
    )
    if table:
        plot_fidelity(table, out / "fidelity.png", title)
        print()
        print(printed_table(table, result["references"]))
    if ratios:
        plot_log_ratios(ratios, out / "log_ratios.png", title)
        print()
        print(printed_log_ratios(ratios))
    print()
    for row in result["thresholds"]:
        print(
            f"{row['segmenter']:<11} target length {row['target_length']:>3}: threshold {row['threshold']} "
            f"(mean length {row['mean_length']:.2f})"
        )
    print(
        f"\n[fidelity] {task.regime}: {elapsed:.0f}s wall ({ready:.0f}s setup); scored {scoring['responses']} "
        f"responses in {scoring['seconds']:.0f}s ({scoring['seconds_per_response']:.3g} s each); outputs in {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
