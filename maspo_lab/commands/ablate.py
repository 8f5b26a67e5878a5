"""``maspo-verl ablate``: a grid of methods x regimes x seeds through veRL's real trainer on CPU, on a task
(``--task``, `maspo_lab.runs.tasks`): ``speech`` (default; mini-llasa heard by Whisper tiny.en, the real speech
reward) or ``synthetic`` (the tiny Llasa-shaped model on the synthetic TTS task).

Every run uses the same task (speech: the shipped mini-llasa and the data; synthetic: data, tiny model and
warm-start checkpoint; built once under ``<out>/task``) and the same seeds, so within a regime
(`maspo_lab.regimes`: ``default``, ``stale``, ``hot``, defined for each task) the only difference between runs of a
seed is the method (`maspo_lab.methods`, as the task runs it). Before any run, each method's overrides are composed
with veRL's config under each regime and validated; a bad one fails naming the method or the regime.

Per finished run one progress line (its final figures) and the overall progress; a finished run (``done.json``
in its directory) is not run again when the command is repeated with the same ``--out``. ``--jobs N`` runs N at a
time (each its own trainer and Ray instance); Ctrl-C stops the runs in flight. Results:

- ``runs.jsonl``: every metric of every step of every finished run, one line per step (``method``, ``seed``);
- ``summary.csv`` and the printed table, per regime and method over seeds: final reward and content (mean and sd,
  printed ``mean (sd x)``), content on each evaluated set (synthetic: the training texts; speech: the training
  sentences and the held-out ones, reported apart) after training and its gain over the same evaluation before
  training (``--eval-samples`` responses per text; mean and sd), the gain's paired difference to ``grpo`` of the
  same seed and regime (mean and sd over the seeds both finished, and its 95 % t interval), how many runs collapsed
  (`maspo_lab.analysis.ablation.collapse_reasons`), area under the reward curve (mean reward over the steps), steps
  to reach ``--threshold`` (mean over the seeds that reached it, and how many did), pg clip fraction and ppo_kl
  (means over steps), seconds per step (median over steps after the first, which holds one-time start-up work) and
  its ratio to ``grpo``'s in the same regime;
- ``ablation.png``: per regime (a row), mean curve and min-max band over seeds per method, for reward, content,
  length, clip fraction, and per evaluated set the evaluation's content before and after training.

Content is the task's (`maspo_lab.runs.tasks`): synthetic 1 - unit error rate; speech 1 - CER (the reward's
clipped ``speech_error_rate``), read from veRL's validation metrics per data source.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from maspo_lab.analysis.ablation import (
    evaluation_rows,
    evaluation_table,
    plot,
    run_status,
    summarize,
    summary_table,
    time_breakdown,
    time_table,
    write_results,
)
from maspo_lab.analysis.training_metrics import training_steps
from maspo_lab.methods import (
    DEFAULT_GRID,
    MethodError,
    method_help,
    parse_methods,
    validate_methods,
)
from maspo_lab.regimes import DEFAULT_REGIMES, builtin_regimes, parse_regimes
from maspo_lab.runs.grid import Launch, RunKey, jobs_of, load_finished, mark_finished, run_grid
from maspo_lab.runs.launch import run_folder
from maspo_lab.runs.task import Task, TaskFiles
from maspo_lab.runs.tasks import (
    add_eval_samples_argument,
    add_task_argument,
    check_run_shape,
    task_named,
    task_of,
)


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds {text!r}: expected comma-separated integers, e.g. 0,1,2") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"--seeds {text!r}: expected distinct integers, e.g. 0,1,2")
    return seeds


def parse_args(argv: list[str]) -> argparse.Namespace:
    task = task_of(argv)
    d = task.defaults
    parser = argparse.ArgumentParser(
        prog="maspo-verl ablate",
        description="Compare policy-optimisation methods x regimes x seeds with veRL's real trainer on CPU, on the "
        "speech task (mini-llasa, Whisper tiny.en reward) or the synthetic TTS task.",
    )
    add_task_argument(parser)
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
        help="a built-in ("
        + "; ".join(f"{r.name}: {r.description}" for r in builtin_regimes(task.name).values())
        + f") or NAME:key=value,key=value (run-shape overrides); repeatable (default: {' '.join(DEFAULT_REGIMES)})",
    )
    parser.add_argument("--seeds", type=parse_seeds, default=[0, 1, 2], help="comma-separated (default 0,1,2)")
    parser.add_argument("--steps", type=int, default=d["steps"], help="training steps per run")
    parser.add_argument("--threshold", type=float, default=0.5, help="reward level for 'steps to threshold'")
    parser.add_argument("--out", type=run_folder, default=run_folder("ablation"), help="output directory (resumable)")
    task.add_build_arguments(parser)
    parser.add_argument("--batch", type=int, default=d["batch"], help="prompts per step")
    parser.add_argument("--n", type=int, default=d["n"], help="responses per prompt")
    parser.add_argument("--mini-batches", type=int, default=d["mini_batches"], help="actor updates per step")
    add_eval_samples_argument(parser, d["eval_samples"])
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help=f"seconds before a run is stopped (default {task.timeout_s} per {d['steps']} steps started, times "
        "--jobs: a run's cores are shared)",
    )
    parser.add_argument(
        "--eval-every",
        type=int,
        default=None,
        help="evaluate every N steps too (it must divide --steps; default: before the first step and after the last)",
    )
    parser.add_argument(
        "--save-every",
        type=int,
        default=None,
        help="save veRL's checkpoint every N steps (the latest kept): an interrupted run resumes from it when the "
        "command is repeated (default: no checkpoint; an unfinished run starts again)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="runs at a time (default 1). A run's processes take turns (rollout, reward, update) and leave part of "
        "2 cores idle (what 2 at a time gains: docs/evidence.md). A seed's evaluation before step 1 and "
        "first rollout are the same either way (later figures drift by timing, as any run's do); s/step includes "
        "the other runs' share of the cores and is compared only at the same --jobs",
    )
    args = parser.parse_args(argv)
    _check(parser, args, task)
    return args


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace, task: Task) -> None:
    """Refuse bad values naming the flag; fill in what follows from the others (the time limit, the task's settings,
    the methods and regimes as the task runs them)."""
    d = task.defaults
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: expected a positive number of runs at a time")
    if args.save_every is not None and args.save_every < 1:
        parser.error(f"--save-every {args.save_every}: expected a positive number of steps")
    check_run_shape(parser, args)
    if args.timeout is None:
        args.timeout = task.timeout_s * math.ceil(args.steps / d["steps"]) * args.jobs
    try:
        args.task_settings = task.build_settings(args)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        args.methods = [task.method(m) for m in parse_methods(args.method or DEFAULT_GRID)]
        args.regimes = parse_regimes(args.regime or DEFAULT_REGIMES, task.name)
    except MethodError as exc:
        parser.error(str(exc))


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    task, task_name = task_named(args.task), args.task
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    task_dir = out / "task"
    shape = {"batch": args.batch, "n": args.n, "mini_batches": args.mini_batches, "eval_samples": args.eval_samples}
    if args.eval_every:
        shape["eval_every"] = args.eval_every
    base = task.overrides(task.paths(task_dir), steps=args.steps, seed=0, **shape)
    for regime in args.regimes:  # before anything is built or run
        try:
            validate_methods(args.methods, [*base, *regime.overrides])
        except MethodError as exc:
            print(f"[ablate] --regime {regime.name!r}: {exc}", file=sys.stderr)
            return 2
    files = build_task(task, task_dir, args.task_settings)
    if files is None:
        return 2
    print(
        f"[ablate] task {task_name}; methods valid: {', '.join(m.name for m in args.methods)}; "
        f"regimes {', '.join(r.name for r in args.regimes)}; seeds {args.seeds}",
        flush=True,
    )
    keys = [RunKey(m.name, seed, r.name) for r in args.regimes for seed in args.seeds for m in args.methods]
    run_overrides = grid_overrides(args, task, files, shape, keys)
    finished, records = load_finished(out, run_overrides)
    if finished:
        print(f"[ablate] resuming: {len(finished)}/{len(keys)} runs already finished in {out}", flush=True)
    failed: list[RunKey] = []

    def report() -> list[dict]:
        rows = summarize(
            finished, args.methods, args.threshold, args.eval_samples, args.regimes, jobs_of(records), task=task_name
        )
        write_results(out, finished, rows, task_name)
        return rows

    def finish(key: RunKey, run, launch: Launch) -> None:
        steps = training_steps(run.steps)
        if run.ok and len(steps) == args.steps:
            finished[key] = run.steps
            records[key] = {
                "wall_seconds": run.wall_seconds,
                "overrides": run_overrides[key],
                "time_s": time_breakdown(run, steps),
                "started": launch.started,
                "jobs": args.jobs,
                "runs_in_flight_at_start": launch.alongside,
            }
            mark_finished(out, key, records[key])
            status = run_status(run.steps, steps, args.threshold, args.eval_samples, task_name)
        else:
            failed.append(key)
            status = f"FAILED (exit {run.returncode}, {len(steps)} steps); log: {run.log_path}"
        print(
            f"[ablate] {key.regime} {key.method} seed {key.seed}: {status}  [{run.wall_seconds:.0f}s]\n"
            f"[ablate] progress: {len(finished)}/{len(keys)} runs finished, {len(failed)} failed, "
            f"{(time.monotonic() - start) / 60:.1f} min",
            flush=True,
        )
        report()

    pending = [key for key in keys if key not in finished]
    interrupted = run_grid(
        pending, run_overrides, out, finish, jobs=args.jobs, timeout=args.timeout, resume=bool(args.save_every)
    )
    if interrupted:  # the runs in flight were stopped; the same command resumes
        print(f"\n[ablate] interrupted: {len(finished)}/{len(keys)} runs finished; run the same command to resume")
    print_summary(args, task, out, report(), finished, records)
    if failed:
        print(f"[ablate] {len(failed)} run(s) failed; run the same command again to retry them", file=sys.stderr)
        return 1
    return 130 if interrupted else 0


def build_task(task: Task, task_dir: Path, task_settings: dict) -> TaskFiles | None:
    """The task built once under ``task_dir`` (reused when built with the same settings); None, said on stderr, when
    ``task_dir`` holds a task built with other settings."""
    marker = task_dir / "task.json"
    if marker.exists() and json.loads(marker.read_text()) != task_settings:
        print(
            f"[ablate] {task_dir} was built with {marker.read_text().strip()}, not {task_settings}: use another --out",
            file=sys.stderr,
        )
        return None
    if not marker.exists():
        print(f"[ablate] building the task once ({task.description}: {task_settings}) in {task_dir}", flush=True)
    files = task.build(task_dir, task_settings, reuse=marker.exists())
    marker.write_text(json.dumps(task_settings))
    return files


def grid_overrides(args, task: Task, files: TaskFiles, shape: dict, keys: list[RunKey]) -> dict[RunKey, list[str]]:
    """Each run's overrides: the task's run at its seed, its validation dumps' folder, checkpointing
    (``--save-every``), then the regime's and the method's."""
    saving = [f"trainer.save_freq={args.save_every}", "trainer.max_actor_ckpt_to_keep=1"] if args.save_every else []
    methods = {m.name: m for m in args.methods}
    regimes = {r.name: r for r in args.regimes}
    overrides = {}
    for key in keys:
        run = task.overrides(files, steps=args.steps, seed=key.seed, **shape)
        dumps = key.validation_dir(args.out)  # every evaluated response
        overrides[key] = [
            *run,
            f"trainer.validation_data_dir={dumps}",
            *saving,
            *regimes[key.regime].overrides,
            *methods[key.method].overrides,
        ]
    return overrides


def print_summary(args, task: Task, out: Path, rows: list[dict], finished: dict, records: dict) -> None:
    """``summary.md`` and the printed table of ``rows`` (`summarize`; with the paired evaluations and where a run's
    time goes), and the plot."""
    table = summary_table(rows, args.threshold, task=args.task)
    evaluated = evaluation_rows(out, finished, args.task)
    if evaluated:
        table += "\n\nEvaluations paired by sentence, both ears (last evaluation against the first):\n\n"
        table += evaluation_table(evaluated, finished)
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
        f"maspo-verl ablate: {task.description}, seeds {','.join(map(str, args.seeds))}",
        args.eval_samples,
        args.regimes,
        task=args.task,
    )
    print(f"\n[ablate] table: {out / 'summary.csv'}\n[ablate] plot: {png}\n[ablate] every step: {out / 'runs.jsonl'}")
