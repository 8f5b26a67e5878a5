"""Runs paired within a seed: each run of a long-run grid minus a reference run of the same regime and seed (`grpo`,
the `frozen` control at learning rate 0), on the rollouts step by step (`paired_by_step`: the seed fixes the
sentences' order, so the same step says the same sentences) and on the held-out evaluations sentence by sentence
(`paired_by_sentence`). Their intervals are within one pair of runs (over the steps by batch means, over the
sentences by a t interval); the spread over seeds is `long_runs`'."""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Mapping
from typing import TypeVar

from maspo_lab.analysis.evaluations import EARS
from maspo_lab.analysis.summary import BATCHES, batch_means_interval, interval_cell, mean_interval

PER_SENTENCE = "_per_sentence"
"""Suffix of a long-run record's per-sentence CERs of a set and ear (``heldout_whisper_per_sentence``: sentence ->
CER), what `paired_by_sentence` and the degradation rule (`long_runs.degradation`) pair; not a figure
`long_runs.curves` averages."""

T = TypeVar("T")

CONTROL = "frozen"
"""The name the long runs give their control, the same run at learning rate 0 (docs/long-runs.md): its rollouts are
the starting model's on the same sentences at the same steps, so a method minus the control is what training
changed."""
REFERENCES = ("grpo", CONTROL)


def _with_references(runs: Mapping[tuple[str, str, int], T]) -> Iterator[tuple[str, str, int, str, T, T]]:
    """``(regime, method, seed, reference, mine, theirs)`` for every run and each reference run (`REFERENCES`) of
    its regime and seed that is not the run itself, in the runs' order."""
    for (regime, method, seed), mine in sorted(runs.items()):
        for reference in REFERENCES:
            theirs = runs.get((regime, reference, seed))
            if method != reference and theirs is not None:
                yield regime, method, seed, reference, mine, theirs


def paired_by_step(cers: Mapping[tuple[str, str, int], Mapping[int, float]]) -> list[dict]:
    """The rollouts' CER of each run minus a reference run's (`REFERENCES`) of the same regime and seed, step by
    step (the same sentences: the seed fixes their order), over the whole run and its second half:
    ``{"regime", "method", "seed", "reference", "from_step", "steps", "difference", "ci95"}``,

        d_s = mine_s - theirs_s                                   steps s both logged, from ``from_step`` on
        difference = mean_s d_s +- t_{0.975, k-1} sd_j(dbar_j) / sqrt(k)

    the 95 % half-width by batch means (`batch_means_interval`): ``dbar_j`` the means of ``k`` = `BATCHES`
    contiguous blocks of steps, since a drifting pair of runs makes neighbouring steps' differences alike (NaN
    under 2 steps a batch). ``cers``: per run, step -> the step's clipped CER."""
    rows = []
    for regime, method, seed, reference, mine, theirs in _with_references(cers):
        common = sorted(set(mine) & set(theirs))
        starts = [1] + ([common[len(common) // 2]] if len(common) > 1 else [])
        for start in starts:
            diffs = [mine[s] - theirs[s] for s in common if s >= start]
            difference, half, n = batch_means_interval(diffs)
            rows.append(
                {"regime": regime, "method": method, "seed": seed, "reference": reference, "from_step": start,
                 "steps": n, "difference": difference, "ci95": half}
            )  # fmt: skip
    return rows


def paired_table(rows: list[dict]) -> str:
    """Markdown of `paired_by_step`."""
    lines = [
        f"| regime | method | seed | minus | steps | rollouts' CER difference (95 %, batch means of {BATCHES} blocks "
        "of steps) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['regime']} | {r['method']} | {r['seed']} | {r['reference']} | {r['from_step']}-, {r['steps']} | "
            f"{interval_cell(r['difference'], r['ci95'], digits=4, sign=True)} |"
        )
    return "\n".join(lines)


def paired_by_sentence(runs: Mapping[tuple[str, str, int], list[dict]]) -> list[dict]:
    """Held-out CER of each run minus a reference run's (`REFERENCES`) of the same regime and seed, paired by
    sentence, by each ear: over the evaluations after step 0 that both made, and at the last of them,

        d_i = mean_e (mine_{i,e} - theirs_{i,e})          sentence i, evaluations e after step 0 both made
        d = mean_i d_i +- t_{n-1} sd_i(d_i) / sqrt(n)     n sentences

    ``{"regime", "method", "seed", "reference", "ear", "evaluations", "last_step", "sentences", "averaged",
    "averaged_ci95", "last", "last_ci95"}``. The interval is over the sentences of one pair of runs, so it does not
    count the spread from one training run to the next: what a single seed can say about held-out CER, where the
    over-seeds figures (`summary_rows`) need two seeds or more. ``runs``: per run, its evaluated records."""
    rows = []
    for regime, method, seed, reference, mine, theirs in _with_references(runs):
        at = {r["step"]: r for r in theirs}
        common = [(r, at[r["step"]]) for r in mine if r["step"] > 0 and r["step"] in at]
        for ear in EARS:
            key = f"heldout_{ear}{PER_SENTENCE}"
            pairs = [(a[key], b[key], a["step"]) for a, b in common if key in a and key in b]
            if not pairs:
                continue
            sentences = sorted(set.intersection(*(set(a) & set(b) for a, b, _ in pairs)))
            averaged = [statistics.fmean(a[s] - b[s] for a, b, _ in pairs) for s in sentences]
            last = [pairs[-1][0][s] - pairs[-1][1][s] for s in sentences]
            (mean, half, n), (last_mean, last_half, _) = mean_interval(averaged), mean_interval(last)
            rows.append(
                {"regime": regime, "method": method, "seed": seed, "reference": reference, "ear": ear,
                 "evaluations": len(pairs), "last_step": pairs[-1][2], "sentences": n,
                 "averaged": mean, "averaged_ci95": half, "last": last_mean, "last_ci95": last_half}
            )  # fmt: skip
    return rows


def sentence_table(rows: list[dict]) -> str:
    """Markdown of `paired_by_sentence`: one line per run and reference, both ears side by side."""
    lines = [
        "| regime | method | seed | minus | evaluations, sentences | "
        + " | ".join(f"{ear}: averaged | {ear}: last (step)" for ear in EARS)
        + " |",
        "|---" * (5 + 2 * len(EARS)) + "|",
    ]
    by_run: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        by_run.setdefault((r["regime"], r["method"], r["seed"], r["reference"]), {})[r["ear"]] = r
    for (regime, method, seed, reference), ears in by_run.items():
        first = next(iter(ears.values()))
        cells = []
        for ear in EARS:
            r = ears.get(ear)
            cells += (
                [interval_cell(r["averaged"], r["averaged_ci95"], sign=True),
                 f"{interval_cell(r['last'], r['last_ci95'], sign=True)} ({r['last_step']})"]
                if r else ["-", "-"]
            )  # fmt: skip
        lines.append(
            f"| {regime} | {method} | {seed} | {reference} | {first['evaluations']}, {first['sentences']} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)
