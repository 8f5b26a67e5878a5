"""What each evaluation of a speech run heard, by both ears, and its change from the evaluation before training.

veRL's validation dumps every evaluated response with its reward parts (``<run>/validation/<step>.jsonl``). Per
evaluation step, sentence set (training or held-out, `maspo_lab.runs.speech_run.SOURCES`) and ear (`EARS`: the
reward's Whisper tiny.en, and the second ear that training never used), the CER of a sentence is the mean over its
samples of the clipped character error rate ``min(CER, 1)`` (one Whisper repetition loop cannot outweigh a set), and

    change = mean_i (CER_i(step) - CER_i(0))                         over the sentences i of the set
    95 % interval = change +- t_{0.975, n-1} sd_i(CER_i(step) - CER_i(0)) / sqrt(n)

pairs each sentence with itself before training: what varies between sentences cancels. The interval covers the
sampling of responses and the choice of sentences, not the run-to-run spread of training (seeds do).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path

from maspo_lab.analysis.summary import mean_interval

EARS = {"whisper": "speech_error_rate", "second": "speech_second_error_rate"}
"""Each ear's clipped CER in the reward's results: Whisper tiny.en and the second ear
(`maspo_lab.runs.speech_run.SECOND_EAR`), the two that hear audio."""
CODE_EAR = {"ear": "speech_ear_per"}
"""The code ear's clipped phoneme error rate (`reward_fns.code_ear`), in the results of runs whose reward it is:
`heard` reads it beside `EARS` (a gain only it sees is reward hacking)."""
REWARD_PARTS = ("speech_error_utility", "speech_likelihood_utility", "speech_intelligibility")
"""Reward parts whose agreement with the second ear `ear_agreement` reports (where the dump has them): the CER
utility, the recogniser's likelihood of the reference, the anchors' composite."""


def heard(validation_dir: str | Path, sources: Mapping[str, str]) -> list[dict]:
    """Per evaluation step, data source and ear (`EARS`, `CODE_EAR`) present in the dumps: ``{"step", "source", "ear",
    "mean", "sentences", "repeats", "per_sentence"}`` (`maspo_lab.runs.speech_run.evaluations` of the ear's error
    rate)."""
    from maspo_lab.runs.speech_run import evaluations

    out = []
    for ear, key in {**EARS, **CODE_EAR}.items():
        try:
            found = evaluations(validation_dir, sources, key)
        except KeyError:  # a run whose reward had no such ear
            continue
        out += [{**e, "ear": ear} for e in found if all(math.isfinite(v) for v in e["per_sentence"].values())]
    return out


def paired_change(
    before: Mapping[str, float], after: Mapping[str, float], level: float = 0.95
) -> tuple[float, float, int]:
    """Mean of ``after[t] - before[t]`` over the sentences in both, the half-width of its t interval at ``level``
    (95 % by default), the count."""
    return mean_interval((after[t] - before[t] for t in before if t in after), level)


def changes(evaluations: Iterable[dict]) -> list[dict]:
    """Per source and ear, every evaluation after the first with its paired change from the first (step 0):
    ``{"source", "ear", "step", "before", "after", "change", "ci95", "sentences", "repeats"}``."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for e in evaluations:
        groups.setdefault((e["source"], e["ear"]), []).append(e)
    rows = []
    for (source, ear), found in sorted(groups.items()):
        found.sort(key=lambda e: e["step"])
        first = found[0]
        if first["step"] != 0:
            continue
        for later in found[1:]:
            change, half, n = paired_change(first["per_sentence"], later["per_sentence"])
            rows.append(
                {
                    "source": source,
                    "ear": ear,
                    "step": later["step"],
                    "before": first["mean"],
                    "after": later["mean"],
                    "change": change,
                    "ci95": half,
                    "sentences": n,
                    "repeats": later["repeats"],
                }
            )
    return rows


def pooled_over_seeds(runs: Mapping[int, Iterable[dict]], step: int) -> list[dict]:
    """Per source and ear, the change at ``step`` of runs that differ only in their seed, each sentence's change
    averaged over the seeds (every seed's own evaluation at step 0 before it):

        change_i = mean_s (CER_i,s(step) - CER_i,s(0))        over the seeds s that evaluated sentence i at both
        pooled = mean_i change_i +- t_{0.975, n-1} sd_i(change_i) / sqrt(n)

    The interval counts sentences (a typical run of the setting on a random sentence), not the run-to-run spread of
    training; ``seed_changes`` gives each seed's own mean change for that. ``runs``: seed -> `heard` rows. Rows
    ``{"source", "ear", "step", "change", "ci95", "sentences", "seeds", "seed_changes"}``."""
    found: dict[tuple[str, str], dict[int, tuple[dict, dict]]] = {}
    for seed, evaluations in runs.items():
        by_step = {(e["source"], e["ear"], e["step"]): e["per_sentence"] for e in evaluations}
        for source, ear, at in by_step:
            if at == step and (source, ear, 0) in by_step:
                found.setdefault((source, ear), {})[seed] = (by_step[(source, ear, 0)], by_step[(source, ear, step)])
    rows = []
    for (source, ear), seeds in sorted(found.items()):
        sentences = set.intersection(*(set(before) & set(after) for before, after in seeds.values()))
        change, half, n = mean_interval(
            sum(after[t] - before[t] for before, after in seeds.values()) / len(seeds) for t in sorted(sentences)
        )
        own = {s: sum(a[t] - b[t] for t in sentences) / len(sentences) for s, (b, a) in sorted(seeds.items())}
        rows.append(
            {
                "source": source,
                "ear": ear,
                "step": step,
                "change": change,
                "ci95": half,
                "sentences": n,
                "seeds": len(seeds),
                "seed_changes": own,
            }
        )
    return rows


def ear_agreement(dump: str | Path) -> dict[str, float]:
    """How much of what the reward's ear hears, response by response, an independent ear hears too, from one
    evaluation's dump (every response heard by both, several samples per sentence):

    - ``within_correlation``: the correlation of the two ears' clipped CERs after each sentence's mean is taken off
      (what varies between samples of one sentence, where GRPO's advantages come from);
    - ``between_correlation``: the correlation of the sentences' mean CERs;
    - ``best_of_n_whisper`` / ``best_of_n_second``: the change of each ear's CER when each sentence keeps the sample
      Whisper heard best instead of all of them (what selecting by the reward buys, heard by the reward and by the
      independent ear), with ``best_of_n_second_ci95``;
    - ``within_sd_whisper`` / ``within_sd_second``, ``sentences``, ``samples``;
    - per reward part in the dump (`REWARD_PARTS`), ``within_correlation_<part>``: the correlation of its
      within-sentence deviations with the second ear's (the second ear's CER negated: both read higher = better)."""
    import json

    import numpy as np

    rows = [json.loads(line) for line in Path(dump).read_text().splitlines() if line.strip()]
    parts = [p for p in REWARD_PARTS if rows and p in rows[0]]
    groups: dict[str, list[tuple[float, ...]]] = {}
    for row in rows:
        values = (row[EARS["whisper"]], row[EARS["second"]], *(row[p] for p in parts))
        groups.setdefault(row["gts"], []).append(values)
    groups = {t: np.array(v) for t, v in groups.items() if len(v) > 1}
    within = np.concatenate([v - v.mean(axis=0) for v in groups.values()])
    means = np.array([v.mean(axis=0) for v in groups.values()])
    picked = np.array([v[v[:, 0].argmin()] - v.mean(axis=0) for v in groups.values()])
    _, half, _ = mean_interval(picked[:, 1].tolist())
    by_part = {
        f"within_correlation_{part.removeprefix('speech_')}": float(np.corrcoef(within[:, 2 + i], -within[:, 1])[0, 1])
        for i, part in enumerate(parts)
    }
    return {
        **by_part,
        "within_correlation": float(np.corrcoef(within[:, 0], within[:, 1])[0, 1]),
        "between_correlation": float(np.corrcoef(means[:, 0], means[:, 1])[0, 1]),
        "best_of_n_whisper": float(picked[:, 0].mean()),
        "best_of_n_second": float(picked[:, 1].mean()),
        "best_of_n_second_ci95": half,
        "within_sd_whisper": float(within[:, 0].std()),
        "within_sd_second": float(within[:, 1].std()),
        "sentences": len(groups),
        "samples": int(round(len(within) / max(len(groups), 1))),
    }
