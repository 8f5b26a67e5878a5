"""The rollout engine's mismatch on mini-llasa, corrected at every level: token, segments of several sizes, sequence.

A rollout engine samples with weights and kernels of its own; veRL's trainer recomputes the log-probs in float32
(``old_log_prob``) and corrects with ``w = pi_old / pi_rollout`` (`maspo_verl.rollout_correction`). Here, without
Ray or veRL's trainer, on the shipped mini-llasa (`maspo_lab.speaking_model.SHIPPED_MODEL`):

1. the rollout policy samples ``texts x group`` responses with the project's sampler
   (`maspo_lab.sampler.Sampler`, logits upcast to float32 for the log-softmax as vLLM's sampler does), which
   also returns its log-probs ``log pi_rollout(y_t)``: in **bf16** (the model cast to bfloat16), and in **fp8**
   (every linear weight rounded to float8 e4m3 with one scale per tensor, then run in bf16: a weight-quantised
   rollout, as vLLM's fp8 one);
2. the float32 model recomputes ``log pi_old(y_t)`` in one forward pass over prompt and response, as veRL's actor;
3. per level (`LEVELS`) and per quarter of response length: the spread of the log-weights, veRL's effective sample
   size and spread of the truncated weights (``rollout_is_threshold`` 2, veRL's default), the fraction of weights
   truncated, the mean truncated weight (``1 - mean`` is the mass the truncation removes: the bias it leaves, since
   every untruncated level has ``E[w] = 1``), and the effective sample size without truncation.

Run: ``python -m maspo_lab.analysis.rollout_mismatch --out docs/rollout-correction`` (OMP_NUM_THREADS=1, no Ray);
writes ``levels.csv``, ``summary.json`` and ``mismatch.png``, which docs/rollout-correction.md reads.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

LEVELS: dict[str, tuple[str, int | None]] = {
    "token": ("segment", 1),
    "segment-4": ("segment", 4),
    "segment-10": ("segment", 10),
    "segment-25": ("segment", 25),
    "segment-50": ("segment", 50),
    "segment_geo-25": ("segment_geo", 25),
    "sequence": ("segment", None),
}
"""``name -> (rollout_is level, fixed window)``: ``token`` and ``sequence`` are the one-token and whole-response
windows (equal to veRL's levels, tests/test_rollout_correction.py); 50 codes are a second of speech."""
THRESHOLD = 2.0
"""veRL's default ``rollout_is_threshold`` (TIS)."""
MISMATCHES = ("bf16", "fp8")


@dataclass
class Settings:
    texts: int = 64
    group: int = 4
    temperature: float = 0.8
    max_seconds: float = 8.0
    seed: int = 0
    length_bins: int = 4


def fp8_weights(model: torch.nn.Module) -> torch.nn.Module:
    """Every ``nn.Linear`` weight rounded to float8 e4m3 (one scale per tensor, ``max |W| / 448``), kept in the
    model's dtype: what a weight-quantised fp8 rollout computes with."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                weight = module.weight.float()
                scale = weight.abs().max().clamp(min=1e-12) / torch.finfo(torch.float8_e4m3fn).max
                rounded = (weight / scale).to(torch.float8_e4m3fn).float() * scale
                module.weight.copy_(rounded.to(module.weight.dtype))
    return model


def rollout_model(kind: str, model_dir: Path):
    from maspo_lab.sampler import load_model

    model, tokenizer = load_model(model_dir, "bfloat16", "cpu")
    if kind == "fp8":
        fp8_weights(model)
    return model.eval(), tokenizer


def chosen_texts(count: int, sentences: Path) -> list[str]:
    """``count`` training sentences evenly spaced in length (characters), so that responses span short to long."""
    texts = sorted({line.strip() for line in sentences.read_text().splitlines() if line.strip()}, key=len)
    picks = np.linspace(0, len(texts) - 1, count).round().astype(int)
    return [texts[i] for i in picks]


@dataclass
class Sampled:
    """Responses of the rollout policy, right-padded ``(N, T)``, with its log-probs and the trainer's; ``pad_id``:
    the checkpoint's, as its sampler pads (`maspo_lab.sampler.Sampler.pad_id`)."""

    prompt_ids: list[list[int]]
    response_ids: torch.Tensor
    mask: torch.Tensor
    rollout_log_prob: torch.Tensor
    pad_id: int
    old_log_prob: torch.Tensor | None = None


@torch.inference_mode()
def sample_rollouts(model, tokenizer, texts: list[str], settings: Settings) -> Sampled:
    from maspo_base.speech_tokens.llasa_prompt import render_prompt_ids
    from maspo_lab.sampler import Sampler
    from maspo_lab.speaking_model import SHIPPED_MODEL
    from maspo_lab.speaking_model.model import layout_of_checkpoint

    layout = layout_of_checkpoint(SHIPPED_MODEL, tokenizer)
    prompts = [render_prompt_ids(tokenizer, text) for text in texts for _ in range(settings.group)]
    budget = int(settings.max_seconds * layout.frame_rate) + 1
    sampler = Sampler(model, tokenizer, settings.seed, settings.temperature, budget)
    responses = sampler.sample(prompts, version=0, log_probs=True, batch_size=16)
    width = max(len(ids) for ids, _ in responses)
    ids = torch.zeros(len(responses), width, dtype=torch.long)
    mask = torch.zeros(len(responses), width)
    log_probs = torch.zeros(len(responses), width)
    for i, (row, row_log_probs) in enumerate(responses):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
        log_probs[i, : len(row)] = torch.tensor(row_log_probs)
    return Sampled(prompts, ids, mask, log_probs, sampler.pad_id)


@torch.inference_mode()
def trainer_log_probs(model, sampled: Sampled, temperature: float, rows: int = 16) -> torch.Tensor:
    """``log pi_old(y_t)`` of the float32 model, as veRL's actor computes it (`response_log_probs`)."""
    from maspo_lab.analysis.policy_gradients import Batch, response_log_probs

    parts = []
    for start in range(0, len(sampled.prompt_ids), rows):
        index = slice(start, start + rows)
        n = len(sampled.prompt_ids[index])
        batch = Batch(
            sampled.prompt_ids[index], sampled.response_ids[index], sampled.mask[index], torch.zeros(n), torch.zeros(n)
        )
        parts.append(response_log_probs(model, batch, temperature, sampled.pad_id))
    return torch.cat(parts)


def level_statistics(old: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor, level: str) -> dict[str, float]:
    """One level's figures on a batch (module docstring, step 3), from `compute_rollout_correction`'s metrics."""
    from maspo_verl.config import MaspoConfig
    from maspo_verl.rollout_correction import compute_rollout_correction, real_segments, segment_log_weights

    rollout_is, window = LEVELS[level]
    window = window or mask.shape[-1]
    layout = MaspoConfig.from_mapping({"segmenter": {"name": "fixed", "window": window}}).segment_layout(
        old, mask, None
    )
    figures = {}
    for name, threshold in (("", THRESHOLD), ("raw_", math.exp(20))):
        _, _, metrics = compute_rollout_correction(
            old, rollout, mask, layout, rollout_is=rollout_is, rollout_is_threshold=threshold
        )
        figures[f"{name}ess"] = metrics["rollout_corr/rollout_is_eff_sample_size"]
        if not name:
            figures["is_std"] = metrics["rollout_corr/rollout_is_std"]
            figures["mean_weight"] = metrics["rollout_corr/rollout_is_mean"]
            figures["fraction_truncated"] = metrics["rollout_corr/rollout_is_ratio_fraction_high"]
            figures["mean_segment_length"] = metrics["rollout_corr/rollout_is_mean_segment_length"]
    log_weight = segment_log_weights(old - rollout, mask.bool(), layout, geometric=rollout_is == "segment_geo")
    real = real_segments(layout)
    figures["log_weight_std"] = float(log_weight[real].std()) if int(real.sum()) > 1 else 0.0
    return figures


def length_bins(mask: torch.Tensor, bins: int) -> list[torch.Tensor]:
    """Row indices of ``bins`` quantile bins of response length, shortest first."""
    lengths = mask.sum(-1)
    order = torch.argsort(lengths, stable=True)
    return [part for part in torch.tensor_split(order, bins) if part.numel()]


def log_ratio_profile(log_ratio: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """The token log-ratios' mean, spread, lag-1 autocorrelation (pairs within a response) and the share of their
    variance that is each response's own mean."""
    from maspo_lab.analysis.log_ratios import lag_autocorrelation, shared_fraction

    valid = log_ratio[mask.bool()]
    return {
        "token_log_ratio_mean": float(valid.mean()),
        "token_log_ratio_std": float(valid.std()),
        "token_log_ratio_abs_max": float(valid.abs().max()),
        "lag1_autocorrelation": float(lag_autocorrelation(log_ratio, mask, 1)[0]),
        "response_mean_variance_share": shared_fraction(log_ratio, mask),
    }


def measure_mismatch(kind: str, texts: list[str], settings: Settings, trainer) -> tuple[list, dict]:
    """Rows of ``levels.csv`` and the summary of one mismatch (``bf16`` or ``fp8``)."""
    from maspo_lab.speaking_model import SHIPPED_MODEL

    start = time.monotonic()
    model, tokenizer = rollout_model(kind, SHIPPED_MODEL)
    sampled = sample_rollouts(model, tokenizer, texts, settings)
    del model
    old = trainer_log_probs(trainer, sampled, settings.temperature).double()
    rollout, mask = sampled.rollout_log_prob.double(), sampled.mask.double()
    rows = []
    for level in LEVELS:
        figures = level_statistics(old, rollout, mask, level)
        rows.append({"mismatch": kind, "level": level, "length_bin": "all", **_bin_figures(mask), **figures})
        for number, index in enumerate(length_bins(mask, settings.length_bins)):
            figures = level_statistics(old[index], rollout[index], mask[index], level)
            rows.append(
                {"mismatch": kind, "level": level, "length_bin": number, **_bin_figures(mask[index]), **figures}
            )
    summary = {
        "responses": int(mask.shape[0]),
        "tokens": int(mask.sum()),
        "response_length_quartiles": [
            float(q) for q in torch.quantile(mask.sum(-1), torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0]).double())
        ],
        "seconds": round(time.monotonic() - start, 1),
        **log_ratio_profile(old - rollout, mask),
    }
    return rows, summary


def _bin_figures(mask: torch.Tensor) -> dict[str, float]:
    lengths = mask.sum(-1)
    return {"responses": int(lengths.numel()), "mean_length": float(lengths.mean())}


EXTRAPOLATED_LENGTHS = (150, 500, 1000, 1500)
"""Response lengths (codes) of the extrapolation: mini-llasa's measured range, then Llasa-1B's 10-30 s."""
EXTRAPOLATED_WINDOWS = (1, 4, 10, 25, 50, 100, None)
"""Segment sizes of the extrapolation (None: the whole response, the sequence level)."""


def lognormal_figures(log_std: float, threshold: float = THRESHOLD) -> dict[str, float]:
    """A unit's weight under independent token log-ratios: ``w = exp(Z)``, ``Z ~ N(-s**2 / 2, s**2)`` (so that
    ``E[w] = 1``) with ``s = sigma sqrt(W)``; closed forms of the untruncated effective sample size ``exp(-s**2)``,
    and with TIS at ``c``: ``E[min(w, c)]``, ``E[min(w, c)**2]``, their ESS ``E[min]**2 / E[min**2]`` and
    ``P(w > c)``, from ``E[w 1{w<c}] = Phi((ln c - mu - s**2) / s)`` and
    ``E[w**2 1{w<c}] = exp(s**2) Phi((ln c - mu - 2 s**2) / s)``."""
    if log_std <= 0:
        return {"raw_ess": 1.0, "ess": 1.0, "mean_weight": 1.0, "fraction_truncated": 0.0}
    phi = torch.distributions.Normal(0.0, 1.0).cdf
    s = torch.tensor(log_std, dtype=torch.float64)
    mu, log_c = -s * s / 2, math.log(threshold)
    above = 1 - phi((log_c - mu) / s)
    first = phi((log_c - mu - s * s) / s) + threshold * above
    second = torch.exp(s * s) * phi((log_c - mu - 2 * s * s) / s) + threshold**2 * above
    return {
        "raw_ess": float(torch.exp(-s * s)),
        "ess": float(first * first / second),
        "mean_weight": float(first),
        "fraction_truncated": float(above),
    }


def extrapolate(token_log_ratio_std: float) -> list[dict]:
    """`lognormal_figures` for every length of `EXTRAPOLATED_LENGTHS` and window of `EXTRAPOLATED_WINDOWS`."""
    rows = []
    for length in EXTRAPOLATED_LENGTHS:
        for window in EXTRAPOLATED_WINDOWS:
            size = min(window or length, length)
            figures = lognormal_figures(token_log_ratio_std * math.sqrt(size))
            rows.append({"length": length, "window": window or "sequence", **figures})
    return rows


def plot(rows: list[dict], summary: dict, path: Path) -> Path:
    """Per mismatch (a column): the measured effective sample size (TIS at 2) per level against response length; the
    measured spread of the units' log-weights beside ``sigma sqrt(W)``; the ESS that independent token log-ratios
    of the measured ``sigma`` give up to Llasa-1B's lengths (`lognormal_figures`), the measured points on it."""
    from maspo_lab.figures import pyplot, save

    plt = pyplot()
    fig, axes = plt.subplots(3, len(MISMATCHES), figsize=(6 * len(MISMATCHES), 12), squeeze=False)
    lengths = np.linspace(20, 1500, 150)
    for column, kind in enumerate(MISMATCHES):
        sigma = summary[kind]["token_log_ratio_std"]
        for index, level in enumerate(LEVELS):
            color = f"C{index}"
            points = [r for r in rows if r["mismatch"] == kind and r["level"] == level and r["length_bin"] != "all"]
            x = [p["mean_length"] for p in points]
            axes[0][column].plot(x, [p["ess"] for p in points], marker="o", color=color, label=level)
            axes[1][column].plot(x, [p["log_weight_std"] for p in points], marker="o", color=color, label=level)
            rollout_is, window = LEVELS[level]
            if rollout_is != "segment":
                continue
            sizes = lengths if window is None else np.minimum(lengths, window)
            predicted = [lognormal_figures(sigma * math.sqrt(size))["ess"] for size in sizes]
            axes[2][column].plot(lengths, predicted, color=color, label=level)
            axes[2][column].plot(x, [p["ess"] for p in points], "o", color=color)
            model = [sigma * math.sqrt(window or p["mean_length"]) for p in points]
            axes[1][column].plot(x, model, linestyle="--", color=color, alpha=0.6)
        titles = ("measured ESS (TIS at 2)", "std of log w per unit (dashed: sigma sqrt(W))", "ESS, independent tokens")
        for row, title in enumerate(titles):
            ax = axes[row][column]
            ax.set_title(f"{kind} rollout vs float32 trainer: {title}", fontsize=9)
            ax.set_xlabel("response length (tokens)" if row == 2 else "mean response length of the quarter (tokens)")
            ax.grid(alpha=0.3)
        axes[1][column].set_yscale("log")
        axes[2][column].set_ylim(0, 1.02)
    axes[0][0].legend(fontsize=8)
    return save(fig, path, title="mini-llasa: importance weights of the rollout mismatch, per level")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    for name, default in asdict(Settings()).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    args = parser.parse_args(argv)
    settings = Settings(**{name: getattr(args, name) for name in asdict(Settings())})
    torch.manual_seed(settings.seed)
    from maspo_lab.sampler import load_model
    from maspo_lab.speaking_model import SHIPPED, SHIPPED_MODEL

    trainer, _ = load_model(SHIPPED_MODEL, "float32", "cpu")
    trainer.eval()
    texts = chosen_texts(settings.texts, SHIPPED / "train_sentences.txt")
    rows, summary = [], {"settings": asdict(settings), "threshold": THRESHOLD, "levels": list(LEVELS)}
    for kind in MISMATCHES:
        kind_rows, summary[kind] = measure_mismatch(kind, texts, settings, trainer)
        summary[kind]["extrapolation"] = extrapolate(summary[kind]["token_log_ratio_std"])
        rows += kind_rows
        print(f"{kind}: {json.dumps(summary[kind])}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "levels.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({k: (round(v, 6) if isinstance(v, float) else v) for k, v in row.items()} for row in rows)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    plot(rows, summary, args.out / "mismatch.png")
    print(f"wrote {args.out}/levels.csv, summary.json, mismatch.png")


if __name__ == "__main__":
    main()
