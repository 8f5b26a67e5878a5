"""Gradient fidelity: how well each policy loss's gradient follows the on-policy gradient when the data is stale.

A task (`maspo_verl.runs.tasks`) supplies the policy (pi_old), its prompts and its `Scorer`: the synthetic task's
reward on decoded text (`SyntheticScorer`), or the speech task's real reward, the mini codec and Whisper tiny.en
scoring whole batches (`SpeechScorer`); its methods (`builtin_estimators`) run as the task runs them (mini-llasa's
layout on speech). For one repeat:

1. sample a batch from pi_old as the rollout samples (``G`` responses per prompt at the task's temperature, the
   ``hf`` rollout's own sampler, `maspo_verl.cpu.hf_rollout`), score it, take GRPO advantages with veRL's
   ``compute_grpo_outcome_advantage``; ``log pi_old`` is recomputed by a forward pass, as veRL's actor does;
2. make it stale: pi_theta = pi_old after ``k`` optimizer updates of GRPO (veRL's ``vanilla`` loss, its clip) on the
   batch's mini-batches in turn, with the run's optimizer (AdamW with veRL's defaults, gradient clip) and lr;
3. at each ``k``, for each `Estimator` with its clip as configured and with the clip off: the gradient with respect
   to theta of veRL's registered policy loss (``get_policy_loss_fn``, a real ``ActorConfig``, ``token-mean`` for all,
   so that every loss is the same surrogate ``-mean_t A_t log pi_theta(y_t)`` in gradient when every ratio is 1);
4. the reference: the on-policy gradient at theta, the same surrogate on fresh samples from pi_theta for the same
   prompts (``reference_groups`` groups of ``G`` per prompt, ratios 1), split into two halves whose cosine
   (the half-split cosine ``c``) says how precise it is. If the halves are the true gradient plus independent
   noise, the whole reference has cosine ``sqrt(2c / (1 + c))`` with the truth (Spearman-Brown): the ceiling any
   estimator's cosine with it can reach.

With ``reference_groups = 0`` steps 3 and 4 are skipped: the log-ratios' structure alone, at the cost of pi_old's
batches (the streams a reference would use are still spent, so the batches and log-ratios are the same as with one).

Per estimator and k: cosine with the reference, norm relative to the reference's, clip fraction (response tokens
whose gradient the clip zeroes: 0 with the clip, not without). The log-ratios ``d_t`` at each k feed
`maspo_verl.analysis.log_ratios`. At k = 0 every ratio is 1 and every estimator is the on-policy surrogate on the
stale batch: that row is the sampling noise of one batch.

Cost: the backward passes run once per micro-batch with the graph kept, one ``autograd.grad`` per estimator. With
a real recogniser, scoring the reference (``reference_groups`` x ``G`` fresh responses per prompt at every k) is most
of the time: `ScoreMeter` times every scoring call and prints the time left.
"""

from __future__ import annotations

import copy
import functools
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from maspo_verl.analysis import log_ratios
from maspo_verl.data import synthetic_tts
from maspo_verl.runs.synthetic_run import TASK_DEFAULTS

DEFAULT_UPDATES = (0, 1, 4, 16)
DEFAULT_WINDOWS = (2, 4, 8, 16)
STD_WINDOW_LENGTHS = (1, 2, 4, 8, 16)
MAX_LAG = 16
"""The log-ratio statistics' window lengths and lags on the synthetic task (responses of at most 24 tokens)."""
DEFAULT_TARGET_LENGTHS = (4, 8, 16)
TASK_SETTINGS: dict[str, dict[str, Any]] = {
    "speech": {"response_length": 4 * 50 + 1, "window_lengths": (1, 2, 4, 8, 16, 32, 64), "max_lag": 50},
}
"""What the measurement sets apart from a task's run (`FidelitySettings.for_task`). Speech: responses of 1-4 s are
50-200 codes (50 per second), so the budget covers 4 s and the end tag (201 tokens; the trainer's 251 stops a
runaway at 5 s), windows up to 64 codes and lags up to one second."""


def threshold_candidates(layout: str = "llasa-1b") -> dict[str, tuple[float, ...]]:
    """Thresholds searched for a target mean segment length on a speech-token layout's codes: the FSQ L1 digit
    distance (0 up to the lattice's largest: Llasa-1B's 8 digits in 0..3, 24; mini-llasa's 5, 15), the raw codec-id
    jump (powers of 2 up to the codebook: 65,536 or 1,024), the z-score of the old log-prob drop."""
    from reward_fns.speech_tokens.layout import get_layout

    chosen = get_layout(layout)
    candidates: dict[str, tuple[float, ...]] = {}
    if chosen.fsq_levels:
        candidates["fsq"] = tuple(range(0, sum(level - 1 for level in chosen.fsq_levels) + 1))
    candidates["token_jump"] = (0, *(2**p for p in range(chosen.codebook_size.bit_length())))
    candidates["logprob"] = tuple(round(0.05 * 1.25**p, 4) for p in range(30))
    return candidates


UNCLIPPED = {"clip_ratio_low": 1.0, "clip_ratio_high": 1e9, "clip_ratio_c": 1e9}
"""veRL's clip settings that never bind: ratio in [0, 1e9], dual clip at 1e9."""
MASPO_UNCLIPPED = {
    "clip_ratio_low": 1.0 - 1e-9,
    "clip_ratio_high": 1e9,
    "clip_length_exponent": 0.0,
    "clip_ratio_c": None,
}
"""MASPO's: the segment ratio passes unless it is below 1e-9 (log-ratio -20.7, beyond its log-ratio clamp)."""


@dataclass(frozen=True)
class Estimator:
    """A policy loss of the comparison: veRL's ``loss_mode``, for ``maspo`` its segmenter block, and the clip range
    the method sets (``clip_ratio_low``/``clip_ratio_high``; `from_method`)."""

    name: str
    loss_mode: str
    segmenter: dict[str, Any] | None = None
    clip: dict[str, float] = field(default_factory=dict)
    maspo: dict[str, Any] = field(default_factory=dict)
    """The method's other MASPO settings (``maspo.codec``: the model's layout, which a task refines)."""

    @classmethod
    def from_method(cls, method) -> Estimator:
        """The policy loss a method of `maspo_verl.methods` selects; `MethodError` if it sets more than the actor's
        loss (a credit method's advantage is not what this measurement compares)."""
        from maspo_verl.methods import MethodError, method_settings

        settings = method_settings(method)
        actor = settings.get("actor_rollout_ref", {}).get("actor", {})
        other = sorted(set(settings) - {"actor_rollout_ref"})
        loss_mode = actor.get("policy_loss", {}).get("loss_mode")
        if other or loss_mode is None:
            raise MethodError(
                f"--estimators {method.name!r}: a method that selects a policy loss and sets nothing else "
                f"(it sets {other or 'no actor_rollout_ref.actor.policy_loss.loss_mode'})"
            )
        block = dict(actor["policy_loss"].get("maspo", {}))
        segmenter = block.pop("segmenter", None)
        clip = {key: float(actor[key]) for key in ("clip_ratio_low", "clip_ratio_high") if key in actor}
        return cls(method.name, loss_mode, segmenter, clip, block)

    def actor_config(self, clipped: bool):
        """A veRL ``ActorConfig`` with this loss, ``token-mean``, and its clip (the method's for veRL's losses,
        MASPO's defaults for ``maspo``) or, ``clipped=False``, a clip that never binds."""
        from verl.workers.config import ActorConfig

        from maspo_verl.config import MaspoPolicyLossConfig

        clip = dict(UNCLIPPED)
        maspo: dict[str, Any] = {}
        if self.loss_mode == "maspo":
            maspo = {**self.maspo, "segmenter": dict(self.segmenter or {}), **({} if clipped else MASPO_UNCLIPPED)}
        elif clipped:
            clip = {**self.clip, "clip_ratio_c": 3.0}
        return ActorConfig(
            strategy="fsdp",
            rollout_n=1,
            ppo_micro_batch_size_per_gpu=1,
            **({"clip_ratio": clip["clip_ratio_high"]} if "clip_ratio_high" in clip else {}),
            loss_agg_mode="token-mean",
            policy_loss=MaspoPolicyLossConfig(loss_mode=self.loss_mode, maspo=maspo),
            **clip,
        )


CONTENT_METHODS = ("maspo-token-jump", "maspo-fsq", "maspo-logprob")
"""The MASPO methods with content-aware segments, compared as the task runs them."""


def builtin_estimators(windows: Sequence[int] = DEFAULT_WINDOWS, task: str = "synthetic") -> dict[str, Estimator]:
    """The methods of `maspo_verl.methods` as ``task`` (`maspo_verl.runs.tasks`) runs them
    (`maspo_verl.methods.task_method`): ``grpo`` (token ratio), ``maspo-fixed<W>`` per window (``maspo-fixed4``
    with the window set), `CONTENT_METHODS`, ``gspo`` (sequence ratio)."""
    return dict(_builtin_estimators(tuple(windows), task))


@functools.cache
def _builtin_estimators(windows: tuple[int, ...], task: str) -> dict[str, Estimator]:
    from maspo_verl.methods import MASPO_KEY, refine, task_method
    from maspo_verl.runs.tasks import task_run

    refinements = task_run(task).TASK
    fixed = task_method("maspo-fixed4", refinements)
    methods = [task_method("grpo", refinements)]
    methods += [refine(fixed, [f"{MASPO_KEY}.segmenter.window={w}"], name=f"maspo-fixed{w}") for w in windows]
    methods += [task_method(name, refinements) for name in (*CONTENT_METHODS, "gspo")]
    return {m.name: Estimator.from_method(m) for m in methods}


def estimators_of(names: Sequence[str], task: str = "synthetic") -> list[Estimator]:
    """The `builtin_estimators` named, or any other method of `maspo_verl.methods` that selects a policy loss (as
    ``task`` runs it); ``ValueError`` naming ``--estimators`` otherwise."""
    from maspo_verl.methods import BUILTIN_METHODS, MethodError, task_method
    from maspo_verl.runs.tasks import task_run

    known = builtin_estimators(task=task)
    unknown = [name for name in names if name not in known and name not in BUILTIN_METHODS]
    if unknown or not names:
        valid = ", ".join(dict.fromkeys([*known, *BUILTIN_METHODS]))
        raise ValueError(f"--estimators: unknown {unknown or 'empty list'}; valid: {valid}")
    try:
        return [
            known[name] if name in known else Estimator.from_method(task_method(name, task_run(task).TASK))
            for name in names
        ]
    except MethodError as error:
        raise ValueError(str(error)) from None


def grpo_estimator() -> Estimator:
    """GRPO, the loss whose updates make the batch stale."""
    from maspo_verl.methods import BUILTIN_METHODS

    return Estimator.from_method(BUILTIN_METHODS["grpo"])


@dataclass
class FidelitySettings:
    """What one measurement runs; `validate` rejects bad values naming the command-line flag. ``task`` (a name of
    `maspo_verl.runs.tasks`) runs the methods as that task does; the batch shape, learning rate, temperature and
    response budget default to the synthetic task's run (`TASK_DEFAULTS`, read from ``trainer_config/scale/tiny.yaml``;
    `for_task` takes another task's)."""

    task: str = "synthetic"
    updates: tuple[int, ...] = DEFAULT_UPDATES
    estimators: tuple[str, ...] = tuple(builtin_estimators())
    repeats: int = 3
    batch: int = TASK_DEFAULTS["batch"]
    n: int = TASK_DEFAULTS["n"]
    mini_batches: int = TASK_DEFAULTS["mini_batches"]
    lr: float = TASK_DEFAULTS["lr"]
    temperature: float = TASK_DEFAULTS["temperature"]
    response_length: int = TASK_DEFAULTS["response_length"]
    reference_groups: int = 2
    micro_batch: int = 16
    vocabulary_gradient: bool = False
    """Include the (tied) vocabulary matrix in theta (exact either way; ~10x the cost on CPU, `parameter_gradients`)."""
    target_lengths: tuple[int, ...] = DEFAULT_TARGET_LENGTHS
    window_lengths: tuple[int, ...] = STD_WINDOW_LENGTHS
    """Window lengths L of the log-ratio's window std (`maspo_verl.analysis.log_ratios`)."""
    max_lag: int = MAX_LAG
    """Lags 1..max_lag of the log-ratio's autocorrelation."""
    score_batch: int = 64
    """Responses per call of the scorer (each call is timed and reported)."""
    seed: int = 0
    dtype: str = "float32"
    device: str = "cpu"
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def for_task(cls, task: str, **changes) -> FidelitySettings:
        """The settings with ``task``'s run shape (`maspo_verl.runs.tasks`: batch, n, mini-batches, lr,
        temperature, response budget), then the measurement's own for the task (`TASK_SETTINGS`), then
        ``changes``."""
        from maspo_verl.runs.tasks import task_run

        d = task_run(task).TASK_DEFAULTS
        shape = {key: d[key] for key in ("batch", "n", "mini_batches", "lr", "temperature", "response_length")}
        return cls(task=task, **{**shape, **TASK_SETTINGS.get(task, {}), **changes})

    def validate(self) -> None:
        from maspo_verl.runs.tasks import TASK_NAMES

        if self.task not in TASK_NAMES:
            raise ValueError(f"--task must be one of {', '.join(TASK_NAMES)}, got {self.task!r}")
        estimators_of(self.estimators, self.task)
        if not self.updates or min(self.updates) < 0:
            raise ValueError(f"--updates must be integers >= 0 (optimizer updates k), got {list(self.updates)}")
        if any(t < 1 for t in self.target_lengths):
            raise ValueError(f"--target-length must be >= 1 (tokens), got {list(self.target_lengths)}")
        if not self.window_lengths or min(self.window_lengths) < 1:
            raise ValueError(f"--window-lengths must be integers >= 1 (tokens), got {list(self.window_lengths)}")
        for flag, value in (
            ("repeats", self.repeats),
            ("batch", self.batch),
            ("n", self.n),
            ("mini-batches", self.mini_batches),
            ("response-length", self.response_length),
            ("micro-batch", self.micro_batch),
            ("score-batch", self.score_batch),
            ("max-lag", self.max_lag),
        ):
            if value < 1:
                raise ValueError(f"--{flag} must be >= 1, got {value}")
        if self.batch % self.mini_batches:
            raise ValueError(f"--batch {self.batch} must be a multiple of --mini-batches {self.mini_batches}")
        if self.n < 2:
            raise ValueError(f"--n must be >= 2 (GRPO needs a group to compare within), got {self.n}")
        if self.reference_groups < 0 or self.reference_groups % 2:
            raise ValueError(
                "--reference-groups must be 0 (no reference: the log-ratio structure only) or even and >= 2 "
                f"(two halves), got {self.reference_groups}"
            )
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"--lr must be a finite number > 0, got {self.lr}")
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ValueError(f"--temperature must be a finite number > 0 (sampling), got {self.temperature}")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"--dtype must be float32 or float64, got {self.dtype!r}")


@dataclass
class Prompt:
    """A prompt of the measurement: its token ids and what the reward needs."""

    ids: list[int]
    data_source: str
    ground_truth: str


def load_prompts(data: str | Path, tokenizer, sources: Sequence[str] = (synthetic_tts.DATA_SOURCE,)) -> list[Prompt]:
    """The rows of a veRL parquet (``prompt`` messages, ``data_source``, ``reward_model.ground_truth``), rendered as
    veRL's agent loop renders them with Llasa's chat template; only rows of the task's ``sources`` (its
    `Scorer`'s) can be scored here."""
    import pandas as pd

    from reward_fns.speech_tokens.llasa_prompt import SPEECH_CHAT_TEMPLATE

    frame = pd.read_parquet(data)
    missing = sorted({"prompt", "data_source", "reward_model"} - set(frame.columns))
    if missing:
        raise ValueError(f"--data {data}: no column(s) {missing} (write it with `maspo-verl prepare-data`)")
    prompts = []
    for row in frame.itertuples():
        if row.data_source not in sources:
            raise ValueError(
                f"--data {data}: data_source {row.data_source!r}; this task's reward scores "
                f"{', '.join(map(repr, sources))} rows only"
            )
        messages = [dict(m) for m in row.prompt]
        continues = messages[-1]["role"] == "assistant"
        ids = tokenizer.apply_chat_template(
            messages,
            chat_template=SPEECH_CHAT_TEMPLATE,
            add_generation_prompt=not continues,
            continue_final_message=continues,
            tokenize=True,
        )
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        prompts.append(Prompt(ids, row.data_source, str(row.reward_model["ground_truth"])))
    if not prompts:
        raise ValueError(f"--data {data}: no rows")
    return prompts


class SyntheticScorer:
    """The synthetic task's reward (`maspo_verl.data.synthetic_tts.compute_score`) on veRL's decoded text."""

    sources = (synthetic_tts.DATA_SOURCE,)

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def score(self, prompts: Sequence[Prompt], responses: Sequence[list[int]]) -> list[float]:
        return [
            synthetic_tts.compute_score(
                prompt.data_source, self.tokenizer.decode(response, skip_special_tokens=True), prompt.ground_truth
            )["score"]
            for prompt, response in zip(prompts, responses, strict=True)
        ]


class SpeechScorer:
    """The speech task's reward in process (`reward_fns.pipeline.SpeechReward`, as veRL's reward workers run it for
    `maspo_verl.runs.speech_run`): a whole batch per call (``score_batch``), the responses' token ids read with the
    task's layout, decoded by the mini codec, heard by Whisper tiny.en, ``score = 1 - tanh(3 CER)``."""

    def __init__(self, reward, language: str = "en", sources: Sequence[str] = ()) -> None:
        self.reward, self.language = reward, language
        self.sources = tuple(sources)

    @classmethod
    def load(cls, codec: str | Path, *, threads: int | None = None, device: str = "cpu") -> SpeechScorer:
        """The reward of `maspo_verl.runs.speech_run` (`reward_overrides`' settings) with the codec checkpoint
        ``codec`` (the mini codec) and the bundled Whisper tiny.en, on ``device`` with ``threads`` CPU threads."""
        from maspo_verl.runs import speech_run
        from maspo_verl.speaking_model.hearing import whisper_tiny_en
        from reward_fns.pipeline import SpeechReward

        reward = SpeechReward.from_spec(
            codec=f"mel_fsq:{codec}",
            asr={speech_run.LANGUAGE: f"faster_whisper:{whisper_tiny_en()}"},
            default_language=speech_run.LANGUAGE,
            reward_config={"error_unit": "char"},
            layout=speech_run.LAYOUT,
            num_threads=threads,
            device=device,
        )
        return cls(reward, speech_run.LANGUAGE, tuple(speech_run.SOURCES.values()))

    def score(self, prompts: Sequence[Prompt], responses: Sequence[list[int]]) -> list[float]:
        requests = [
            {"ground_truth": prompt.ground_truth, "token_ids": list(response), "language": self.language}
            for prompt, response in zip(prompts, responses, strict=True)
        ]
        return [float(result["score"]) for result in self.reward.score_batch(requests)]


class ScoreMeter:
    """Scores responses through a scorer (``score(prompts, responses) -> scores``) ``chunk`` at a time, timing every
    call: its totals give the seconds per scored response, and with the ``planned`` number of responses of the
    measurement, the time left (reported through ``progress`` after each call of a batch larger than ``chunk``)."""

    def __init__(self, scorer, chunk: int = 64, planned: int = 0, progress: Callable[[str], None] | None = None):
        self.scorer, self.chunk, self.planned, self.progress = scorer, chunk, planned, progress
        self.responses, self.seconds = 0, 0.0
        self.start = time.monotonic()

    @property
    def seconds_per_response(self) -> float:
        return self.seconds / self.responses if self.responses else float("nan")

    def eta_seconds(self) -> float:
        """Wall time left if the rest goes as fast as what was done (every part of a repeat grows with the
        responses it scores); NaN before the first call."""
        if not self.responses or not self.planned:
            return float("nan")
        elapsed = time.monotonic() - self.start
        return elapsed * max(self.planned - self.responses, 0) / self.responses

    def status(self) -> str:
        eta = self.eta_seconds()
        left = f", ~{eta / 60:.1f} min left" if math.isfinite(eta) else ""
        planned = f"/{self.planned}" if self.planned else ""
        return f"scored {self.responses}{planned} ({self.seconds_per_response:.3g} s each){left}"

    def __call__(self, prompts: Sequence[Prompt], responses: Sequence[list[int]], what: str = "") -> list[float]:
        scores: list[float] = []
        for start in range(0, len(responses), self.chunk):
            began = time.monotonic()
            scores += self.scorer.score(prompts[start : start + self.chunk], responses[start : start + self.chunk])
            self.seconds += time.monotonic() - began
            self.responses += len(responses[start : start + self.chunk])
            if self.progress is not None and len(responses) > self.chunk:
                done = min(start + self.chunk, len(responses))
                self.progress(f"    {what} {done}/{len(responses)}: {self.status()}")
        return scores


@dataclass
class Batch:
    """Responses to prompts, right-padded ``(N, T)``, prompt-major (the ``G`` responses of a prompt adjacent)."""

    prompt_ids: list[list[int]]
    response_ids: torch.Tensor
    mask: torch.Tensor
    scores: torch.Tensor
    advantages: torch.Tensor
    old_log_prob: torch.Tensor | None = None

    def rows(self, index: slice) -> Batch:
        return Batch(
            self.prompt_ids[index],
            self.response_ids[index],
            self.mask[index],
            self.scores[index],
            self.advantages[index],
            None if self.old_log_prob is None else self.old_log_prob[index],
        )


def grpo_batch(prompts: list[Prompt], responses: list[list[int]], group: int, scorer, device, what: str = "") -> Batch:
    """Score responses with ``scorer`` (a `Scorer`'s ``score``, or a `ScoreMeter`; ``what`` names the batch in its
    progress) and take GRPO advantages with veRL's ``compute_grpo_outcome_advantage``; ``responses[i]`` answers
    ``prompts[i // group]``."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    width = max(1, max(len(r) for r in responses))
    ids = torch.zeros(len(responses), width, dtype=torch.long)
    mask = torch.zeros(len(responses), width)
    rewards = torch.zeros(len(responses), width)
    answered = [prompts[i // group] for i in range(len(responses))]
    scores = scorer(answered, responses, what) if isinstance(scorer, ScoreMeter) else scorer.score(answered, responses)
    for i, (response, score) in enumerate(zip(responses, scores, strict=True)):
        ids[i, : len(response)] = torch.tensor(response, dtype=torch.long)
        mask[i, : len(response)] = 1
        rewards[i, max(len(response), 1) - 1] = score
    index = np.array([i // group for i in range(len(responses))])
    advantages, _ = compute_grpo_outcome_advantage(rewards, mask, index)
    return Batch(
        [prompts[i // group].ids for i in range(len(responses))],
        ids.to(device),
        mask.to(device),
        torch.tensor(scores),
        advantages.to(device),
    )


def response_hidden(model, batch: Batch, pad_id: int) -> torch.Tensor:
    """The final hidden states at the positions that predict response tokens, ``(N, T, d)``, as veRL's actor runs
    the model: prompts left-padded, responses right-padded, positions from the attention mask."""
    rows, width = batch.response_ids.shape
    prompt_width = max(len(p) for p in batch.prompt_ids)
    device = batch.response_ids.device
    ids = torch.full((rows, prompt_width + width), pad_id, dtype=torch.long, device=device)
    attention = torch.zeros_like(ids)
    for i, prompt in enumerate(batch.prompt_ids):
        ids[i, prompt_width - len(prompt) : prompt_width] = torch.tensor(prompt, device=device)
        attention[i, prompt_width - len(prompt) : prompt_width] = 1
    ids[:, prompt_width:] = torch.where(batch.mask.bool(), batch.response_ids, pad_id)
    attention[:, prompt_width:] = batch.mask.long()
    positions = (attention.cumsum(dim=1) - 1).clamp(min=0)
    hidden = model.get_decoder()(input_ids=ids, attention_mask=attention, position_ids=positions).last_hidden_state
    return hidden[:, prompt_width - 1 : prompt_width + width - 1]


def response_log_probs(model, batch: Batch, temperature: float, pad_id: int) -> torch.Tensor:
    """``log softmax(z_t / T)[y_t]`` at every response position, ``(N, T)`` (0 on padding), logits at the response
    positions only (`response_hidden` through the LM head)."""
    logits = model.get_output_embeddings()(response_hidden(model, batch, pad_id))
    log_probs = torch.log_softmax(logits / temperature, dim=-1)
    return log_probs.gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1) * batch.mask


def policy_loss(estimator: Estimator, config, batch: Batch, log_prob: torch.Tensor):
    """veRL's registered policy loss of ``estimator`` on ``batch`` (token-mean), response ids visible to MASPO."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    import maspo_verl.loss  # noqa: F401 - registers loss_mode=maspo
    from maspo_verl.loss_inputs import provide_loss_inputs

    with provide_loss_inputs(response_ids=batch.response_ids):
        return get_policy_loss_fn(estimator.loss_mode)(
            old_log_prob=batch.old_log_prob.to(log_prob.dtype),
            log_prob=log_prob,
            advantages=batch.advantages.to(log_prob.dtype),
            response_mask=batch.mask,
            loss_agg_mode="token-mean",
            config=config,
            rollout_is_weights=None,
        )


def log_prob_gradient(loss_fn: Callable[[torch.Tensor], torch.Tensor], log_prob: torch.Tensor) -> torch.Tensor:
    """d loss / d log_prob, ``(N, T)``: what the backward pass carries into the model."""
    leaf = log_prob.detach().clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(loss_fn(leaf), leaf)
    return grad


def estimator_upstreams(estimators: Sequence[Estimator], configs: dict, batch: Batch, log_prob: torch.Tensor):
    """Per estimator, clip on then off: its key ``(name, clipped)``, d loss / d log pi_theta ``(N, T)`` and its clip
    fraction (response tokens whose gradient the clip zeroes where the unclipped loss's is not zero)."""
    keys, upstream, clipfracs = [], [], []
    for estimator in estimators:
        grads = {
            clipped: log_prob_gradient(
                lambda lp, e=estimator, c=configs[(estimator.name, clipped)]: policy_loss(e, c, batch, lp)[0], log_prob
            )
            for clipped in (True, False)
        }
        for clipped in (True, False):
            zeroed = (grads[clipped] == 0) & (grads[False] != 0) & batch.mask.bool()
            keys.append((estimator.name, clipped))
            upstream.append(grads[clipped])
            clipfracs.append(float(zeroed.sum() / batch.mask.sum()))
    return keys, upstream, clipfracs


def gradient_parameters(model, vocabulary: bool) -> list[torch.nn.Parameter]:
    """The parameters theta of the measured gradient: every trainable one, or (``vocabulary=False``) all but the
    LM head's and the input embedding's (one tied matrix in Llasa-shaped models)."""
    vocab = {id(model.get_output_embeddings().weight), id(model.get_input_embeddings().weight)}
    return [p for p in model.parameters() if p.requires_grad and (vocabulary or id(p) not in vocab)]


def parameter_gradients(
    model,
    batch: Batch,
    upstream: list[torch.Tensor],
    temperature: float,
    pad_id: int,
    micro_batch: int,
    vocabulary: bool = False,
) -> list[torch.Tensor]:
    """For each ``(N, T)`` upstream gradient ``g`` (d loss / d log pi_theta), the parameter gradient ``J^T g``
    flattened over `gradient_parameters`: one forward per micro-batch, one backward per ``g``.

    Without the vocabulary matrix the backward pass starts at the final hidden states ``h_t``: with ``W`` the LM
    head and ``p_t = softmax(W h_t / T)``, ``d log pi(y_t) / d h_t = u_t = (W[y_t] - p_t W) / T`` is the same for
    every ``g``, so ``J^T g`` is the gradient of ``sum_t g_t <sg[u_t], h_t>``: the vocabulary-wide product is
    computed once per micro-batch instead of once per ``g`` (exact, not an approximation)."""
    params = gradient_parameters(model, vocabulary)
    totals = [torch.zeros(sum(p.numel() for p in params), dtype=torch.float64) for _ in upstream]
    rows = batch.response_ids.shape[0]
    for start in range(0, rows, micro_batch):
        part = batch.rows(slice(start, start + micro_batch))
        if vocabulary:
            outputs = response_log_probs(model, part, temperature, pad_id)
            directions = None
        else:
            outputs = response_hidden(model, part, pad_id)
            with torch.no_grad():
                head = model.get_output_embeddings().weight
                probs = torch.softmax(outputs @ head.T / temperature, dim=-1)
                directions = (head[part.response_ids] - probs @ head) / temperature
        for i, g in enumerate(upstream):
            g_part = g[start : start + micro_batch].to(outputs.dtype)
            target = outputs if directions is None else (outputs * directions * g_part.unsqueeze(-1)).sum()
            grads = torch.autograd.grad(
                target,
                params,
                grad_outputs=g_part if directions is None else None,
                retain_graph=i < len(upstream) - 1,
                allow_unused=True,
            )
            totals[i] += torch.cat(
                [
                    (gr if gr is not None else torch.zeros_like(p)).reshape(-1).to(torch.float64).cpu()
                    for gr, p in zip(grads, params)
                ]
            )
    return totals


def onpolicy_upstream(batch: Batch) -> torch.Tensor:
    """d/d log pi of the on-policy surrogate ``-sum_t A_t log pi(y_t) / N_tokens`` (token-mean, every ratio 1)."""
    return -batch.advantages * batch.mask / batch.mask.sum().clamp(min=1)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    denominator = float(a.norm() * b.norm())
    return float(a @ b) / denominator if denominator > 0 else float("nan")


def noise_ceiling(half_split_cosine: float) -> float:
    """Spearman-Brown: the cosine of a reference made of two halves (cosine ``c`` to each other) with the truth,
    ``sqrt(2c / (1 + c))``, when each half is the truth plus independent noise; NaN for ``c <= 0``."""
    c = half_split_cosine
    return math.sqrt(2 * c / (1 + c)) if c > 0 else float("nan")


def grpo_update(model, optimizer, batch: Batch, config, temperature: float, pad_id: int, clip_grad: float) -> float:
    """One optimizer update of GRPO (veRL's ``vanilla`` loss) on a mini-batch; returns its ``ppo_kl``."""
    estimator = grpo_estimator()
    log_prob = response_log_probs(model, batch, temperature, pad_id)
    loss, metrics = policy_loss(estimator, config, batch, log_prob)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad)
    optimizer.step()
    return float(metrics["actor/ppo_kl"])


def _pad_cat(tensors: list[torch.Tensor], value=0) -> torch.Tensor:
    width = max(t.shape[1] for t in tensors)
    return torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value) for t in tensors])


def planned_responses(settings: FidelitySettings) -> int:
    """Responses the measurement scores: per repeat, pi_old's batch and, at every k, the reference's fresh ones."""
    per_repeat = settings.batch * settings.n * (1 + len(set(settings.updates)) * settings.reference_groups)
    return settings.repeats * per_repeat


def measure(
    model,
    tokenizer,
    prompts: list[Prompt],
    scorer,
    settings: FidelitySettings,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the measurement (module docstring) on ``model`` (pi_old, left unchanged; ``tokenizer`` its own) and
    ``prompts``, scored by
    ``scorer`` (`SyntheticScorer`, `SpeechScorer` or any object with their ``score``).

    Returns ``rows`` (one per repeat, k, estimator and clip: cosine, relative norm, clip fraction), ``references``
    (per repeat and k: half-split cosine, ppo_kl), ``log_ratios`` (per repeat and k > 0: `log_ratio_statistics`),
    ``thresholds`` (per segmenter and target length), ``batches`` (scores of pi_old's
    batches) and ``scoring`` (responses scored, seconds, seconds per response)."""
    from verl.workers.config import FSDPOptimizerConfig

    from maspo_verl.cpu.generation import Sampler
    from maspo_verl.runs.tasks import task_run

    settings.validate()
    estimators = estimators_of(settings.estimators, settings.task)
    meter = ScoreMeter(scorer, settings.score_batch, planned_responses(settings), progress)
    configs = {(e.name, clipped): e.actor_config(clipped) for e in estimators for clipped in (True, False)}
    grpo = grpo_estimator()
    grpo_config = grpo.actor_config(True)
    optim = FSDPOptimizerConfig(lr=settings.lr)
    sampler = Sampler(model, tokenizer, settings.seed, settings.temperature, settings.response_length)
    pad_id, temperature, group = sampler.pad_id, settings.temperature, settings.n
    rng = random.Random(settings.seed)
    torch.manual_seed(settings.seed)
    updates = sorted(set(settings.updates))
    rows, references, ratio_stats, batch_scores = [], [], [], []
    old_batches = []
    version = 0
    start = time.monotonic()
    model.eval()
    for repeat in range(settings.repeats):
        chosen = (
            rng.sample(prompts, settings.batch)
            if len(prompts) >= settings.batch
            else rng.choices(prompts, k=settings.batch)
        )
        version += 1
        responses = sampler.sample(model, [p.ids for p in chosen for _ in range(group)], version)
        batch = grpo_batch(chosen, responses, group, meter, settings.device, "pi_old's batch")
        with torch.no_grad():
            batch.old_log_prob = response_log_probs(model, batch, temperature, pad_id)
        old_batches.append(batch)
        batch_scores.append(
            {"repeat": repeat, "score": float(batch.scores.mean()), "length": float(batch.mask.sum(dim=1).mean())}
        )
        policy = copy.deepcopy(model)
        optimizer = torch.optim.AdamW(
            policy.parameters(), lr=optim.lr, betas=tuple(optim.betas), weight_decay=optim.weight_decay
        )
        per_mini = batch.response_ids.shape[0] // settings.mini_batches
        done = 0
        for k in updates:
            while done < k:
                m = done % settings.mini_batches
                grpo_update(
                    policy,
                    optimizer,
                    batch.rows(slice(m * per_mini, (m + 1) * per_mini)),
                    grpo_config,
                    temperature,
                    pad_id,
                    optim.clip_grad,
                )
                done += 1
            with torch.no_grad():
                log_prob = response_log_probs(policy, batch, temperature, pad_id)
            _, kl_metrics = policy_loss(grpo, grpo_config, batch, log_prob)
            ppo_kl = float(kl_metrics["actor/ppo_kl"])
            if k > 0:
                ratio_stats.append(log_ratio_statistics(repeat, k, log_prob, batch, settings))
            version += 1  # the reference's streams, drawn or not: later batches are the same either way
            if not settings.reference_groups:
                references.append(
                    {"repeat": repeat, "k": k, "half_split_cosine": math.nan, "ceiling": math.nan, "ppo_kl": ppo_kl}
                )
                alone = "(no reference: log-ratios only)"
                progress(_step_line(repeat, settings.repeats, k, start, ppo_kl, alone, meter))
                continue
            # the reference: fresh samples from pi_theta for the same prompts, in two halves
            halves = settings.reference_groups // 2
            fresh = sampler.sample(
                policy, [p.ids for p in chosen for _ in range(group * settings.reference_groups)], version
            )
            per_prompt, per_half = group * settings.reference_groups, group * halves
            half_batches = [
                _grouped_batch(
                    chosen,
                    [fresh[i * per_prompt + h * per_half + j] for i in range(len(chosen)) for j in range(per_half)],
                    per_half,
                    group,
                    meter,
                    settings.device,
                    f"reference half {h + 1}",
                )
                for h in range(2)
            ]
            half_grads = [
                parameter_gradients(
                    policy,
                    hb,
                    [onpolicy_upstream(hb)],
                    temperature,
                    pad_id,
                    settings.micro_batch,
                    settings.vocabulary_gradient,
                )[0]
                for hb in half_batches
            ]
            reference = (half_grads[0] + half_grads[1]) / 2
            split = cosine(*half_grads)
            references.append(
                {
                    "repeat": repeat,
                    "k": k,
                    "half_split_cosine": split,
                    "ceiling": noise_ceiling(split),
                    "ppo_kl": ppo_kl,
                }
            )
            keys, upstream, clipfracs = estimator_upstreams(estimators, configs, batch, log_prob)
            grads = parameter_gradients(
                policy, batch, upstream, temperature, pad_id, settings.micro_batch, settings.vocabulary_gradient
            )
            ref_norm = float(reference.norm())
            for (name, clipped), grad, clipfrac in zip(keys, grads, clipfracs):
                rows.append(
                    {
                        "repeat": repeat,
                        "k": k,
                        "estimator": name,
                        "clip": "on" if clipped else "off",
                        "cosine": cosine(grad, reference),
                        "relative_norm": float(grad.norm()) / ref_norm if ref_norm > 0 else float("nan"),
                        "clip_fraction": clipfrac,
                    }
                )
            shown = {name: r["cosine"] for r in rows[-len(keys) :] if r["clip"] == "on" for name in [r["estimator"]]}
            cosines = f"half-split cos {split:.3f}  cos: " + " ".join(f"{n} {c:.3f}" for n, c in shown.items())
            progress(_step_line(repeat, settings.repeats, k, start, ppo_kl, cosines, meter))
        del policy, optimizer
    thresholds = segmenter_thresholds(old_batches, settings.target_lengths, task_run(settings.task).LAYOUT)
    return {
        "rows": rows,
        "references": references,
        "log_ratios": ratio_stats,
        "thresholds": thresholds,
        "batches": batch_scores,
        "scoring": {
            "responses": meter.responses,
            "seconds": meter.seconds,
            "seconds_per_response": meter.seconds_per_response,
        },
    }


def _step_line(repeat: int, repeats: int, k: int, start: float, ppo_kl: float, what: str, meter: ScoreMeter) -> str:
    """The progress line of one repeat and k: time since ``start``, ppo_kl, ``what`` was measured, the scoring."""
    return (
        f"  repeat {repeat + 1}/{repeats} k={k:<2d} [{time.monotonic() - start:5.0f}s] "
        f"ppo_kl {ppo_kl:.2e}  {what}  [{meter.status()}]"
    )


def log_ratio_statistics(repeat: int, k: int, log_prob: torch.Tensor, batch: Batch, settings) -> dict[str, Any]:
    """The structure of ``d_t = log pi_theta - log pi_old`` on the stale batch (`maspo_verl.analysis.log_ratios`):
    autocorrelation by lag and window std by length, of ``d`` and of ``d`` less each response's mean
    (``within_``), and the share of ``d``'s variance the responses' means hold."""
    d = (log_prob - batch.old_log_prob) * batch.mask
    within = log_ratios.within_response(d, batch.mask)
    stats: dict[str, Any] = {"repeat": repeat, "k": k}
    for prefix, values in (("", d), ("within_", within)):
        stds = {L: log_ratios.window_log_ratio_std(values, batch.mask, L) for L in settings.window_lengths}
        stats[f"{prefix}autocorrelation"] = log_ratios.lag_autocorrelation(
            values, batch.mask, settings.max_lag
        ).tolist()
        stats[f"{prefix}window_std"] = {str(L): s for L, (s, _) in stds.items()}
        if not prefix:  # the same windows either way
            stats["window_count"] = {str(L): c for L, (_, c) in stds.items()}
    stats["shared_fraction"] = log_ratios.shared_fraction(d, batch.mask)
    return stats


def _grouped_batch(chosen, picked, per_prompt, group, scorer, device, what: str = "") -> Batch:
    """``per_prompt`` responses to each of ``chosen`` (prompt-major) as GRPO groups of ``group``."""
    repeated = [chosen[i // per_prompt] for i in range(0, len(picked), group)]
    return grpo_batch(repeated, picked, group, scorer, device, what)


def segmenter_thresholds(
    batches: list[Batch], targets: Sequence[int], layout: str = "llasa-1b"
) -> list[dict[str, Any]]:
    """Per threshold segmenter and target mean segment length: the threshold that comes nearest on pi_old's
    batches (`log_ratios.threshold_for_length`, the codes read with ``layout``) and the mean length it gives."""
    old = _pad_cat([b.old_log_prob for b in batches])
    mask = _pad_cat([b.mask for b in batches])
    ids = _pad_cat([b.response_ids for b in batches])
    codec = {"layout": layout}
    results = []
    for segmenter, candidates in threshold_candidates(layout).items():
        for target in targets:
            threshold, length = log_ratios.threshold_for_length(
                segmenter, candidates, target, old, mask, ids, codec=codec
            )
            results.append(
                {"segmenter": segmenter, "target_length": target, "threshold": threshold, "mean_length": length}
            )
    return results
