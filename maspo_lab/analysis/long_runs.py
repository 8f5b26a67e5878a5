"""Long runs: what each method's evaluations do over hundreds of steps, and whether anything degrades.

Input: a grid of speech runs evaluated every few steps (``maspo-verl ablate --eval-every N``), each run's every step
(veRL's metrics) and its evaluations heard by both ears (`maspo_lab.analysis.evaluations.heard`). Per run and
evaluated step, one record (`evaluated_records`): the clipped CER of the training and held-out sentences by each ear,
the share of responses the reward could score (ended, decodable), the mean response length of the evaluation, and
the training steps since the last evaluation (their mean ``ppo_kl``, clip fraction, entropy, response length and
reward). Over the seeds of a regime and method (`curves`), each figure's mean and the half-width of its 95 % t
interval. A run degrades (`degradation`) when, after its best held-out CER:

- held-out CER (either ear) ends more than `CER_RISE` above its best, and the rise, paired by sentence (last minus
  best evaluation), has an interval above 0 at 95 % over the k - 1 evaluations the best was chosen from
  (Bonferroni: level 1 - 0.05 / (k - 1)). An evaluation of a few sentences x samples wanders by more than
  `CER_RISE` from noise alone, and the best of k is a low draw; or
- its responses grow to `LENGTH_GROWTH` x their length at the first evaluation, or fewer than `MIN_VALID` of the
  evaluated responses end and decode (never-ending speech); or
- its entropy falls below `ENTROPY_FALL` x the first step's, or its clip fraction exceeds `CLIP_RUNAWAY`.

Each reason names the step where it first holds.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from pathlib import Path

from maspo_lab.analysis.evaluations import EARS, heard, paired_change
from maspo_lab.analysis.paired_runs import (
    CONTROL,
    PER_SENTENCE,
    REFERENCES,
    paired_by_sentence,
    paired_by_step,
    paired_table,
    sentence_table,
)
from maspo_lab.analysis.summary import BATCHES, interval_cell, mean_interval
from maspo_lab.analysis.training_metrics import (
    BATCH_CER,
    BATCH_PER,
    CLIP,
    ENTROPY,
    KL,
    KL_LOSS,
    LENGTH,
    REWARD,
    STEP_TIME,
    training_steps,
)
from maspo_lab.runs.grid import RunKey

TRAINING = {
    "ppo_kl": KL,
    "clipfrac": CLIP,
    "entropy": ENTROPY,
    "length": LENGTH,
    "reward": REWARD,
    "batch_cer": BATCH_CER,
    "batch_per": BATCH_PER,
    "kl_loss": KL_LOSS,
}
"""The training figures averaged over the steps since the previous evaluation. ``batch_cer`` is the clipped CER
(Whisper) of the steps' own rollouts: when RL draws from many sentences, each seen once (``--texts`` much larger than
steps x prompts), it is the policy's CER on sentences RL has not yet trained on, with far more responses behind it
than an evaluation. ``batch_per``: the code ear's clipped PER of the same rollouts, when the ear is the reward (then
no rollout is heard by Whisper); ``kl_loss``: the KL term to the shipped model, when the run has one."""
CER_RISE = 0.05
LENGTH_GROWTH = 1.5
MIN_VALID = 0.9
ENTROPY_FALL = 0.5
CLIP_RUNAWAY = 0.5
SETS = {"train": "training", "heldout": "held-out"}


def evaluated_records(steps: list[dict], validation_dir: str | Path, sources: Mapping[str, str]) -> list[dict]:
    """One record per evaluated step of a run (module docstring): ``{"step", "<set>_<ear>" CERs and their
    `PER_SENTENCE` maps, "valid", "eval_length", and the `TRAINING` means of the steps since the previous
    evaluation}``."""
    import json

    found = heard(validation_dir, sources)
    by_step: dict[int, dict] = {}
    for e in found:
        name = f"{e['source'].rpartition('/')[2]}_{e['ear']}"
        record = by_step.setdefault(e["step"], {"step": e["step"]})
        record[name], record[name + PER_SENTENCE] = e["mean"], e["per_sentence"]
    for step, record in by_step.items():
        dump = Path(validation_dir) / f"{step}.jsonl"
        rows = [json.loads(line) for line in dump.read_text().splitlines() if line.strip()]
        record["valid"] = statistics.fmean(float(r.get("speech_valid", math.nan)) for r in rows)
        record["eval_length"] = statistics.fmean(float(r.get("speech_n_codes", math.nan)) + 1 for r in rows)
    trained = [s for s in steps if REWARD in s]
    previous = 0
    for step in sorted(by_step):
        window = [s for s in trained if previous < s["step"] <= step]
        for name, key in TRAINING.items():
            values = [s[key] for s in window if key in s]
            by_step[step][name] = statistics.fmean(values) if values else math.nan
        previous = step
    return [by_step[s] for s in sorted(by_step)]


def degradation(records: list[dict], first_entropy: float) -> list[str]:
    """Why a run degrades (module docstring), each reason with the first step it holds; empty when it does not."""
    reasons = []
    for ear in EARS:
        key = f"heldout_{ear}"
        series = [(r["step"], r[key]) for r in records if math.isfinite(r.get(key, math.nan))]
        if len(series) < 2:
            continue
        best_step, best = min(series, key=lambda sv: sv[1])
        after = [(s, v) for s, v in series if s > best_step and v > best + CER_RISE]
        if not after or series[-1][1] <= best + CER_RISE:
            continue
        by_step = {r["step"]: r.get(key + PER_SENTENCE) for r in records}
        rise, half, _ = (
            paired_change(by_step[best_step], by_step[series[-1][0]], level=1 - 0.05 / (len(series) - 1))
            if by_step[best_step] and by_step[series[-1][0]]
            else (math.nan, math.nan, 0)
        )
        if math.isfinite(half) and rise - half > 0:
            reasons.append(
                f"held-out CER ({ear}) {best:.3f} at step {best_step} -> {series[-1][1]:.3f} (from step {after[0][0]}; "
                f"paired rise {rise:+.3f} +- {half:.3f}, Bonferroni over {len(series) - 1})"
            )
    start = records[0] if records else {}
    for r in records[1:]:
        if r["eval_length"] > LENGTH_GROWTH * start.get("eval_length", math.inf):
            reasons.append(f"responses {start['eval_length']:.0f} -> {r['eval_length']:.0f} tokens at step {r['step']}")
            break
    for r in records:
        if r["valid"] < MIN_VALID:
            reasons.append(f"only {r['valid']:.0%} of responses end and decode at step {r['step']}")
            break
    for r in records[1:]:
        if r["entropy"] < ENTROPY_FALL * first_entropy:
            reasons.append(f"entropy {first_entropy:.2f} -> {r['entropy']:.2f} by step {r['step']}")
            break
    for r in records[1:]:
        if r["clipfrac"] > CLIP_RUNAWAY:
            reasons.append(f"clip fraction {r['clipfrac']:.2f} by step {r['step']}")
            break
    return reasons


def curves(runs: Mapping[tuple[str, str, int], list[dict]]) -> list[dict]:
    """Per regime, method and evaluated step: each figure's mean over the seeds and its 95 % half-width
    (``<figure>`` and ``<figure>_ci95``), and the seeds."""
    groups: dict[tuple[str, str, int], list[dict]] = {}
    for (regime, method, _), records in runs.items():
        for r in records:
            groups.setdefault((regime, method, r["step"]), []).append(r)
    out = []
    for (regime, method, step), members in sorted(groups.items()):
        row = {"regime": regime, "method": method, "step": step, "seeds": len(members)}
        for figure in sorted({k for m in members for k in m if k != "step" and not k.endswith(PER_SENTENCE)}):
            mean, half, _ = mean_interval(m.get(figure, math.nan) for m in members)
            row[figure], row[f"{figure}_ci95"] = mean, half
        out.append(row)
    return out


def summary_rows(
    runs: Mapping[tuple[str, str, int], list[dict]],
    entropies: Mapping[tuple[str, str, int], float],
    paired: list[dict] = (),
) -> list[dict]:
    """Per regime and method over its seeds: held-out CER (each ear) at the first and last evaluation and at the
    best step of the mean curve, the last one's paired change against ``grpo`` of the same seed (mean, 95 %
    half-width); the rollouts' own CER (``batch_cer``) over the steps up to the first evaluation after step 0 and
    up to the last, the last against ``grpo``'s of the same seed (the same sentences, when the seed fixes their
    order); the whole run's rollouts' CER against each of `REFERENCES` (``paired``: `paired_by_step`'s rows, their
    whole-run differences averaged over the seeds); held-out CER (each ear) averaged over the evaluations after
    step 0 against each of `REFERENCES` of the same seed (`_evaluations_minus`); and the runs that degrade with
    their reasons."""
    whole_run = {
        (r["regime"], r["method"], r["seed"], r["reference"]): r["difference"] for r in paired if r["from_step"] == 1
    }
    table = []
    by_group: dict[tuple[str, str], list[int]] = {}
    for regime, method, seed in runs:
        by_group.setdefault((regime, method), []).append(seed)
    for (regime, method), seeds in sorted(by_group.items()):
        mine = {s: runs[(regime, method, s)] for s in seeds}
        references = {
            reference: {s: runs[key] for s in seeds if (key := (regime, reference, s)) in runs and method != reference}
            for reference in REFERENCES
        }
        grpo = references["grpo"]

        row = {"regime": regime, "method": method, "seeds": len(seeds)}
        for ear in EARS:
            key = f"heldout_{ear}"
            row[f"{ear}_first"], row[f"{ear}_first_ci95"], _ = mean_interval(
                [r[0].get(key, math.nan) for r in mine.values()]
            )
            row[f"{ear}_last"], row[f"{ear}_last_ci95"], _ = mean_interval(
                [r[-1].get(key, math.nan) for r in mine.values()]
            )
            steps = sorted({r["step"] for records in mine.values() for r in records})
            means = {
                step: statistics.fmean(
                    r.get(key, math.nan) for records in mine.values() for r in records if r["step"] == step
                )
                for step in steps
            }
            best = min(means, key=means.get) if means else math.nan
            row[f"{ear}_best_step"], row[f"{ear}_best"] = best, means.get(best, math.nan)
            row[f"{ear}_vs_grpo"], row[f"{ear}_vs_grpo_ci95"], row["paired_seeds"] = _last_minus(mine, grpo, key)
            for reference, theirs in references.items():
                (
                    row[f"{ear}_evaluations_vs_{reference}"],
                    row[f"{ear}_evaluations_vs_{reference}_ci95"],
                    row[f"{ear}_evaluations_vs_{reference}_seeds"],
                ) = _evaluations_minus(mine, theirs, key)
        first = [next((r["batch_cer"] for r in records if r["step"] > 0), math.nan) for records in mine.values()]
        row["batch_first"], row["batch_first_ci95"], _ = mean_interval(first)
        row["batch_last"], row["batch_last_ci95"], _ = mean_interval(
            [r[-1].get("batch_cer", math.nan) for r in mine.values()]
        )
        row["batch_vs_grpo"], row["batch_vs_grpo_ci95"], row["batch_vs_grpo_seeds"] = _last_minus(
            mine, grpo, "batch_cer"
        )
        for reference in REFERENCES:
            differences = [whole_run[key] for s in seeds if (key := (regime, method, s, reference)) in whole_run]
            (
                row[f"batch_run_vs_{reference}"],
                row[f"batch_run_vs_{reference}_ci95"],
                row[f"batch_run_vs_{reference}_seeds"],
            ) = mean_interval(differences)
        reasons = {s: degradation(records, entropies.get((regime, method, s), math.nan)) for s, records in mine.items()}
        row["degraded"] = sum(bool(r) for r in reasons.values())
        row["reasons"] = "; ".join(f"seed {s}: {', '.join(r)}" for s, r in sorted(reasons.items()) if r)
        table.append(row)
    return table


def _paired_evaluations(
    mine: Mapping[int, list[dict]], theirs: Mapping[int, list[dict]], key: str
) -> dict[int, list[tuple[int, float]]]:
    """Per seed of the reference runs (``theirs``): ``(step, mine minus theirs)`` of ``key`` at every evaluated step
    that the seed's run and the reference run both reached, in the run's order."""
    paired = {}
    for seed, records in theirs.items():
        at = {r["step"]: r.get(key, math.nan) for r in records}
        paired[seed] = [(r["step"], r.get(key, math.nan) - at[r["step"]]) for r in mine[seed] if r["step"] in at]
    return paired


def _last_minus(mine: Mapping[int, list[dict]], theirs: Mapping[int, list[dict]], key: str) -> tuple[float, float, int]:
    """``key`` at the last evaluated step a seed's run and the reference run of the seed (``theirs``) both reached,
    mine minus theirs, over the seeds both have: `mean_interval`. (Unfinished runs are compared where both are.)"""
    return mean_interval([steps[-1][1] for steps in _paired_evaluations(mine, theirs, key).values() if steps])


def _evaluations_minus(
    mine: Mapping[int, list[dict]], theirs: Mapping[int, list[dict]], key: str
) -> tuple[float, float, int]:
    """``key`` averaged over the evaluations after step 0 that a seed's run and the reference run of the seed
    (``theirs``) both made, mine minus theirs, over the seeds both have: `mean_interval`. Every evaluation counts, so
    it sees smaller differences than the last one alone (`_last_minus`), and asks a different question: which run
    was better over the run, not which ended better."""
    after_0 = [[d for step, d in steps if step > 0] for steps in _paired_evaluations(mine, theirs, key).values()]
    return mean_interval([statistics.fmean(differences) for differences in after_0 if differences])


def evaluations_table(rows: list[dict]) -> str:
    """Markdown of `summary_rows`' held-out CER averaged over the evaluations after step 0, against each of
    `REFERENCES` of the same seed: means +- 95 % half-widths over seeds."""
    columns = [(ear, reference) for ear in EARS for reference in REFERENCES]
    lines = [
        "| regime | method | seeds | " + " | ".join(f"{ear} - {reference}" for ear, reference in columns) + " |",
        "|---" * (3 + len(columns)) + "|",
    ]
    for r in rows:
        cells = []
        for ear, reference in columns:
            name = f"{ear}_evaluations_vs_{reference}"
            mean, half, seeds = r.get(name, math.nan), r.get(f"{name}_ci95", math.nan), r.get(f"{name}_seeds", 0)
            cells.append(
                "reference"
                if r["method"] == reference
                else interval_cell(mean, half, sign=True, of=(seeds, r["seeds"]))
            )
        lines.append(f"| {r['regime']} | {r['method']} | {r['seeds']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_table(rows: list[dict]) -> str:
    """Markdown of `summary_rows`: means +- 95 % half-widths over seeds."""

    lines = [
        "| regime | method | seeds | held-out CER (Whisper): first -> last | best (step) | last - grpo (paired) | "
        "held-out CER (PocketSphinx): first -> last | best (step) | last - grpo (paired) | "
        "rollouts' CER (Whisper): first window -> last (other sentences) | last - grpo (paired: same sentences) | "
        + " | ".join(f"whole run - {reference} (paired by step)" for reference in REFERENCES)
        + " | runs degrading |",
        "|---" * (12 + len(REFERENCES)) + "|",
    ]
    for r in rows:
        cells = []
        for ear in EARS:
            cells += [
                interval_cell(r[f"{ear}_first"], r[f"{ear}_first_ci95"])
                + " -> "
                + interval_cell(r[f"{ear}_last"], r[f"{ear}_last_ci95"]),
                f"{r[f'{ear}_best']:.3f} ({r[f'{ear}_best_step']})" if math.isfinite(r[f"{ear}_best"]) else "-",
                "reference"
                if r["method"] == "grpo"
                else interval_cell(
                    r[f"{ear}_vs_grpo"], r[f"{ear}_vs_grpo_ci95"], sign=True, of=(r["paired_seeds"], r["seeds"])
                ),
            ]
        cells += [
            interval_cell(r["batch_first"], r["batch_first_ci95"])
            + " -> "
            + interval_cell(r["batch_last"], r["batch_last_ci95"]),
            "reference"
            if r["method"] == "grpo"
            else interval_cell(
                r["batch_vs_grpo"], r["batch_vs_grpo_ci95"], sign=True, of=(r["batch_vs_grpo_seeds"], r["seeds"])
            ),
            *(
                "reference"
                if r["method"] == reference
                else interval_cell(
                    r[f"batch_run_vs_{reference}"],
                    r[f"batch_run_vs_{reference}_ci95"],
                    sign=True,
                    of=(r[f"batch_run_vs_{reference}_seeds"], r["seeds"]),
                )
                for reference in REFERENCES
            ),
        ]
        lines.append(
            f"| {r['regime']} | {r['method']} | {r['seeds']} | "
            + " | ".join(cells)
            + f" | {r['degraded']}/{r['seeds']} |"
        )
    return "\n".join(lines)


PANELS = (
    ("held-out CER, Whisper tiny.en", "heldout_whisper"),
    ("held-out CER, PocketSphinx (never trained on)", "heldout_second"),
    ("held-out PER, the code ear", "heldout_ear"),
    ("training sentences' CER, Whisper", "train_whisper"),
    ("training sentences' CER, PocketSphinx", "train_second"),
    ("training sentences' PER, the code ear", "train_ear"),
    ("CER of the steps' own rollouts, Whisper", "batch_cer"),
    ("PER of the steps' own rollouts, the code ear", "batch_per"),
    ("KL to the shipped model (training steps)", "kl_loss"),
    ("evaluated response length (tokens)", "eval_length"),
    ("entropy (training steps)", "entropy"),
    ("pg clip fraction (training steps)", "clipfrac"),
    ("ppo_kl (training steps)", "ppo_kl"),
    ("responses that end and decode", "valid"),
)


PANEL_COLUMNS = 3


def plot(rows: list[dict], path: Path, title: str, runs: Mapping[tuple[str, str, int], list[dict]]) -> Path:
    """Per regime, a block of panels (those of `PANELS` the rows have, `PANEL_COLUMNS` to a row): each method's
    mean over seeds against the step (``rows``, `curves`) and, thin in the same colour, each seed's own run
    (``runs``, keyed like `curves`' input). Seeds, not a band: with 2-3 seeds a 95 % t band is wider than the runs'
    own range (the tables hold the half-widths)."""
    from maspo_lab.figures import pyplot, save

    plt = pyplot()
    regimes = sorted({r["regime"] for r in rows})
    panels = [(name, key) for name, key in PANELS if any(math.isfinite(r.get(key, math.nan)) for r in rows)]
    block = math.ceil(len(panels) / PANEL_COLUMNS)
    fig, axes = plt.subplots(
        block * len(regimes), PANEL_COLUMNS, figsize=(4.2 * PANEL_COLUMNS, 3.0 * block * len(regimes)), squeeze=False
    )
    for r_index, regime in enumerate(regimes):
        cells = [axes[r_index * block + i // PANEL_COLUMNS][i % PANEL_COLUMNS] for i in range(block * PANEL_COLUMNS)]
        for ax, (name, key) in zip(cells, panels):
            for method in sorted({r["method"] for r in rows if r["regime"] == regime}):
                mine = [r for r in rows if r["regime"] == regime and r["method"] == method and key in r]
                (line,) = ax.plot([r["step"] for r in mine], [r[key] for r in mine], marker="o", ms=3, label=method)
                seeds = [records for (g, m, _), records in runs.items() if (g, m) == (regime, method)]
                for records in seeds if len(seeds) > 1 else ():  # one seed is its own mean
                    own = [r for r in records if key in r]
                    ax.plot([r["step"] for r in own], [r[key] for r in own], lw=0.7, alpha=0.35, color=line.get_color())
            ax.set_title(f"{regime}: {name}", fontsize=8)
            ax.set_xlabel("step", fontsize=8)
        cells[0].legend(fontsize=7)
        for ax in cells[len(panels) :]:
            ax.axis("off")
    save(fig, path, title)
    return path


STEM = "long-runs"
"""The stem of a grid's long-run files (`write`): ``.jsonl`` (one line per run and evaluated step), ``.csv`` (the
curves: mean and 95 % half-width over seeds), ``-steps.csv`` (every training step's `TRAINING` figures and its
seconds), ``-paired.csv`` (`paired_by_step`: 95 % half-widths by batch means), ``.md`` (the summary tables) and
``.png``."""


def runs_in(out: Path) -> dict[RunKey, list[dict[str, float]]]:
    """Every run in the grid folder ``out`` (`RunKey.dir`), finished or not, linked ones included: its logged
    records, the attempts of a resumed run merged. The long-run files describe the folder, not one invocation, so
    that regimes run by separate commands into one folder (and a control linked into them) are read together."""
    from maspo_lab.runs.launch import merged_metrics

    return {
        key: merged_metrics(key.dir(out)) for key in RunKey.in_folder(out) if any(key.dir(out).glob("metrics*.jsonl"))
    }


STEP_FIGURES = {**TRAINING, "s_per_step": STEP_TIME}
"""The columns of ``-steps.csv`` after the run's key and step: name -> veRL's metric."""
Recorded = tuple[Mapping[tuple[str, str, int], list[dict]], Mapping[tuple[str, str, int], list[dict]]]
"""Runs described without their folders (`recorded`): per (regime, method, seed), its evaluated records
(`evaluated_records`) and its training steps (`training_steps`)."""


def recorded(records: Path, steps: Path) -> Recorded:
    """The runs a grid's long-run files describe, read back from its ``.jsonl`` and ``-steps.csv`` (`write`; in the
    docs, ``docs/long-runs/runs.jsonl`` and ``steps.csv``): per run, its evaluated records and its training steps
    (veRL's metric names, as `runs_in` gives them). What `write` needs to describe those runs again beside new ones
    once their folders are gone (a fresh machine keeps the files, not the runs)."""
    import csv
    import json

    evaluated: dict[tuple[str, str, int], list[dict]] = {}
    for line in records.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            key = (record.pop("regime"), record.pop("method"), int(record.pop("seed")))
            evaluated.setdefault(key, []).append(record)
    trained: dict[tuple[str, str, int], list[dict]] = {}
    with open(steps, newline="") as f:
        for row in csv.DictReader(f):
            step = {"step": int(row["step"])}
            step.update({key: float(row[name]) for name, key in STEP_FIGURES.items() if row.get(name, "") != ""})
            trained.setdefault((row["regime"], row["method"], int(row["seed"])), []).append(step)
    return evaluated, trained


def write(
    out: Path,
    runs: Mapping[RunKey, list[dict[str, float]]],
    title: str,
    earlier: Recorded = ({}, {}),
) -> None:
    """The long-run files (`STEM`) of the speech grid in ``out`` evaluated every few steps, from each run's logged
    records (``runs``, e.g. `runs_in`) and its evaluations (`RunKey.validation_dir`), beside the ``earlier`` runs
    (`recorded`: evaluated records, training steps) that the folder does not hold (a run in both is the folder's):
    the runs evaluated after step 0, in the regimes where something besides the control (`CONTROL`) was trained."""
    import csv
    import json

    logged = {(k.regime, k.method, k.seed): (steps, k.validation_dir(out)) for k, steps in runs.items()}
    evaluated = {key: list(records) for key, records in earlier[0].items() if key not in logged}
    trained = {key: list(steps) for key, steps in earlier[1].items() if key not in logged}
    if logged:
        from maspo_lab.runs.speech_run import evaluated_sources, task_paths

        sources = evaluated_sources(task_paths(out / "task"))
        for key, (steps, dumps) in logged.items():
            evaluated[key], trained[key] = evaluated_records(steps, dumps, sources), training_steps(steps)
    evaluated = {key: records for key, records in sorted(evaluated.items()) if any(r["step"] > 0 for r in records)}
    trained_regimes = {regime for regime, method, _ in evaluated if method != CONTROL}
    evaluated = {key: records for key, records in evaluated.items() if key[0] in trained_regimes}
    if not evaluated:
        return
    trained = {key: trained.get(key, []) for key in evaluated}
    entropies = {key: next((s[ENTROPY] for s in steps if ENTROPY in s), math.nan) for key, steps in trained.items()}
    with open(out / f"{STEM}.jsonl", "w") as f:
        for (regime, method, seed), records in evaluated.items():
            for record in records:
                f.write(json.dumps({"regime": regime, "method": method, "seed": seed, **record}) + "\n")
    with open(out / f"{STEM}-steps.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["regime", "method", "seed", "step", *STEP_FIGURES])
        for key, steps in trained.items():
            for s in steps:
                writer.writerow([*key, s["step"], *(s.get(name, "") for name in STEP_FIGURES.values())])
    rows = curves(evaluated)
    with open(out / f"{STEM}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=sorted({k for row in rows for k in row}))
        writer.writeheader()
        writer.writerows(rows)
    paired = paired_by_step(
        {key: {s["step"]: s[BATCH_CER] for s in steps if BATCH_CER in s} for key, steps in trained.items()}
    )
    summary = summary_rows(evaluated, entropies, paired)
    reasons = "\n".join(f"- {r['regime']} {r['method']}: {r['reasons']}" for r in summary if r["reasons"])
    text = summary_table(summary) + ("\n\nWhat degraded:\n\n" + reasons if reasons else "")
    text += (
        "\n\nHeld-out CER averaged over the evaluations after step 0, minus the reference run's of the same seed "
        "(whisper: Whisper tiny.en, second: PocketSphinx):\n\n" + evaluations_table(summary)
    )
    text += (
        "\n\nHeld-out CER paired by sentence within each seed's pair of runs (mean +- 95 % over the sentences, "
        "averaged over the evaluations after step 0 both made, and at the last of them):\n\n"
        + sentence_table(paired_by_sentence(evaluated))
    )
    if paired:
        with open(out / f"{STEM}-paired.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(paired[0]))
            writer.writeheader()
            writer.writerows(paired)
        text += (
            "\n\nThe rollouts' CER paired by step (the same sentences; mean +- 95 % half-width by batch means over "
            f"{BATCHES} contiguous blocks of steps, `summary.batch_means_interval`):\n\n" + paired_table(paired)
        )
    (out / f"{STEM}.md").write_text(text + "\n")
    plot(rows, out / f"{STEM}.png", title, evaluated)
