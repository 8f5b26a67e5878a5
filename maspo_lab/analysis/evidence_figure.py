"""README's evidence figure: each method's held-out CER minus `grpo`'s of the same seed, per setting, with its 95 %
interval, gathered from the committed files that own each figure (no run is read, nothing is measured again):

- **the long runs** (``docs/long-runs/runs.jsonl`` and ``steps.csv``, read back by `long_runs.recorded`): per regime
  and method, held-out CER averaged over the evaluations after step 0 minus `grpo`'s of the same seed, each ear,
  mean and t interval over the seeds (`long_runs.summary_rows`: the figures of the long runs' ``summary.md``,
  "whisper - grpo" and "second - grpo");
- **the 8-step grid** (``docs/ablation-speech/summary.csv``, written by ``maspo-verl ablate``): per regime and
  method, the held-out content gain minus `grpo`'s of the same seed, t interval over the seeds
  (``heldout_gain_vs_grpo_mean``, ``_ci95``). Content is 1 - the clipped CER (`speech_run.evaluation_figures`), so
  the CER change is its negative, with the same half-width. Whisper only: the grid's evaluations had one ear;
- **the side by side at lr 3e-4** (``docs/learning/stale-regime/paired_vs_grpo.txt``): one seed, held-out CER after
  15 steps minus `grpo`'s, paired by sentence, t interval over the 48 sentences (its ends as the file gives them),
  each ear. The one setting whose interval is not over seeds: it does not count training's run-to-run spread, and
  the figure draws it hollow.

A difference without an interval (one seed of an over-seeds setting) is left out, and so is the control (`CONTROL`):
a run that does not learn, not a method. Negative is better than `grpo`. The rows (`gather`) go to a csv beside the
figure, exactly what it plots (`write`); ``python -m maspo_lab.analysis.evidence_figure`` rewrites both from the
files of a checkout.
"""

from __future__ import annotations

import argparse
import csv
import math
import re
from pathlib import Path

from maspo_lab.analysis.evaluations import EARS
from maspo_lab.analysis.paired_runs import CONTROL

REFERENCE = "grpo"
LONG_RUNS = Path("docs/long-runs")
GRID = Path("docs/ablation-speech/summary.csv")
SIDE_BY_SIDE = Path("docs/learning/stale-regime/paired_vs_grpo.txt")
OUT = Path("docs/evidence")
STEM = "heldout-vs-grpo"
"""``<OUT>/<STEM>.csv`` and ``.png``."""

LONG_RUN_REGIMES = {"default": "default (lr 2e-5)", "stale": "stale-8", "hot": "hot (lr 2e-4)"}
GRID_REGIMES = {"default": "default (lr 2e-5)", "stale": "stale-16"}
"""The regimes' names in the docs (docs/long-runs.md, "Intervals and names"): ``stale`` is 8 updates per rollout
batch in the long runs and 16 in the 8-step grid. A regime not named here keeps its own name."""
SIDE_BY_SIDE_SETTING = "15 steps: lr3e-4 (one seed)"
EAR_NAMES = {"whisper": "Whisper tiny.en", "second": "PocketSphinx"}
COLUMNS = ("setting", "method", "ear", "change", "low", "high", "over", "source")
"""A row: ``change`` (held-out CER, the method minus `grpo` of the same seed) and its 95 % interval ``low ..
high``; ``over``: what the interval is over (``3 seeds``, ``48 sentences``); ``source``: the file it is read from."""


def long_run_rows(root: Path, folder: Path = LONG_RUNS) -> list[dict]:
    """The long runs' rows (module docstring) from ``root / folder``'s ``runs.jsonl`` and ``steps.csv``."""
    from maspo_lab.analysis import long_runs

    evaluated, _ = long_runs.recorded(root / folder / "runs.jsonl", root / folder / "steps.csv")
    last_step: dict[str, int] = {}
    for (regime, _, _), records in evaluated.items():
        last_step[regime] = max(last_step.get(regime, 0), *(r["step"] for r in records))
    named = list(LONG_RUN_REGIMES)
    # the held-out figures do not read the entropies (they feed only `long_runs.degradation`)
    summary = long_runs.summary_rows(evaluated, entropies={})
    rows = []
    for r in sorted(summary, key=lambda r: named.index(r["regime"]) if r["regime"] in named else len(named)):
        if r["method"] in (REFERENCE, CONTROL):
            continue
        for ear in EARS:
            name = f"{ear}_evaluations_vs_{REFERENCE}"
            change, half, seeds = r[name], r[f"{name}_ci95"], r[f"{name}_seeds"]
            if math.isfinite(half):
                rows.append(
                    {
                        "setting": f"{last_step[r['regime']]} steps: {LONG_RUN_REGIMES.get(r['regime'], r['regime'])}",
                        "method": r["method"],
                        "ear": ear,
                        "change": change,
                        "low": change - half,
                        "high": change + half,
                        "over": f"{seeds} seeds",
                        "source": (folder / "runs.jsonl").as_posix(),
                    }
                )
    return rows


def grid_rows(root: Path, summary: Path = GRID) -> list[dict]:
    """The 8-step grid's rows (module docstring) from ``root / summary`` (``maspo-verl ablate``'s ``summary.csv``)."""
    rows = []
    with open(root / summary, newline="") as f:
        for r in csv.DictReader(f):
            if r["method"] in (REFERENCE, CONTROL) or not r.get("heldout_gain_vs_grpo_mean"):
                continue
            change, half = -float(r["heldout_gain_vs_grpo_mean"]), float(r["heldout_gain_vs_grpo_ci95"])
            if math.isfinite(half):
                rows.append(
                    {
                        "setting": f"8 steps: {GRID_REGIMES.get(r['regime'], r['regime'])}",
                        "method": r["method"],
                        "ear": "whisper",
                        "change": change,
                        "low": change - half,
                        "high": change + half,
                        "over": f"{r['heldout_paired_seeds']} seeds",
                        "source": summary.as_posix(),
                    }
                )
    return rows


SIDE_BY_SIDE_LINE = re.compile(
    r"^(?P<metric>\S+) (?P<method>\S+) \S+/heldout (?P<sentences>\d+) (?P<change>[+-][\d.]+) "
    r"\((?P<low>[+-][\d.]+) \.\. (?P<high>[+-][\d.]+)\)$"
)
"""A held-out line of ``paired_vs_grpo.txt``: ``speech_error_rate maspo-fsq mini-llasa/heldout 48 +0.176 (+0.135 ..
+0.217)`` (metric, method, data source, sentences, the method minus `grpo`, the 95 % interval's ends)."""


def side_by_side_rows(root: Path, paired: Path = SIDE_BY_SIDE) -> list[dict]:
    """The lr 3e-4 side by side's rows (module docstring) from ``root / paired``: its held-out lines, each ear."""
    ears = {metric: ear for ear, metric in EARS.items()}
    rows = []
    for line in (root / paired).read_text().splitlines():
        found = SIDE_BY_SIDE_LINE.match(line.strip())
        if found and found["metric"] in ears:
            rows.append(
                {
                    "setting": SIDE_BY_SIDE_SETTING,
                    "method": found["method"],
                    "ear": ears[found["metric"]],
                    "change": float(found["change"]),
                    "low": float(found["low"]),
                    "high": float(found["high"]),
                    "over": f"{found['sentences']} sentences",
                    "source": paired.as_posix(),
                }
            )
    return rows


def gather(root: Path) -> list[dict]:
    """Every row the figure plots (`COLUMNS`), in its order from the top: the long runs, the 8-step grid, the side
    by side; within a setting by method, Whisper before PocketSphinx."""
    order = list(EARS)
    rows = []
    for part in (long_run_rows(root), grid_rows(root), side_by_side_rows(root)):
        settings = list(dict.fromkeys(r["setting"] for r in part))
        rows += sorted(part, key=lambda r: (settings.index(r["setting"]), r["method"], order.index(r["ear"])))
    return rows


def plot(rows: list[dict], path: Path) -> Path:
    """One axis, top to bottom in ``rows``' order: per setting a heading, then a line per method with each ear's
    change and its 95 % interval as a bar (Whisper a circle, PocketSphinx a square), a colour per method; a setting
    whose interval is over sentences, not seeds, hollow. 0 (`grpo`) is the vertical line."""
    from maspo_lab.figures import pyplot, save

    plt = pyplot()
    labels, where = [], {}  # the y axis from the top: a setting's heading, then its methods
    for setting, method in dict.fromkeys((r["setting"], r["method"]) for r in rows):
        if not labels or setting not in where:
            where[setting] = len(labels)
            labels.append(setting)
        where[(setting, method)] = len(labels)
        labels.append(method)
    methods = sorted({r["method"] for r in rows})
    colours = {m: plt.get_cmap("tab10")(i % 10) for i, m in enumerate(methods)}
    fig, ax = plt.subplots(figsize=(8.5, 1.0 + 0.24 * len(labels)))
    for r in rows:
        y = -where[(r["setting"], r["method"])] + (-0.15 if r["ear"] == "second" else 0.15)
        colour, over_seeds = colours[r["method"]], r["over"].endswith("seeds")
        ax.errorbar(
            r["change"],
            y,
            xerr=[[r["change"] - r["low"]], [r["high"] - r["change"]]],
            fmt="o" if r["ear"] == "whisper" else "s",
            ms=4.5,
            color=colour,
            mfc=colour if over_seeds else "white",
            capsize=2,
            lw=1.1,
        )
    for setting in dict.fromkeys(r["setting"] for r in rows):
        ax.axhline(-where[setting], color="0.85", lw=6, zorder=0)
    ax.axvline(0, color="0.3", lw=0.8)
    ax.set_yticks([-i for i in range(len(labels))], labels, fontsize=8)
    for tick, label in zip(ax.get_yticklabels(), labels):
        tick.set_fontweight("bold" if label in where else "normal")
    ax.set_ylim(-len(labels) + 0.4, 0.6)
    ax.set_xlabel("held-out CER, method minus grpo of the same seed (below 0: better than grpo), 95 % interval")
    for ear, marker in (("whisper", "o"), ("second", "s")):
        ax.plot([], [], marker, color="0.3", label=EAR_NAMES[ear])
    ax.plot([], [], "o", color="0.3", mfc="white", label="one seed: interval over sentences")
    ax.legend(fontsize=8, loc="upper left")
    return save(fig, path, "Each method against GRPO on mini-llasa: held-out CER")


def write(rows: list[dict], out: Path) -> tuple[Path, Path]:
    """``<out>/<STEM>.csv`` (``rows``, `COLUMNS`) and ``<out>/<STEM>.png`` (`plot`)."""
    out.mkdir(parents=True, exist_ok=True)
    table = out / f"{STEM}.csv"
    with open(table, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return table, plot(rows, out / f"{STEM}.png")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    root = Path(__file__).resolve().parents[2]
    parser.add_argument("--root", type=Path, default=root, help="the checkout whose docs/ files are read")
    parser.add_argument("--out", type=Path, default=None, help=f"where the files go (default: <root>/{OUT})")
    args = parser.parse_args(argv)
    table, figure = write(gather(args.root), args.out or args.root / OUT)
    print(f"wrote {table} and {figure}")


if __name__ == "__main__":
    main()
