"""What a fidelity reference costs on speech: how fast the on-policy gradient's halves agree, route by route.

The fidelity measurement (`maspo_lab.analysis.fidelity`) compares estimators with a reference, the on-policy
gradient at pi_theta from fresh responses, and trusts it when its two halves agree (half-split cosine ``c >= 0.8``).
If each half is the true gradient plus independent noise, ``c / (1 - c)`` grows in proportion to the responses per
half, so a pilot's ``c`` at ``N`` responses gives the responses that 0.8 needs:

    N_0.8 = N * 4 (1 - c) / c                                       (c > 0; 4 = 0.8 / 0.2)

This module measures ``c`` for each route at once on the same responses (one pilot per sampling design, ``P``
prompts x ``G`` responses at pi_old's temperature, k = 0):

- reward (`REWARDS`): the reward's CER utility ``u_c = 1 - tanh(3 CER)`` (what training uses), the recogniser's
  likelihood of the reference text ``u_n = exp(-asr_nll / 3)`` (continuous), and the anchors' harmonic composite of
  the two; one scoring pass gives all three;
- baseline (`BASELINES`): GRPO's ``(r - mean_g r) / (std_g r + eps)`` (veRL's ``compute_grpo_outcome_advantage``),
  or leave-one-out ``r_i - mean_{j != i} r_j`` (an unbiased control variate: the expected gradient is unchanged,
  the std division of GRPO is not);
- parameters (`parameter_groups`): every parameter, the tied embedding / output head alone, or the last layer
  (its block and the final norm): a question asked in a subspace is asked there only.

Each response's score-function gradient ``s_i = grad sum_t log pi(y_t)`` is computed once (one backward pass per
response) and kept as a count sketch of ``sketch_size`` buckets per parameter group (each coordinate added with a
random sign into a random bucket: inner products are kept in expectation, a cosine to about ``1 / sqrt(buckets)``).
A half's gradient under any route is then ``sum_i A_i s_i`` over its prompts' responses; the half-split cosine is
averaged over ``splits`` random halvings of the prompts (its spread says how far one halving can fall), and the
same at a quarter of the prompts gives the curve's second point, checking the sizing rule's slope.
"""

from __future__ import annotations

import csv
import json
import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from maspo_lab.figures import pyplot, save

REWARDS = {
    "cer": "speech_error_utility",
    "likelihood": "speech_likelihood_utility",
    "composite": "speech_intelligibility",
}
"""Each reward route's value in the speech reward's results (anchors' intelligibility, `reward_fns.reward`)."""
BASELINES = ("grpo", "loo")
GRPO_EPS = 1e-6
"""veRL's ``compute_grpo_outcome_advantage`` epsilon."""


@dataclass(frozen=True)
class Design:
    """A sampling design: ``prompts`` x ``group`` responses."""

    prompts: int
    group: int

    @classmethod
    def parse(cls, text: str) -> Design:
        """``PxG`` (``128x4``); ``ValueError`` naming what is valid."""
        try:
            prompts, group = (int(part) for part in text.lower().split("x"))
        except ValueError:
            raise ValueError(f"design {text!r}: expected PROMPTSxGROUP, e.g. 128x4") from None
        if prompts < 8 or group < 2:
            raise ValueError(f"design {text!r}: needs at least 8 prompts (a quarter of them halved) and groups of 2")
        return cls(prompts, group)

    def __str__(self) -> str:
        return f"{self.prompts}x{self.group}"


def advantages(rewards: torch.Tensor, baseline: str) -> torch.Tensor:
    """``(P, G)`` rewards -> advantages: GRPO's ``(r - mean) / (std + eps)`` (unbiased std over the group, as veRL)
    or leave-one-out ``r_i - mean_{j != i} r_j``."""
    group = rewards.shape[1]
    if baseline == "grpo":
        return (rewards - rewards.mean(dim=1, keepdim=True)) / (rewards.std(dim=1, keepdim=True) + GRPO_EPS)
    if baseline == "loo":
        return rewards - (rewards.sum(dim=1, keepdim=True) - rewards) / (group - 1)
    raise ValueError(f"baseline {baseline!r}: valid {BASELINES}")


def parameter_groups(model) -> dict[str, list[torch.nn.Parameter]]:
    """``all`` (every trainable parameter), ``head`` (the output head, tied to the input embedding in mini-llasa),
    ``last`` (the last decoder layer and the final norm)."""
    head = model.get_output_embeddings().weight
    decoder = model.get_decoder()
    last = [*decoder.layers[-1].parameters(), *decoder.norm.parameters()]
    return {"all": [p for p in model.parameters() if p.requires_grad], "head": [head], "last": last}


class CountSketch:
    """A fixed random count sketch of the concatenated gradients of ``params`` into ``size`` buckets."""

    def __init__(self, params: Sequence[torch.nn.Parameter], size: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        total = sum(p.numel() for p in params)
        self.params, self.size = list(params), size
        self.bucket = torch.randint(0, size, (total,), generator=generator)
        self.sign = torch.randint(0, 2, (total,), generator=generator).to(torch.float64) * 2 - 1

    def __call__(self, grads: Sequence[torch.Tensor | None]) -> torch.Tensor:
        flat = torch.cat(
            [(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, self.params)]
        )
        return torch.zeros(self.size, dtype=torch.float64).index_add_(
            0, self.bucket, flat.to(torch.float64) * self.sign
        )


def score_function_sketches(
    model,
    batch,
    temperature: float,
    pad_id: int,
    sketches: dict[str, CountSketch],
    token_weights: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Per parameter group, ``(N, size)``: the sketch of ``grad sum_t w_t log pi(y_t)`` of each response of ``batch``
    (`maspo_lab.analysis.policy_gradients.Batch`), one backward pass per response; ``w_t`` is 1 (the score function)
    or ``token_weights`` ``(N, T)`` (per-token advantages: the response's policy gradient itself)."""
    from maspo_lab.analysis.policy_gradients import response_log_probs

    wanted = {id(p) for sketch in sketches.values() for p in sketch.params}
    params = [p for p in model.parameters() if id(p) in wanted]
    rows = batch.response_ids.shape[0]
    out = {name: torch.zeros(rows, sketch.size, dtype=torch.float64) for name, sketch in sketches.items()}
    for i in range(rows):
        log_probs = response_log_probs(model, batch.rows(slice(i, i + 1)), temperature, pad_id)
        if token_weights is not None:
            log_probs = log_probs * token_weights[i : i + 1, : log_probs.shape[1]].to(log_probs.dtype)
        total = log_probs.sum()
        grads = dict(zip(map(id, params), torch.autograd.grad(total, params, allow_unused=True)))
        for name, sketch in sketches.items():
            out[name][i] = sketch([grads[id(p)] for p in sketch.params])
    return out


def half_split(vectors: torch.Tensor, rng: random.Random, splits: int, prompts: int | None = None) -> list[float]:
    """``vectors`` ``(P, D)``, one per prompt: the cosine of the two halves' sums over ``splits`` random halvings of
    ``prompts`` of them (a random subset; all by default)."""
    cosines = []
    for _ in range(splits):
        chosen = rng.sample(range(vectors.shape[0]), prompts or vectors.shape[0])
        half = len(chosen) // 2
        a, b = vectors[chosen[:half]].sum(dim=0), vectors[chosen[half : 2 * half]].sum(dim=0)
        denominator = float(a.norm() * b.norm())
        cosines.append(float(a @ b) / denominator if denominator > 0 else math.nan)
    return cosines


def responses_for(c: float, responses: int, target: float = 0.8) -> float:
    """The sizing rule: responses for half-split ``target`` from ``c`` at ``responses`` (inf when ``c <= 0``)."""
    if not c > 0:
        return math.inf
    return responses * (target / (1 - target)) * (1 - c) / c


def route_rows(
    rewards: dict[str, torch.Tensor],
    sketches: dict[str, torch.Tensor],
    design: Design,
    *,
    splits: int,
    seed: int,
    seconds_per_response: float,
) -> list[dict]:
    """One row per reward, baseline, parameter group and size (all prompts, a quarter of them): the half-split
    cosine's mean and spread over halvings, and the responses and hours that 0.8 needs by the sizing rule."""
    rows = []
    for reward, values in rewards.items():
        for baseline in BASELINES:
            weights = advantages(values.view(design.prompts, design.group), baseline)
            for group, per_response in sketches.items():
                route = {"reward": reward, "baseline": baseline, "parameters": group}
                rows += half_split_rows(
                    route, weights.reshape(-1, 1) * per_response, design, splits, seed, seconds_per_response
                )
    return rows


def half_split_rows(
    route: dict, per_response: torch.Tensor, design: Design, splits: int, seed: int, seconds_per_response: float
) -> list[dict]:
    """A route's rows at all prompts and a quarter of them, from each response's gradient sketch ``(N, size)``:
    the half-split cosine's mean and spread over halvings, and the responses and hours that 0.8 needs."""
    per_prompt = per_response.view(design.prompts, design.group, -1).sum(dim=1)
    rows = []
    for prompts in (design.prompts, design.prompts // 4):
        found = [c for c in half_split(per_prompt, random.Random(seed), splits, prompts) if math.isfinite(c)]
        mean = statistics.fmean(found) if found else math.nan
        needed = responses_for(mean, prompts * design.group)
        rows.append(
            {
                "design": str(design),
                **route,
                "responses": prompts * design.group,
                "half_split": mean,
                "half_split_sd": statistics.stdev(found) if len(found) > 1 else math.nan,
                "responses_for_0.8": needed,
                "hours_for_0.8": needed * seconds_per_response / 3600,
            }
        )
    return rows


@dataclass
class Fresh:
    """Fresh responses of a design (`sample`): the token ids, the reward's requests and the gradient batch."""

    responses: list[list[int]]
    requests: list[dict]
    batch: object
    pad_id: int
    index: list[int]
    """Each response's prompt (its GRPO group)."""


def sample(
    model, tokenizer, prompts: list, design: Design, temperature: float, max_new_tokens: int, seed: int
) -> Fresh:
    """``design.group`` responses to each of ``design.prompts`` of ``prompts`` (chosen by ``seed``), as the ``hf``
    rollout samples them, with the speech reward's requests and a `policy_gradients.Batch` of them."""
    from maspo_lab.analysis.policy_gradients import Batch
    from maspo_lab.sampler import Sampler

    if len(prompts) < design.prompts:
        raise ValueError(f"design {design}: {design.prompts} prompts asked, {len(prompts)} given")
    chosen = random.Random(seed).sample(prompts, design.prompts)
    sampler = Sampler(model, tokenizer, seed, temperature, max_new_tokens)
    model.eval()
    responses = sampler.sample([p.ids for p in chosen for _ in range(design.group)], version=1)
    index = [i // design.group for i in range(len(responses))]
    requests = [
        {"ground_truth": chosen[g].ground_truth, "token_ids": list(r), "language": "en"}
        for g, r in zip(index, responses)
    ]
    width = max(1, max(len(r) for r in responses))
    ids = torch.zeros(len(responses), width, dtype=torch.long)
    mask = torch.zeros(len(responses), width)
    for i, r in enumerate(responses):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = 1
    zeros = torch.zeros(len(responses))
    batch = Batch([chosen[g].ids for g in index], ids, mask, zeros, zeros)
    return Fresh(responses, requests, batch, sampler.pad_id, index)


def pilot(
    model,
    tokenizer,
    prompts: list,
    reward,
    design: Design,
    *,
    temperature: float,
    max_new_tokens: int,
    seed: int = 0,
    splits: int = 200,
    sketch_size: int = 1 << 16,
    progress: Callable[[str], None] = print,
) -> dict:
    """One pilot (module docstring): ``design.prompts`` of ``prompts`` (`maspo_lab.analysis.fidelity_scoring.Prompt`),
    ``design.group`` responses each from ``model`` (``tokenizer`` its own) as the ``hf`` rollout samples them,
    scored by ``reward`` (a `reward_fns.pipeline.SpeechReward` whose results carry every `REWARDS` part); returns
    ``rows`` (`route_rows`), the mean of each reward, and the seconds per scored response and per gradient."""
    start = time.monotonic()
    fresh = sample(model, tokenizer, prompts, design, temperature, max_new_tokens, seed)
    sampled = time.monotonic()
    progress(f"  {design}: sampled {len(fresh.responses)} responses in {sampled - start:.0f}s; scoring")
    results = reward.score_batch(fresh.requests)
    scored = time.monotonic()
    rewards = {
        name: torch.tensor([float(r[key]) for r in results], dtype=torch.float64) for name, key in REWARDS.items()
    }
    batch = fresh.batch
    responses = fresh.responses
    groups = parameter_groups(model)
    sketches = {name: CountSketch(params, sketch_size, seed + k) for k, (name, params) in enumerate(groups.items())}
    progress(
        f"  {design}: scored in {scored - sampled:.0f}s ({(scored - sampled) / len(responses):.2f} s each); gradients"
    )
    per_response = score_function_sketches(model, batch, temperature, fresh.pad_id, sketches)
    done = time.monotonic()
    seconds = (scored - start) / len(responses)  # what a reference's response costs: sampling and hearing
    rows = route_rows(rewards, per_response, design, splits=splits, seed=seed, seconds_per_response=seconds)
    return {
        "design": str(design),
        "rows": rows,
        "reward_means": {name: float(v.mean()) for name, v in rewards.items()},
        "valid": sum(float(r["speech_valid"]) for r in results) / len(results),
        "seconds": {"sampling": sampled - start, "scoring": scored - sampled, "gradients": done - scored},
        "seconds_per_response": seconds,
    }


PILOT_FIELDS = ("design", "reward", "baseline", "parameters", "responses", "half_split", "half_split_sd")
PILOT_FIELDS += ("responses_for_0.8", "hours_for_0.8")


def write_pilots(pilots: list[dict], rows: list[dict], out: Path) -> None:
    """``reference_cost.csv`` (one row per route and size), ``.json`` (the pilots) and ``.png``."""
    with open(out / "reference_cost.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=PILOT_FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    (out / "reference_cost.json").write_text(json.dumps({"pilots": pilots}, indent=1, default=float) + "\n")
    plot_reference_cost(rows, out / "reference_cost.png")


def pilot_table(rows: list[dict]) -> str:
    """Markdown: per design, reward, baseline and parameters, the half-split at each size and what 0.8 needs."""
    lines = [
        "| design | reward | baseline | parameters | responses | half-split (sd over halvings) | responses for 0.8 | "
        "hours for 0.8 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        needed = r["responses_for_0.8"]
        lines.append(
            f"| {r['design']} | {r['reward']} | {r['baseline']} | {r['parameters']} | {r['responses']} | "
            f"{r['half_split']:.3f} ({r['half_split_sd']:.3f}) | {needed:,.0f} | {r['hours_for_0.8']:.1f} |"
            if math.isfinite(needed)
            else f"| {r['design']} | {r['reward']} | {r['baseline']} | {r['parameters']} | {r['responses']} | "
            f"{r['half_split']:.3f} ({r['half_split_sd']:.3f}) | - | - |"
        )
    return "\n".join(lines)


def plot_reference_cost(rows: list[dict], path: Path) -> Path:
    """Half-split cosine against responses, one line per route (reward, baseline) and panel per parameter group,
    with the spread over halvings; the sizing rule's curve through the largest pilot, dashed."""
    plt = pyplot()
    groups = sorted({r["parameters"] for r in rows})
    fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 3.8), squeeze=False)
    for ax, group in zip(axes[0], groups):
        for key in sorted({(r["design"], r["reward"], r["baseline"]) for r in rows if r["parameters"] == group}):
            mine = sorted(
                (r for r in rows if (r["design"], r["reward"], r["baseline"]) == key and r["parameters"] == group),
                key=lambda r: r["responses"],
            )
            xs = [r["responses"] for r in mine]
            line = ax.errorbar(
                xs,
                [r["half_split"] for r in mine],
                yerr=[r["half_split_sd"] for r in mine],
                marker="o",
                capsize=3,
                label=" ".join(key),
            )
            c, n = mine[-1]["half_split"], mine[-1]["responses"]
            if c > 0:  # c / (1 - c) proportional to responses
                grid = [n * f for f in (0.25, 0.5, 1, 2, 4, 8, 16)]
                ratio = [c / (1 - c) * x / n for x in grid]
                ax.plot(grid, [q / (1 + q) for q in ratio], ls="--", color=line[0].get_color(), alpha=0.5)
        ax.axhline(0.8, color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("responses in the reference")
        ax.set_ylabel("half-split cosine")
        ax.set_title(f"parameters: {group}", fontsize=10)
        ax.legend(fontsize=6)
    save(fig, path, "What a fidelity reference costs on speech, by route (dashed: the sizing rule)")
    return path
