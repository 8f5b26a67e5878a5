"""``maspo-verl ablate``: a grid of methods x regimes x seeds through veRL's real trainer on the synthetic TTS task,
on CPU.

Every run uses the same task (data, tiny model, warm-start checkpoint: built once under ``<out>/task``) and the
same seeds, so within a regime (`maspo_verl.regimes`: ``default``, ``stale``, ``hot``) the only difference between
runs of a seed is the method (`maspo_verl.methods`). Before any run, each method's overrides are composed with
veRL's config under each regime and validated; a bad one fails naming the method or the regime.

Per finished run one progress line (its final figures) and the overall progress; a finished run (``done.json``
in its directory) is not run again when the command is repeated with the same ``--out``. ``--jobs N`` runs N at a
time (each its own trainer and Ray instance); Ctrl-C stops the runs in flight. Results:

- ``runs.jsonl``: every metric of every step of every finished run, one line per step (``method``, ``seed``);
- ``summary.csv`` and the printed table, per regime and method over seeds: final reward and content (mean +- std),
  content on the training texts after training and its gain over the same evaluation before training
  (``--eval-samples`` responses per text; mean +- std), the gain's paired difference to ``grpo`` of the same seed
  and regime (mean +- std over the seeds both finished), how many runs collapsed (`collapse_reasons`), area under
  the reward curve (mean reward over the steps), steps to reach ``--threshold`` (mean over the seeds that reached
  it, and how many did), pg clip fraction and ppo_kl (means over steps), seconds per step (median over steps after
  the first, which holds one-time start-up work) and its ratio to ``grpo``'s in the same regime;
- ``ablation.png``: per regime (a row), mean curve and min-max band over seeds per method, for reward, content,
  length, clip fraction, and the evaluation's content before and after training.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from maspo_verl.analysis.summary import mean_interval
from maspo_verl.figures import pyplot, save
from maspo_verl.methods import (
    DEFAULT_GRID,
    Method,
    MethodError,
    method_help,
    parse_methods,
    task_method,
    validate_methods,
)
from maspo_verl.regimes import BUILTIN_REGIMES, DEFAULT_REGIMES, Regime, parse_regimes
from maspo_verl.runs.synthetic_run import TASK, split_evaluations

CURVES = (
    ("reward", "critic/score/mean"),
    ("content (1 - unit error rate)", "reward/content/mean"),
    ("response length (tokens)", "response_length/mean"),
    ("pg clip fraction", "actor/pg_clipfrac"),
)
REWARD, CONTENT, LENGTH, CLIP, KL, STEP_TIME, ENTROPY = (
    "critic/score/mean",
    "reward/content/mean",
    "response_length/mean",
    "actor/pg_clipfrac",
    "actor/ppo_kl",
    "timing_s/step",
    "actor/entropy",
)
COLLAPSE_DROP = 0.20
"""A run collapsed if the evaluation's content or end-tag rate after training fell this far below the evaluation
before it (the default regime's runs lose at most 0.13 of end-tag rate; the lr 2e-3 collapse of docs/history.md
went 0.97 -> 0.22)..."""
ENTROPY_BAND = (0.5, 2.0)
"""... or if the actor's entropy at some step left this band around its first step's value (that collapse: 2.8 ->
10.6), or was not finite."""
SUMMARY_FIELDS = (
    "regime",
    "method",
    "seeds",
    "final_reward_mean",
    "final_reward_std",
    "final_content_mean",
    "final_content_std",
    "eval_content_after_mean",
    "eval_content_after_std",
    "eval_content_gain_mean",
    "eval_content_gain_std",
    "gain_vs_grpo_mean",
    "gain_vs_grpo_std",
    "gain_vs_grpo_ci95",
    "paired_seeds",
    "collapsed",
    "reward_auc",
    "steps_to_threshold",
    "seeds_reaching_threshold",
    "pg_clipfrac",
    "ppo_kl",
    "s_per_step",
    "s_per_step_vs_grpo",
    "jobs",
)


@dataclass(frozen=True)
class RunKey:
    method: str
    seed: int
    regime: str = "default"

    def dir(self, out: Path) -> Path:
        return out / "runs" / self.regime / self.method / f"seed{self.seed}"


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds {text!r}: expected comma-separated integers, e.g. 0,1,2") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"--seeds {text!r}: expected distinct integers, e.g. 0,1,2")
    return seeds


def parse_args(argv: list[str]) -> argparse.Namespace:
    from maspo_verl.runs.synthetic_run import TASK_DEFAULTS, add_eval_samples_argument, check_run_shape

    parser = argparse.ArgumentParser(
        prog="maspo-verl ablate",
        description="Compare policy-optimisation methods x seeds with veRL's real trainer on the synthetic TTS task.",
    )
    parser.add_argument(
        "--method",
        action="append",
        default=None,
        metavar="NAME[:OVERRIDES]",
        help=method_help(" ".join(DEFAULT_GRID)) + "; repeatable",
    )
    parser.add_argument(
        "--regime",
        action="append",
        default=None,
        metavar="NAME[:OVERRIDES]",
        help=f"a built-in ({', '.join(BUILTIN_REGIMES)}) or NAME:key=value,key=value (run-shape overrides); "
        f"repeatable (default: {' '.join(DEFAULT_REGIMES)})",
    )
    parser.add_argument("--seeds", type=parse_seeds, default=[0, 1, 2], help="comma-separated (default 0,1,2)")
    parser.add_argument("--steps", type=int, default=TASK_DEFAULTS["steps"], help="training steps per run")
    parser.add_argument("--threshold", type=float, default=0.5, help="reward level for 'steps to threshold'")
    parser.add_argument("--out", type=Path, default=Path("ablation"), help="output directory (resumable)")
    parser.add_argument("--task-seed", type=int, default=0, help="seed of the task data and the warm start")
    d = TASK_DEFAULTS
    parser.add_argument("--warm-start-steps", type=int, default=d["warm_start_steps"], help="supervised steps")
    parser.add_argument("--batch", type=int, default=d["batch"], help="prompts per step")
    parser.add_argument("--n", type=int, default=d["n"], help="responses per prompt")
    parser.add_argument("--mini-batches", type=int, default=d["mini_batches"], help="actor updates per step")
    add_eval_samples_argument(parser)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds before a run is stopped")
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="runs at a time (default 1). A run's processes take turns (rollout, reward, update) and keep about 1.2 "
        "of 2 cores busy: 2 at a time finished a grid 1.2x sooner on 2 cores. A seed's evaluation before step 1 and "
        "first rollout are the same either way (later figures drift by timing, as any run's do); s/step includes "
        "the other runs' share of the cores and is compared only at the same --jobs",
    )
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: expected a positive number of runs at a time")
    check_run_shape(parser, args)
    try:
        args.methods = [task_method(m, TASK) for m in parse_methods(args.method or DEFAULT_GRID)]
        args.regimes = parse_regimes(args.regime or DEFAULT_REGIMES)
    except MethodError as exc:
        parser.error(str(exc))
    return args


def _mean_std(values: list[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def collapse_reasons(records: list[dict[str, float]], eval_samples: int) -> list[str]:
    """Why a run counts as collapsed (empty: it did not): the evaluation's content or end-tag rate fell
    `COLLAPSE_DROP` below the evaluation before training, or the entropy left `ENTROPY_BAND` x its first step's."""
    steps, evaluations = split_evaluations(records, eval_samples)
    reasons = []
    if len(evaluations) > 1 and evaluations[0]["step"] == 0:
        before, after = evaluations[0], evaluations[-1]
        for part, label in (("eval/content", "content"), ("eval/end", "end tag")):
            if part in before and part in after and not after[part] >= before[part] - COLLAPSE_DROP:
                reasons.append(f"{label} {before[part]:.2f}->{after[part]:.2f}")
    entropies = [s[ENTROPY] for s in steps if ENTROPY in s]
    low, high = ENTROPY_BAND
    outside = [e for e in entropies[1:] if not low * entropies[0] <= e <= high * entropies[0]]
    if entropies and outside:
        reasons.append(f"entropy {entropies[0]:.2f}->{outside[0]:.2f}")
    return reasons


def run_figures(records: list[dict[str, float]], threshold: float, eval_samples: int) -> dict[str, float]:
    """One run's figures: final reward/content, the evaluation's content after training and its gain over the
    evaluation before (NaN without both), reward AUC, first step at ``threshold``, clip, kl, s/step, collapse."""
    steps, evaluations = split_evaluations(records, eval_samples)
    before = evaluations[0]["eval/content"] if len(evaluations) > 1 and evaluations[0]["step"] == 0 else math.nan
    after = evaluations[-1]["eval/content"] if len(evaluations) > 1 else math.nan

    def series(key: str) -> list[float]:
        return [s[key] for s in steps if key in s]

    rewards = series(REWARD)
    reached = [int(s["step"]) for s in steps if s.get(REWARD, -math.inf) >= threshold]
    times = series(STEP_TIME)
    return {
        "final_reward": rewards[-1] if rewards else math.nan,
        "final_content": series(CONTENT)[-1] if series(CONTENT) else math.nan,
        "eval_content_after": after,
        "eval_content_gain": after - before,
        "reward_auc": statistics.fmean(rewards) if rewards else math.nan,
        "steps_to_threshold": float(reached[0]) if reached else math.nan,
        "pg_clipfrac": statistics.fmean(series(CLIP)) if series(CLIP) else math.nan,
        "ppo_kl": statistics.fmean(series(KL)) if series(KL) else math.nan,
        "s_per_step": statistics.median(times[1:] or times) if times else math.nan,
        "collapsed": float(bool(collapse_reasons(records, eval_samples))),
    }


TIME_PARTS = (
    ("driver", "veRL's driver: imports, config, Ray's start"),
    ("workers", "Ray workers: actor, rollout server, reward workers"),
    ("initial_validation", "the evaluation before step 1"),
    ("steps", "the training steps (veRL's timing_s/step, summed)"),
    ("final_validation", "the evaluation after the last step (timing_s/testing)"),
    ("between_steps", "between and around the steps: data loading, metrics, logging"),
    ("teardown", "after the last step: shutdown, stopping Ray"),
)


def time_breakdown(run, records: list[dict[str, float]]) -> dict[str, float]:
    """Where one run's wall time went, in seconds (`TIME_PARTS`; NaN where a milestone line was not seen), from
    the `maspo_verl.runs.launch.MILESTONES` of ``run`` (a `TrainerRun`) and veRL's timings in ``records``."""
    marks = run.milestones
    steps = [r for r in records if STEP_TIME in r]
    trained = sum(r[STEP_TIME] for r in steps)
    testing = steps[-1].get("timing_s/testing", 0.0) if steps else 0.0
    ray = marks.get("ray_started", math.nan)
    ready = marks.get("workers_ready", math.nan)
    validated = marks.get("initial_validation_done", ready)
    return {
        "driver": ray,
        "workers": ready - ray,
        "initial_validation": validated - ready,
        "steps": trained,
        "final_validation": testing,
        "between_steps": run.last_step_seconds - validated - trained - testing,
        "teardown": run.wall_seconds - run.last_step_seconds,
        "total": run.wall_seconds,
    }


def time_table(breakdowns: list[dict[str, float]]) -> str:
    """Median seconds per part over runs, and its share of the median total."""
    total = statistics.median(b["total"] for b in breakdowns)
    lines = [f"| part of a run ({len(breakdowns)} runs, median) | s | share |", "|---|---|---|"]
    for name, description in TIME_PARTS:
        values = [b[name] for b in breakdowns if not math.isnan(b.get(name, math.nan))]
        median = statistics.median(values) if values else math.nan
        lines.append(f"| {name}: {description} | {_cell(median, 1)} | {_cell(100 * median / total, 0)} % |")
    lines.append(f"| total | {_cell(total, 1)} | 100 % |")
    return "\n".join(lines)


def _run_status(records: list[dict[str, float]], steps: list[dict[str, float]], threshold: float, eval_samples: int):
    """One finished run's progress line: reward, content and evaluation before -> after, length, s/step, collapse."""
    f = run_figures(records, threshold, eval_samples)
    after, gain = f["eval_content_after"], f["eval_content_gain"]
    evaluated = f"eval content {after - gain:.3f}->{after:.3f}  " if not math.isnan(gain) else ""
    reasons = collapse_reasons(records, eval_samples)
    return (
        f"reward {steps[0].get(REWARD, math.nan):.3f}->{f['final_reward']:.3f}  "
        f"content {steps[0].get(CONTENT, math.nan):.3f}->{f['final_content']:.3f}  {evaluated}"
        f"len {steps[-1].get(LENGTH, math.nan):.1f}  {f['s_per_step']:.1f} s/step"
        + (f"  COLLAPSED ({'; '.join(reasons)})" if reasons else "")
    )


def summarize(
    runs: dict[RunKey, list[dict[str, float]]],
    methods: list[Method],
    threshold: float,
    eval_samples: int = 0,
    regimes: list[Regime] | None = None,
    jobs: dict[RunKey, int] | None = None,
) -> list[dict]:
    """Per regime and method, over its finished seeds: the `SUMMARY_FIELDS` (NaN where nothing was measured).

    ``jobs``: how many runs were in flight beside each (``--jobs``; 1 where not given). A step's time includes the
    other runs' share of the cores, so s/step is compared with ``grpo``'s only where all of both methods' runs in
    the regime ran with the same ``--jobs`` (NaN otherwise); the ``jobs`` field lists the values seen."""
    jobs = jobs or {}
    figures = {key: run_figures(steps, threshold, eval_samples) for key, steps in runs.items()}
    rows = []
    for regime in regimes or [BUILTIN_REGIMES["default"]]:
        regime_rows = []
        for method in methods:
            mine = {k.seed: f for k, f in figures.items() if k.method == method.name and k.regime == regime.name}
            runs_of = list(mine.values())
            row: dict = {"regime": regime.name, "method": method.name, "seeds": len(runs_of)}
            for name in ("final_reward", "final_content"):
                row[f"{name}_mean"], row[f"{name}_std"] = _mean_std([f[name] for f in runs_of])
            for name in ("eval_content_after", "eval_content_gain"):
                row[f"{name}_mean"], row[f"{name}_std"] = _mean_std(
                    [f[name] for f in runs_of if not math.isnan(f[name])]
                )
            grpo = {k.seed: f for k, f in figures.items() if k.method == "grpo" and k.regime == regime.name}
            paired = [
                f["eval_content_gain"] - grpo[seed]["eval_content_gain"]
                for seed, f in mine.items()
                if seed in grpo and not math.isnan(f["eval_content_gain"] - grpo[seed]["eval_content_gain"])
            ]
            row["gain_vs_grpo_mean"], row["gain_vs_grpo_std"] = _mean_std(paired)
            row["gain_vs_grpo_ci95"] = mean_interval(paired)[1]
            row["paired_seeds"] = len(paired)
            row["collapsed"] = int(sum(f["collapsed"] for f in runs_of))
            for name in ("reward_auc", "pg_clipfrac", "ppo_kl", "s_per_step"):
                row[name] = _mean_std([f[name] for f in runs_of if not math.isnan(f[name])])[0]
            reached = [f["steps_to_threshold"] for f in runs_of if not math.isnan(f["steps_to_threshold"])]
            row["steps_to_threshold"] = statistics.fmean(reached) if reached else math.nan
            row["seeds_reaching_threshold"] = len(reached)
            keys = [k for k in figures if k.method == method.name and k.regime == regime.name]
            row["jobs"] = ",".join(str(j) for j in sorted({jobs.get(k, 1) for k in keys}))
            regime_rows.append(row)
        grpo = next((r for r in regime_rows if r["method"] == "grpo"), None)
        for row in regime_rows:
            comparable = grpo is not None and row["jobs"] == grpo["jobs"] and "," not in row["jobs"]
            row["s_per_step_vs_grpo"] = row["s_per_step"] / grpo["s_per_step"] if comparable else math.nan
        rows += regime_rows
    return rows


def _cell(value: float, digits: int = 3) -> str:
    return "-" if isinstance(value, float) and math.isnan(value) else f"{value:.{digits}f}"


def _signed(value: float, digits: int = 3) -> str:
    return "-" if math.isnan(value) else f"{value:+.{digits}f}"


def summary_table(rows: list[dict], threshold: float) -> str:
    """The printed table (markdown, so it can go into the README as it is)."""
    header = (
        "| regime | method | seeds | final reward | final content | eval content | eval gain | gain - grpo (paired) "
        f"| collapsed | reward AUC | steps to {threshold:g} | pg clipfrac | ppo_kl | s/step | x grpo | runs at a time |"
    )
    lines = [header, "|" + "---|" * 16]
    for r in rows:
        reached = (
            f"{_cell(r['steps_to_threshold'], 1)} ({r['seeds_reaching_threshold']}/{r['seeds']})"
            if r["seeds_reaching_threshold"]
            else f"- (0/{r['seeds']})"
        )
        paired = (
            "reference"
            if r["method"] == "grpo"
            else f"{_signed(r['gain_vs_grpo_mean'])} +- {_cell(r['gain_vs_grpo_std'])} ({r['paired_seeds']}"
            + (
                f"; 95 % {_signed(r['gain_vs_grpo_mean'] - r['gain_vs_grpo_ci95'], 2)}.."
                f"{_signed(r['gain_vs_grpo_mean'] + r['gain_vs_grpo_ci95'], 2)})"
                if not math.isnan(r["gain_vs_grpo_ci95"])
                else ")"
            )
        )
        lines.append(
            f"| {r['regime']} | {r['method']} | {r['seeds']} "
            f"| {_cell(r['final_reward_mean'])} +- {_cell(r['final_reward_std'])} "
            f"| {_cell(r['final_content_mean'])} +- {_cell(r['final_content_std'])} "
            f"| {_cell(r['eval_content_after_mean'])} +- {_cell(r['eval_content_after_std'])} "
            f"| {_signed(r['eval_content_gain_mean'])} +- {_cell(r['eval_content_gain_std'])} "
            f"| {paired} | {r['collapsed']}/{r['seeds']} | {_cell(r['reward_auc'])} "
            f"| {reached} | {_cell(r['pg_clipfrac'])} | {_cell(r['ppo_kl'], 4)} | {_cell(r['s_per_step'], 1)} "
            f"| {_cell(r['s_per_step_vs_grpo'], 2)} | {r['jobs'] or '-'} |"
        )
    return "\n".join(lines)


def plot(
    runs: dict[RunKey, list[dict[str, float]]],
    methods: list[Method],
    path: Path,
    title: str,
    eval_samples: int = 0,
    regimes: list[Regime] | None = None,
) -> Path:
    """One row per regime: mean curve and min-max band over seeds per method, one panel per `CURVES` entry; with
    evaluations, one more panel: the evaluation's content before the first and after the last step."""
    plt = pyplot()
    import numpy as np

    regimes = regimes or [BUILTIN_REGIMES["default"]]
    evaluations = {key: split_evaluations(records, eval_samples)[1] for key, records in runs.items()}
    has_evaluations = any(len(e) > 1 for e in evaluations.values())
    panels = len(CURVES) + has_evaluations
    fig, axes = plt.subplots(len(regimes), panels, figsize=(4.2 * panels, 3.4 * len(regimes)), squeeze=False)
    for row, regime in zip(axes, regimes):
        mine = {k: v for k, v in runs.items() if k.regime == regime.name}
        for ax, (name, key) in zip(row, CURVES):
            for index, method in enumerate(methods):
                curves = [[s[key] for s in steps if key in s] for k, steps in mine.items() if k.method == method.name]
                curves = [c for c in curves if c]
                if not curves:
                    continue
                length = min(len(c) for c in curves)
                values = np.array([c[:length] for c in curves])
                xs = np.arange(1, length + 1)
                color = f"C{index}"
                ax.plot(xs, values.mean(axis=0), color=color, label=f"{method.name} ({len(curves)})")
                ax.fill_between(xs, values.min(axis=0), values.max(axis=0), color=color, alpha=0.15)
            ax.set_title(f"{regime.name}: {name}", fontsize=10)
            ax.set_xlabel("step")
        if has_evaluations:
            ax = row[-1]
            for index, method in enumerate(methods):
                pairs = [
                    [(e["step"], e["eval/content"]) for e in (ev[0], ev[-1])]
                    for k, ev in evaluations.items()
                    if k.method == method.name and k.regime == regime.name and len(ev) > 1
                ]
                if not pairs:
                    continue
                xs = [step for step, _ in pairs[0]]
                values = np.array([[value for _, value in p] for p in pairs])
                color = f"C{index}"
                ax.plot(xs, values.mean(axis=0), color=color, marker="o", label=method.name)
                ax.fill_between(xs, values.min(axis=0), values.max(axis=0), color=color, alpha=0.15)
            ax.set_title(f"{regime.name}: content, training texts ({eval_samples} each)", fontsize=10)
            ax.set_xlabel("step (before step 1, after the last)")
        row[0].legend(fontsize=7)
    save(fig, path, title)
    return path


def _load_finished(
    out: Path, expected: dict[RunKey, list[str]]
) -> tuple[dict[RunKey, list[dict[str, float]]], dict[RunKey, dict]]:
    """Runs whose ``done.json`` records the same overrides (method, seed, steps, task) as this invocation's, in
    ``expected``'s order: their steps, and their ``done.json`` records."""
    from maspo_verl.runs.launch import read_metrics

    runs, records = {}, {}
    for key, overrides in expected.items():
        done = key.dir(out) / "done.json"
        if done.exists() and (record := json.loads(done.read_text())).get("overrides") == overrides:
            runs[key], records[key] = read_metrics(key.dir(out) / "metrics.jsonl"), record
    return runs, records


def _jobs_of(records: dict[RunKey, dict]) -> dict[RunKey, int]:
    """``--jobs`` of each finished run, from its ``done.json`` record (1 for runs from before the option)."""
    return {key: record.get("jobs", 1) for key, record in records.items()}


def write_results(out: Path, runs: dict[RunKey, list[dict[str, float]]], rows: list[dict]) -> None:
    with open(out / "runs.jsonl", "w") as f:
        for key, steps in runs.items():
            for step in steps:
                f.write(json.dumps({"regime": key.regime, "method": key.method, "seed": key.seed, **step}) + "\n")
    with open(out / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=SUMMARY_FIELDS)
        writer.writeheader()
        writer.writerows(rows)


def main(argv: list[str]) -> int:
    from maspo_verl.runs.launch import run_trainer
    from maspo_verl.runs.synthetic_run import TASK_DEFAULTS, prepare_task, task_overrides, task_paths

    args = parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    task_dir = out / "task"
    shape = {"batch": args.batch, "n": args.n, "mini_batches": args.mini_batches, "eval_samples": args.eval_samples}
    base = task_overrides(task_paths(task_dir), steps=args.steps, seed=0, **shape)
    for regime in args.regimes:  # before anything is built or run
        try:
            validate_methods(args.methods, [*base, *regime.overrides])
        except MethodError as exc:
            print(f"[ablate] --regime {regime.name!r}: {exc}", file=sys.stderr)
            return 2
    texts = TASK_DEFAULTS["texts"]
    task_settings = {"task_seed": args.task_seed, "warm_start_steps": args.warm_start_steps, "texts": texts}
    marker = task_dir / "task.json"
    if marker.exists() and json.loads(marker.read_text()) != task_settings:
        print(
            f"[ablate] {task_dir} was built with {marker.read_text().strip()}, not {task_settings}: use another --out",
            file=sys.stderr,
        )
        return 2
    if not marker.exists():
        print(f"[ablate] building the task once (tiny Llasa, warm start, data) in {task_dir}", flush=True)
    task = prepare_task(
        task_dir, warm_start_steps=args.warm_start_steps, n_train=texts, seed=args.task_seed, reuse=marker.exists()
    )
    marker.write_text(json.dumps(task_settings))

    def overrides_of(method: Method, regime: Regime, seed: int) -> list[str]:
        return [*task_overrides(task, steps=args.steps, seed=seed, **shape), *regime.overrides, *method.overrides]

    print(
        f"[ablate] methods valid: {', '.join(m.name for m in args.methods)}; "
        f"regimes {', '.join(r.name for r in args.regimes)}; seeds {args.seeds}",
        flush=True,
    )

    keys = [RunKey(m.name, seed, r.name) for r in args.regimes for seed in args.seeds for m in args.methods]
    methods = {m.name: m for m in args.methods}
    regimes = {r.name: r for r in args.regimes}
    run_overrides = {key: overrides_of(methods[key.method], regimes[key.regime], key.seed) for key in keys}
    finished, records = _load_finished(out, run_overrides)
    if finished:
        print(f"[ablate] resuming: {len(finished)}/{len(keys)} runs already finished in {out}", flush=True)
    failed = []
    interrupted = False
    cancel = threading.Event()

    def run_one(key: RunKey):
        workdir = key.dir(out)
        (workdir / "done.json").unlink(missing_ok=True)
        started = time.time()
        return run_trainer(run_overrides[key], workdir, timeout=args.timeout, cancel=cancel), started

    pending = [key for key in keys if key not in finished]
    pool = ThreadPoolExecutor(max_workers=args.jobs, thread_name_prefix="ablate-run")
    try:
        futures = {pool.submit(run_one, key): key for key in pending}
        for future in as_completed(futures):
            key = futures[future]
            run, started = future.result()
            steps = split_evaluations(run.steps, args.eval_samples)[0]
            if run.ok and len(steps) == args.steps:
                finished[key] = run.steps
                records[key] = record = {
                    "wall_seconds": run.wall_seconds,
                    "overrides": run_overrides[key],
                    "time_s": time_breakdown(run, steps),
                    "started": started,
                    "jobs": args.jobs,
                }
                (key.dir(out) / "done.json").write_text(json.dumps(record))
                status = _run_status(run.steps, steps, args.threshold, args.eval_samples)
            else:
                failed.append(key)
                status = f"FAILED (exit {run.returncode}, {len(steps)} steps); log: {run.log_path}"
            print(
                f"[ablate] {key.regime} {key.method} seed {key.seed}: {status}  [{run.wall_seconds:.0f}s]\n"
                f"[ablate] progress: {len(finished)}/{len(keys)} runs finished, {len(failed)} failed, "
                f"{(time.monotonic() - start) / 60:.1f} min",
                flush=True,
            )
            rows = summarize(finished, args.methods, args.threshold, args.eval_samples, args.regimes, _jobs_of(records))
            write_results(out, finished, rows)
    except KeyboardInterrupt:  # stop the runs in flight, report what finished; the same command resumes
        interrupted = True
        cancel.set()
        print(f"\n[ablate] interrupted: {len(finished)}/{len(keys)} runs finished; run the same command to resume")
    finally:
        pool.shutdown(wait=True, cancel_futures=True)

    rows = summarize(finished, args.methods, args.threshold, args.eval_samples, args.regimes, _jobs_of(records))
    write_results(out, finished, rows)
    table = summary_table(rows, args.threshold)
    breakdowns = [record["time_s"] for record in records.values() if record.get("time_s")]
    if breakdowns:
        table += "\n\nWhere a run's time goes:\n\n" + time_table(breakdowns)
    (out / "summary.md").write_text(table + "\n")
    print()
    print(table)
    png = plot(
        finished,
        args.methods,
        out / "ablation.png",
        f"maspo-verl ablate: synthetic TTS, tiny Llasa, seeds {','.join(map(str, args.seeds))}",
        args.eval_samples,
        args.regimes,
    )
    print(f"\n[ablate] table: {out / 'summary.csv'}\n[ablate] plot: {png}\n[ablate] every step: {out / 'runs.jsonl'}")
    if failed:
        print(f"[ablate] {len(failed)} run(s) failed; run the same command again to retry them", file=sys.stderr)
        return 1
    return 130 if interrupted else 0
