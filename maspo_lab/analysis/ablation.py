"""What ``maspo-verl ablate`` reports about a grid of runs: each run's figures, the summary over seeds per regime and
method (``summary.csv``, the printed table), the evaluations paired by sentence (``evaluations.csv``), the long-run
files, and the plot (``ablation.png``). The command's docstring says what each figure is; the runs themselves are
`maspo_lab.runs.grid`'s.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections.abc import Iterable
from pathlib import Path

from maspo_lab.analysis.summary import mean_interval
from maspo_lab.analysis.training_metrics import CLIP, ENTROPY, KL, LENGTH, REWARD, STEP_TIME, training_steps
from maspo_lab.figures import pyplot, save
from maspo_lab.methods import (
    Method,
)
from maspo_lab.regimes import DEFAULT_REGIME, Regime
from maspo_lab.runs.grid import RunKey
from maspo_lab.runs.tasks import task_named

COLLAPSE_DROP = 0.20
"""A run collapsed if, on any evaluated set, the evaluation's content or valid rate (synthetic: the end-tag rate;
speech: the share of responses the reward scored, ``speech_valid``) after training fell this far below the
evaluation before it (docs/evidence.md: what healthy and collapsed runs lose)..."""
ENTROPY_BAND = (0.5, 2.0)
"""... or if the actor's entropy at some step left this band around its first step's value (that collapse: 2.8 ->
10.6), or was not finite. Chosen on the synthetic task and used unchanged on speech."""
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
"""The columns of ``summary.csv``; a task with more than one evaluated set adds `set_fields` of the others after
``paired_seeds`` (speech: ``heldout_*``)."""


def set_fields(name: str, first: bool) -> dict[str, str]:
    """The figure names of evaluated set ``name``: content after training, its gain, the gain's paired difference to
    ``grpo`` and the number of seeds paired. The first set (the training texts) keeps the names ``eval_content_*``,
    ``gain_vs_grpo``, ``paired_seeds``; another set is prefixed by its name (``heldout_content_after``, ...)."""
    if first:
        return {
            "after": "eval_content_after",
            "gain": "eval_content_gain",
            "vs": "gain_vs_grpo",
            "paired": "paired_seeds",
        }
    return {
        "after": f"{name}_content_after",
        "gain": f"{name}_content_gain",
        "vs": f"{name}_gain_vs_grpo",
        "paired": f"{name}_paired_seeds",
    }


def eval_sets(task: str) -> list[tuple[str, str, dict[str, str]]]:
    """``(set, label, set_fields)`` per set the task's evaluation scores, the training texts first."""
    sets = task_named(task).eval_sets
    return [(name, label, set_fields(name, i == 0)) for i, (name, label) in enumerate(sets.items())]


def summary_fields(task: str) -> tuple[str, ...]:
    """`SUMMARY_FIELDS` with the columns of the task's other evaluated sets."""
    more = []
    for _, _, f in eval_sets(task)[1:]:
        more += [f"{f['after']}_mean", f"{f['after']}_std", f"{f['gain']}_mean", f"{f['gain']}_std"]
        more += [f"{f['vs']}_mean", f"{f['vs']}_std", f"{f['vs']}_ci95", f["paired"]]
    at = SUMMARY_FIELDS.index("paired_seeds") + 1
    return (*SUMMARY_FIELDS[:at], *more, *SUMMARY_FIELDS[at:])


def curves(task: str) -> tuple[tuple[str, object], ...]:
    """The per-step panels: a title and a function of a step's record (NaN where not logged)."""
    on_task = task_named(task)
    nan = math.nan
    return (
        ("reward", lambda r: r.get(REWARD, nan)),
        (f"content ({on_task.content})", on_task.step_content),
        ("response length (tokens)", lambda r: r.get(LENGTH, nan)),
        ("pg clip fraction", lambda r: r.get(CLIP, nan)),
    )


def evaluations_by_set(records: list[dict[str, float]], eval_samples: int, task: str) -> dict[str, list[dict]]:
    """The task's `evaluation_figures` per evaluated set, by step."""
    out: dict[str, list[dict]] = {name: [] for name in task_named(task).eval_sets}
    for figures in task_named(task).evaluation_figures(records, eval_samples):
        out.setdefault(figures["set"], []).append(figures)
    return {name: sorted(found, key=lambda e: e["step"]) for name, found in out.items()}


def _mean_std(values: list[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def collapse_reasons(records: list[dict[str, float]], eval_samples: int, *, task: str) -> list[str]:
    """Why a run counts as collapsed (empty: it did not): on some evaluated set of the task, the evaluation's
    content or valid rate (synthetic: end tag; speech: responses scored) fell `COLLAPSE_DROP` below the evaluation
    before training, or the entropy left `ENTROPY_BAND` x its first step's. A reason names the set when the task
    evaluates more than one (``heldout content 0.42->0.12``)."""
    on_task = task_named(task)
    evaluations = evaluations_by_set(records, eval_samples, task)
    reasons = []
    for name, found in evaluations.items():
        if len(found) < 2 or found[0]["step"] != 0:
            continue
        before, after = found[0], found[-1]
        where = f"{name} " if len(on_task.eval_sets) > 1 else ""
        for part, label in (("content", "content"), ("valid", on_task.valid)):
            if part in before and part in after and not after[part] >= before[part] - COLLAPSE_DROP:
                reasons.append(f"{where}{label} {before[part]:.2f}->{after[part]:.2f}")
    entropies = [s[ENTROPY] for s in training_steps(records) if ENTROPY in s]
    low, high = ENTROPY_BAND
    outside = [e for e in entropies[1:] if not low * entropies[0] <= e <= high * entropies[0]]
    if entropies and outside:
        reasons.append(f"entropy {entropies[0]:.2f}->{outside[0]:.2f}")
    return reasons


def run_figures(records: list[dict[str, float]], threshold: float, eval_samples: int, *, task: str) -> dict[str, float]:
    """One run's figures: final reward/content, per evaluated set the evaluation's content after training and its
    gain over the evaluation before (NaN without both; `set_fields` names them), reward AUC, first step at
    ``threshold``, clip, kl, s/step, collapse."""
    on_task = task_named(task)
    steps = training_steps(records)
    evaluations = evaluations_by_set(records, eval_samples, task)
    figures: dict[str, float] = {}
    for name, _, fields in eval_sets(task):
        found = evaluations.get(name, [])
        before = found[0]["content"] if len(found) > 1 and found[0]["step"] == 0 else math.nan
        after = found[-1]["content"] if len(found) > 1 else math.nan
        figures[fields["after"]], figures[fields["gain"]] = after, after - before

    def series(key: str) -> list[float]:
        return [s[key] for s in steps if key in s]

    rewards = series(REWARD)
    reached = [int(s["step"]) for s in steps if s.get(REWARD, -math.inf) >= threshold]
    times = series(STEP_TIME)
    return {
        "final_reward": rewards[-1] if rewards else math.nan,
        "final_content": on_task.step_content(steps[-1]) if steps else math.nan,
        **figures,
        "reward_auc": statistics.fmean(rewards) if rewards else math.nan,
        "steps_to_threshold": float(reached[0]) if reached else math.nan,
        "pg_clipfrac": statistics.fmean(series(CLIP)) if series(CLIP) else math.nan,
        "ppo_kl": statistics.fmean(series(KL)) if series(KL) else math.nan,
        "s_per_step": statistics.median(times[1:] or times) if times else math.nan,
        "collapsed": float(bool(collapse_reasons(records, eval_samples, task=task))),
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
    the `maspo_lab.runs.launch.MILESTONES` of ``run`` (a `TrainerRun`) and veRL's timings in ``records``. A resumed
    run's time is its last attempt's: the steps after the checkpoint it resumed from; ``{}`` when that attempt
    trained none (its checkpoint was at the last step)."""
    marks = run.milestones
    steps = [r for r in records if STEP_TIME in r and r["step"] > run.resumed_from_step]
    if not steps:
        return {}
    trained = sum(r[STEP_TIME] for r in steps)
    testing = steps[-1].get("timing_s/testing", 0.0)
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


def run_status(
    records: list[dict[str, float]], steps: list[dict[str, float]], threshold: float, eval_samples: int, task: str
):
    """One finished run's progress line: reward, content and evaluation before -> after, length, s/step, collapse."""
    f = run_figures(records, threshold, eval_samples, task=task)
    evaluated = ""
    for name, _, fields in eval_sets(task):
        after, gain = f[fields["after"]], f[fields["gain"]]
        where = f"{name} " if len(eval_sets(task)) > 1 else ""
        evaluated += f"eval {where}content {after - gain:.3f}->{after:.3f}  " if not math.isnan(gain) else ""
    reasons = collapse_reasons(records, eval_samples, task=task)
    first_content = task_named(task).step_content(steps[0])
    return (
        f"reward {steps[0].get(REWARD, math.nan):.3f}->{f['final_reward']:.3f}  "
        f"content {first_content:.3f}->{f['final_content']:.3f}  {evaluated}"
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
    *,
    task: str,
) -> list[dict]:
    """Per regime and method, over its finished seeds: the `summary_fields` of ``task`` (NaN where nothing was
    measured); per evaluated set, the content after training, its gain, and the gain's paired difference to
    ``grpo``'s of the same seed and regime (mean, std, 95 % t interval's half-width, seeds paired).

    ``jobs``: how many runs were in flight beside each (``--jobs``; 1 where not given). A step's time includes the
    other runs' share of the cores, so s/step is compared with ``grpo``'s only where all of both methods' runs in
    the regime ran with the same ``--jobs`` (NaN otherwise); the ``jobs`` field lists the values seen."""
    jobs = jobs or {}
    figures = {key: run_figures(steps, threshold, eval_samples, task=task) for key, steps in runs.items()}
    rows = []
    for regime in regimes or [DEFAULT_REGIME]:
        regime_rows = []
        for method in methods:
            mine = {k.seed: f for k, f in figures.items() if k.method == method.name and k.regime == regime.name}
            runs_of = list(mine.values())
            row: dict = {"regime": regime.name, "method": method.name, "seeds": len(runs_of)}
            for name in ("final_reward", "final_content"):
                row[f"{name}_mean"], row[f"{name}_std"] = _mean_std([f[name] for f in runs_of])
            grpo = {k.seed: f for k, f in figures.items() if k.method == "grpo" and k.regime == regime.name}
            for _, _, fields in eval_sets(task):
                for name in (fields["after"], fields["gain"]):
                    row[f"{name}_mean"], row[f"{name}_std"] = _mean_std(
                        [f[name] for f in runs_of if not math.isnan(f[name])]
                    )
                gain = fields["gain"]
                paired = [
                    f[gain] - grpo[seed][gain]
                    for seed, f in mine.items()
                    if seed in grpo and not math.isnan(f[gain] - grpo[seed][gain])
                ]
                vs = fields["vs"]
                row[f"{vs}_mean"], row[f"{vs}_std"] = _mean_std(paired)
                row[f"{vs}_ci95"] = mean_interval(paired)[1]
                row[fields["paired"]] = len(paired)
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


def _sd_cell(mean: str, std: float) -> str:
    """``mean (sd std)``: the spread over seeds as a standard deviation, named so, since "+-" in this project's
    tables is a 95 % half-width; "-" without a mean."""
    return "-" if mean == "-" else f"{mean} (sd {_cell(std)})"


def _paired_cell(r: dict, fields: dict[str, str]) -> str:
    """The paired difference to ``grpo``: mean, its sd over the paired seeds, how many, and the 95 % t interval
    ``mean +- t_{0.975, n-1} sd / sqrt(n)`` written as its two ends."""
    vs = fields["vs"]
    if r["method"] == "grpo":
        return "reference"
    mean, interval, seeds = r[f"{vs}_mean"], r[f"{vs}_ci95"], r[fields["paired"]]
    if math.isnan(mean):
        return f"- ({seeds})"
    ends = f"; 95 % {_signed(mean - interval, 2)}..{_signed(mean + interval, 2)}" if not math.isnan(interval) else ""
    return f"{_signed(mean)} (sd {_cell(r[f'{vs}_std'])}; {seeds}{ends})"


def summary_table(rows: list[dict], threshold: float, *, task: str) -> str:
    """The printed table (markdown, so it can go into the README as it is); per evaluated set of ``task``: eval
    content, eval gain and the gain's paired difference to ``grpo`` (the set named in the header when the task
    evaluates more than one). Spreads over seeds are standard deviations, written ``mean (sd x)``; the paired
    difference adds its seeds and its 95 % t interval's ends (`_paired_cell`)."""
    sets = eval_sets(task)
    evaluated = ""
    for _, label, _ in sets:
        where = f" ({label})" if len(sets) > 1 else ""
        evaluated += f"| eval content{where} | eval gain{where} | gain - grpo{where} (paired) "
    header = (
        f"| regime | method | seeds | final reward | final content {evaluated}"
        f"| collapsed | reward AUC | steps to {threshold:g} | pg clipfrac | ppo_kl | s/step | x grpo | runs at a time |"
    )
    lines = [header, "|" + "---|" * (13 + 3 * len(sets))]
    for r in rows:
        reached = (
            f"{_cell(r['steps_to_threshold'], 1)} ({r['seeds_reaching_threshold']}/{r['seeds']})"
            if r["seeds_reaching_threshold"]
            else f"- (0/{r['seeds']})"
        )
        cells = "".join(
            f"| {_sd_cell(_cell(r[f['after'] + '_mean']), r[f['after'] + '_std'])} "
            f"| {_sd_cell(_signed(r[f['gain'] + '_mean']), r[f['gain'] + '_std'])} | {_paired_cell(r, f)} "
            for _, _, f in sets
        )
        lines.append(
            f"| {r['regime']} | {r['method']} | {r['seeds']} "
            f"| {_sd_cell(_cell(r['final_reward_mean']), r['final_reward_std'])} "
            f"| {_sd_cell(_cell(r['final_content_mean']), r['final_content_std'])} "
            f"{cells}| {r['collapsed']}/{r['seeds']} | {_cell(r['reward_auc'])} "
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
    *,
    task: str,
) -> Path:
    """One row per regime: mean curve and min-max band over seeds per method, one panel per `curves` entry; with
    evaluations, one more panel per evaluated set: the evaluation's content before the first and after the last
    step."""
    plt = pyplot()
    import numpy as np

    regimes = regimes or [DEFAULT_REGIME]
    evaluations = {key: evaluations_by_set(records, eval_samples, task) for key, records in runs.items()}
    sets = [
        (name, label)
        for name, label, _ in eval_sets(task)
        if any(len(e.get(name, [])) > 1 for e in evaluations.values())
    ]
    panels = curves(task)
    width = len(panels) + len(sets)
    fig, axes = plt.subplots(len(regimes), width, figsize=(4.2 * width, 3.4 * len(regimes)), squeeze=False)
    for row, regime in zip(axes, regimes):
        mine = {k: v for k, v in runs.items() if k.regime == regime.name}
        for ax, (name, value_of) in zip(row, panels):
            for index, method in enumerate(methods):
                series = [
                    [value_of(s) for s in training_steps(steps)] for k, steps in mine.items() if k.method == method.name
                ]
                series = [[v for v in c if not math.isnan(v)] for c in series]
                series = [c for c in series if c]
                if not series:
                    continue
                length = min(len(c) for c in series)
                values = np.array([c[:length] for c in series])
                xs = np.arange(1, length + 1)
                color = f"C{index}"
                ax.plot(xs, values.mean(axis=0), color=color, label=f"{method.name} ({len(series)})")
                ax.fill_between(xs, values.min(axis=0), values.max(axis=0), color=color, alpha=0.15)
            ax.set_title(f"{regime.name}: {name}", fontsize=10)
            ax.set_xlabel("step")
        for ax, (set_name, label) in zip(row[len(panels) :], sets):
            for index, method in enumerate(methods):
                pairs = [
                    [(e["step"], e["content"]) for e in (ev[set_name][0], ev[set_name][-1])]
                    for k, ev in evaluations.items()
                    if k.method == method.name and k.regime == regime.name and len(ev.get(set_name, [])) > 1
                ]
                if not pairs:
                    continue
                xs = [step for step, _ in pairs[0]]
                values = np.array([[value for _, value in p] for p in pairs])
                color = f"C{index}"
                ax.plot(xs, values.mean(axis=0), color=color, marker="o", label=method.name)
                ax.fill_between(xs, values.min(axis=0), values.max(axis=0), color=color, alpha=0.15)
            ax.set_title(f"{regime.name}: content, {label} ({eval_samples} each)", fontsize=10)
            ax.set_xlabel("step (before step 1, after the last)")
        row[0].legend(fontsize=7)
    save(fig, path, title)
    return path


EVALUATION_FIELDS = ("regime", "method", "seed", "source", "ear", "step", "before", "after", "change", "ci95")
EVALUATION_FIELDS += ("sentences", "repeats")
"""The columns of ``evaluations.csv`` (`maspo_lab.analysis.evaluations.changes` per run)."""


def evaluation_rows(out: Path, runs: Iterable[RunKey], task: str) -> list[dict]:
    """Per finished run of the speech task, every evaluation's paired change from the one before training, by both
    ears (`maspo_lab.analysis.evaluations`); none on a task without per-sentence dumps."""
    if task != "speech":
        return []
    from maspo_lab.analysis.evaluations import changes, heard
    from maspo_lab.runs.speech_run import evaluated_sources, task_paths

    sources = evaluated_sources(task_paths(out / "task"))
    rows = []
    for key in runs:
        found = heard(key.validation_dir(out), sources)
        rows += [{"regime": key.regime, "method": key.method, "seed": key.seed, **r} for r in changes(found)]
    return rows


def evaluation_table(rows: list[dict], runs: dict[RunKey, list[dict[str, float]]]) -> str:
    """Markdown, one line per run: per set and ear the CER change from the first evaluation to the last with its
    95 % interval over sentences (`evaluation_rows`), and the run's mean ppo_kl, clip fraction, response length
    over its last 5 steps and its s/step (median)."""
    last: dict[tuple, dict] = {}
    for r in rows:
        key = (r["regime"], r["method"], r["seed"], r["source"], r["ear"])
        if r["step"] >= last.get(key, {"step": -1})["step"]:
            last[key] = r
    columns = sorted({(source, ear) for (*_, source, ear) in last}, key=lambda c: (c[0].endswith("heldout"), c[1]))
    names = [f"{source.rpartition('/')[2]} {ear}" for source, ear in columns]
    lines = [
        "| regime | method | seed | "
        + " | ".join(f"{n}: before -> after, change (95 %)" for n in names)
        + " | ppo_kl | clip | length (last 5) | s/step |",
        "|---|---|---|" + "---|" * len(names) + "---|---|---|---|",
    ]
    for key, steps in sorted(runs.items(), key=lambda kv: (kv[0].regime, kv[0].method, kv[0].seed)):
        cells = []
        for source, ear in columns:
            r = last.get((key.regime, key.method, key.seed, source, ear))
            cells.append(
                "-"
                if r is None
                else f"{r['before']:.3f} -> {r['after']:.3f}, {r['change']:+.3f} ({r['change'] - r['ci95']:+.3f} .. "
                f"{r['change'] + r['ci95']:+.3f})"
            )
        trained = training_steps(steps)
        kl = statistics.fmean(s[KL] for s in trained if KL in s) if any(KL in s for s in trained) else math.nan
        clip = statistics.fmean(s[CLIP] for s in trained if CLIP in s) if any(CLIP in s for s in trained) else math.nan
        tail = [s[LENGTH] for s in trained[-5:] if LENGTH in s]
        times = [s[STEP_TIME] for s in trained[1:] if STEP_TIME in s]
        lines.append(
            f"| {key.regime} | {key.method} | {key.seed} | "
            + " | ".join(cells)
            + f" | {_cell(kl, 4)} | {_cell(clip, 3)} | {_cell(statistics.fmean(tail) if tail else math.nan, 1)} | "
            f"{_cell(statistics.median(times) if times else math.nan, 1)} |"
        )
    return "\n".join(lines)


def write_results(out: Path, runs: dict[RunKey, list[dict[str, float]]], rows: list[dict], task: str) -> None:
    with open(out / "runs.jsonl", "w") as f:
        for key, steps in runs.items():
            for step in steps:
                f.write(json.dumps({"regime": key.regime, "method": key.method, "seed": key.seed, **step}) + "\n")
    with open(out / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=summary_fields(task))
        writer.writeheader()
        writer.writerows(rows)
    evaluated = evaluation_rows(out, runs, task)
    if evaluated:
        with open(out / "evaluations.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=EVALUATION_FIELDS)
            writer.writeheader()
            writer.writerows(evaluated)
    if task == "speech" and len({r["step"] for r in evaluated}) > 1:  # evaluated every few steps
        from maspo_lab.analysis import long_runs

        long_runs.write(
            out,
            long_runs.runs_in(out),
            f"maspo-verl ablate: {task_named(task).description}, evaluations every few steps",
        )
