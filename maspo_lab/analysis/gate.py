"""The gate before long runs: how much of a batch's policy gradient is signal under each reward and credit.

One design of fresh responses (``P`` prompts x ``G`` responses, the same for every route; `reference_cost.sample`)
is scored by the audio reward (the mini codec decodes, Whisper tiny.en hears, with its word times) and by the code
ear (no audio). Each route gives every response's policy gradient; the half-split cosine of the batch's gradient
(`reference_cost.half_split`: the prompts cut in two at random, 200 times) says how much of it is signal: two halves
of pure noise agree at 0, of pure signal at 1, and ``c / (1 - c)`` grows with the responses (McCandlish et al.).

Routes (GRPO's outcome advantage ``A_i`` unless named):

- ``whisper_cer``: today's reward, ``1 - tanh(3 CER)`` by Whisper, ``A_i * grad sum_t log pi(y_t)``;
- ``whisper_word_credit``: today's credit, ``adv_estimator=maspo`` (``redistribute``, lambda 0.5) with Whisper's word
  times (``frame_errors``) on the CER reward, per-token ``A_{i,t}``;
- ``ear_per``: ``1 - tanh(3 PER)`` by the code ear;
- ``ear_likelihood``: ``exp(-nll / 3)``, the ear's CTC likelihood per phoneme;
- ``ear_phoneme_credit``: ``credit_mode=per_unit`` (lambda 0.5) with the ear's phonemes on the ear's PER reward.

Scalar routes are also given with leave-one-out baselines (`reference_cost.route_rows`); every route over all
parameters, the output head and the last layer (`reference_cost.parameter_groups`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np
import torch

from maspo_lab.analysis.reference_cost import (
    CountSketch,
    Design,
    half_split_rows,
    parameter_groups,
    route_rows,
    sample,
    score_function_sketches,
)

CREDIT_WEIGHT = 0.5
"""lambda of both credit routes (the methods' default)."""
CREDIT_ROUTES = {
    "whisper_word_credit": ("audio", "whisper_cer", "redistribute"),
    "ear_phoneme_credit": ("ear", "ear_per", "per_unit"),
}
"""Credit route -> (which reward's frame signals, the scalar route it credits, the credit mode)."""


def scalar_rewards(audio: list[dict], ear: list[dict]) -> dict[str, torch.Tensor]:
    """Each response's reward under each scalar route (module docstring)."""

    def column(results: list[dict], key: str) -> torch.Tensor:
        return torch.tensor([float(r[key]) for r in results], dtype=torch.float64)

    return {
        "whisper_cer": column(audio, "speech_error_utility"),
        "ear_per": column(ear, "speech_error_utility"),
        "ear_likelihood": torch.exp(-column(ear, "speech_ear_nll") / 3.0)
        * column(ear, "speech_valid"),  # an unscored response is worst
    }


def credit_advantages(
    fresh, results: list[dict], rewards: torch.Tensor, mode: str, layout: str, weight: float = CREDIT_WEIGHT
) -> torch.Tensor:
    """Per-token advantages ``(N, T)`` of ``adv_estimator=maspo`` in ``mode`` on the responses of ``fresh`` with the
    reward's frame signals, through the plugin's own placement of signals on tokens."""
    from omegaconf import OmegaConf

    from maspo_verl.advantage import compute_maspo_credit_advantage
    from maspo_verl.credit_config import CreditConfig
    from maspo_verl.verl_patches.trainer import credit_inputs_for

    block = {"credit_mode": mode, "credit_weight": weight, "codec": {"layout": layout}}
    settings = CreditConfig.from_mapping(block)
    mask = fresh.batch.mask.long()
    token_rewards = torch.zeros(mask.shape, dtype=torch.float64)
    last = (mask.sum(-1) - 1).clamp(min=0)
    token_rewards[torch.arange(len(rewards)), last] = rewards
    inputs = credit_inputs_for(
        fresh.batch.response_ids,
        mask,
        [r.get("frame_errors", "") for r in results],
        settings,
        [r.get("frame_words", "") for r in results],
    )
    algorithm = OmegaConf.create({"adv_estimator": "maspo", "norm_adv_by_std_in_grpo": True, "maspo": block})
    advantages, _ = compute_maspo_credit_advantage(
        token_rewards, mask, np.array(fresh.index), config=algorithm, credit_inputs=inputs
    )
    return advantages


def gate(
    model,
    tokenizer,
    prompts: list,
    audio_reward,
    ear_reward,
    design: Design,
    *,
    temperature: float,
    max_new_tokens: int,
    layout: str,
    seed: int = 0,
    splits: int = 200,
    sketch_size: int = 1 << 16,
    progress: Callable[[str], None] = print,
) -> dict:
    """The gate's rows (module docstring) for one design; ``audio_reward`` reports Whisper's ``frame_errors``,
    ``ear_reward`` the ear's ``frame_errors`` and ``frame_words``."""
    start = time.monotonic()
    fresh = sample(model, tokenizer, prompts, design, temperature, max_new_tokens, seed)
    progress(f"  {design}: sampled {len(fresh.responses)} responses in {time.monotonic() - start:.0f}s; hearing")
    heard_at = time.monotonic()
    audio = audio_reward.score_batch(fresh.requests)
    read_at = time.monotonic()
    ear = ear_reward.score_batch(fresh.requests)
    scored_at = time.monotonic()
    progress(f"  {design}: heard in {read_at - heard_at:.0f}s, read by the ear in {scored_at - read_at:.1f}s")
    rewards = scalar_rewards(audio, ear)
    groups = parameter_groups(model)
    sketches = {name: CountSketch(params, sketch_size, seed + k) for k, (name, params) in enumerate(groups.items())}
    score = score_function_sketches(model, fresh.batch, temperature, fresh.pad_id, sketches)
    rows = route_rows(rewards, score, design, splits=splits, seed=seed, seconds_per_response=math.nan)
    for route, (source, scalar, mode) in CREDIT_ROUTES.items():
        results = audio if source == "audio" else ear
        weights = credit_advantages(fresh, results, rewards[scalar], mode, layout)
        progress(f"  {design}: gradients of {route}")
        per_response = score_function_sketches(model, fresh.batch, temperature, fresh.pad_id, sketches, weights)
        for group, vectors in per_response.items():
            about = {"reward": route, "baseline": "grpo", "parameters": group}
            rows += half_split_rows(about, vectors, design, splits, seed, math.nan)
    aligned = {
        "whisper": float(np.mean([bool(r.get("frame_errors")) for r in audio])),
        "ear": float(np.mean([bool(r.get("frame_words")) for r in ear])),
    }
    return {
        "design": str(design),
        "rows": rows,
        "reward_means": {name: float(v.mean()) for name, v in rewards.items()},
        "aligned": aligned,
        "seconds": {"hearing": read_at - heard_at, "ear": scored_at - read_at, "total": time.monotonic() - start},
    }


def gate_table(rows: list[dict], baseline: str = "grpo") -> str:
    """Markdown: each route's half-split cosine at the design's responses (GRPO baseline), per parameter group."""
    full = max(r["responses"] for r in rows)
    chosen = [r for r in rows if r["responses"] == full and r["baseline"] == baseline]
    groups = sorted({r["parameters"] for r in chosen})
    lines = ["| route | " + " | ".join(f"half-split, {g}" for g in groups) + " |", "|---" * (len(groups) + 1) + "|"]
    for route in dict.fromkeys(r["reward"] for r in chosen):
        cells = []
        for group in groups:
            (row,) = [r for r in chosen if r["reward"] == route and r["parameters"] == group]
            cells.append(f"{row['half_split']:.3f} ({row['half_split_sd']:.3f})")
        lines.append(f"| {route} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
