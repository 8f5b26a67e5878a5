"""What ``maspo-verl fidelity`` writes and prints from a measurement (`maspo_lab.analysis.fidelity.measure`):
``fidelity.csv``, ``fidelity.json``, ``fidelity.png``, ``log_ratios.png`` and the printed tables.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from maspo_lab.figures import pyplot, save


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
    from maspo_lab.analysis import summary

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


def write_measurement(out: Path, result: dict, about: dict, title: str) -> str:
    """Write ``fidelity.csv`` (the estimators' table), ``fidelity.json`` (``about`` -- task, model, settings,
    seconds -- and everything `measure` returned), ``fidelity.png`` and ``log_ratios.png`` to ``out``; returns the
    printed tables and the segmenters' thresholds."""
    from maspo_lab.analysis import summary

    table = summary.estimator_table(result["rows"], result["references"])
    ratios = summary.log_ratio_table(result["log_ratios"])
    if table:
        with open(out / "fidelity.csv", "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(table[0]))
            writer.writeheader()
            writer.writerows(table)
    record = {
        **about,
        "scoring": result["scoring"],
        "batches": result["batches"],
        "estimators": table,
        "references": result["references"],
        "log_ratios": ratios,
        "log_ratio_repeats": result["log_ratios"],
        "thresholds": result["thresholds"],
        "rows": result["rows"],
    }
    (out / "fidelity.json").write_text(json.dumps(record, indent=1, default=float) + "\n")
    printed = []
    if table:
        plot_fidelity(table, out / "fidelity.png", title)
        printed.append(printed_table(table, result["references"]))
    if ratios:
        plot_log_ratios(ratios, out / "log_ratios.png", title)
        printed.append(printed_log_ratios(ratios))
    printed.append(
        "\n".join(
            f"{row['segmenter']:<11} target length {row['target_length']:>3}: threshold {row['threshold']} "
            f"(mean length {row['mean_length']:.2f})"
            for row in result["thresholds"]
        )
    )
    return "\n\n".join(printed)
