"""Gradient fidelity: how well each policy loss's gradient follows the on-policy gradient when the data is stale.

A task (`maspo_lab.runs.tasks`) supplies the policy (pi_old), its prompts and its scorer
(`maspo_lab.analysis.fidelity_scoring`): the synthetic task's reward on decoded text, or the speech task's real
reward, the mini codec and Whisper tiny.en scoring whole batches; its methods (`builtin_estimators`) run as the task
runs them (mini-llasa's layout on speech). For one repeat:

1. sample a batch from pi_old as the rollout samples (``G`` responses per prompt at the task's temperature, the
   ``hf`` rollout's own generation, `maspo_lab.sampler.Sampler`), score it, take GRPO advantages with veRL's
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
`maspo_lab.analysis.log_ratios`. At k = 0 every ratio is 1 and every estimator is the on-policy surrogate on the
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
from typing import Any, Literal

import torch

from maspo_lab.analysis import log_ratios
from maspo_lab.analysis.fidelity_scoring import Prompt, ScoreMeter
from maspo_lab.analysis.policy_gradients import (
    Batch,
    cosine,
    estimator_upstreams,
    grouped_batch,
    grpo_batch,
    grpo_update,
    noise_ceiling,
    onpolicy_upstream,
    pad_cat,
    parameter_gradients,
    policy_loss,
    response_log_probs,
)
from maspo_lab.runs.synthetic_run import TASK_DEFAULTS

DEFAULT_UPDATES = (0, 1, 4, 16)
DEFAULT_WINDOWS = (2, 4, 8, 16)
STD_WINDOW_LENGTHS = (1, 2, 4, 8, 16)
MAX_LAG = 16
"""The log-ratio statistics' window lengths and lags on the synthetic task (responses of at most 24 tokens)."""
DEFAULT_TARGET_LENGTHS = (4, 8, 16)
TASK_SETTINGS: dict[str, dict[str, Any]] = {
    "speech": {
        "n": 4,
        "mini_batches": 4,
        "lr": 2e-5,
        "response_length": 4 * 50 + 1,
        "window_lengths": (1, 2, 4, 8, 16, 32, 64),
        "max_lag": 50,
    },
}
"""What the measurement sets apart from a task's run (`FidelitySettings.for_task`). Speech: groups of 4 in 4
mini-batches at lr 2e-5, the shape docs/fidelity.md measured (the task's runs now use groups of 16, a quarter of
the prompts per batch of responses); responses of 1-4 s are 50-200 codes (50 per second), so the budget covers 4 s
and the end tag (201 tokens; the trainer's 251 stops a runaway at 5 s), windows up to 64 codes and lags up to one
second."""


TASK_TEXTS = {"speech": 16}
"""The training sentences the measurement's prompts come from, where they differ from the task's runs (`--texts`):
speech, the first 16, as docs/fidelity.md measured (the task's runs draw new sentences from all 5,204)."""


def threshold_candidates(layout: str = "llasa-1b") -> dict[str, tuple[float, ...]]:
    """Thresholds searched for a target mean segment length on a speech-token layout's codes: the FSQ L1 digit
    distance (0 up to the lattice's largest: Llasa-1B's 8 digits in 0..3, 24; mini-llasa's 5, 15), the raw codec-id
    jump (powers of 2 up to the codebook: 65,536 or 1,024), the z-score of the old log-prob drop."""
    from maspo_base.speech_tokens.layouts import get_layout

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
        """The policy loss a method of `maspo_lab.methods` selects; `MethodError` if it sets more than the actor's
        loss (a credit method's advantage is not what this measurement compares)."""
        from maspo_lab.methods import MethodError

        settings = method.settings
        other = sorted(settings.sections - {"actor_rollout_ref"})
        if other or settings.loss_mode is None:
            raise MethodError(
                f"--estimators {method.name!r}: a method that selects a policy loss and sets nothing else "
                f"(it sets {other or 'no actor_rollout_ref.actor.policy_loss.loss_mode'})"
            )
        block = dict(settings.maspo_block)
        segmenter = block.pop("segmenter", None)
        return cls(method.name, settings.loss_mode, segmenter, dict(settings.clip), block)

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
    """The methods of `maspo_lab.methods` as ``task`` (`maspo_lab.runs.tasks`) runs them
    (`maspo_lab.runs.task.Task.method`): ``grpo`` (token ratio), ``maspo-fixed<W>`` per window (``maspo-fixed4``
    with the window set), `CONTENT_METHODS`, ``gspo`` (sequence ratio)."""
    return dict(_builtin_estimators(tuple(windows), task))


@functools.cache
def _builtin_estimators(windows: tuple[int, ...], task: str) -> dict[str, Estimator]:
    from maspo_lab.methods import MASPO_KEY, refine
    from maspo_lab.runs.tasks import task_named

    on_task = task_named(task)
    fixed = on_task.method("maspo-fixed4")
    methods = [on_task.method("grpo")]
    methods += [refine(fixed, [f"{MASPO_KEY}.segmenter.window={w}"], name=f"maspo-fixed{w}") for w in windows]
    methods += [on_task.method(name) for name in (*CONTENT_METHODS, "gspo")]
    return {m.name: Estimator.from_method(m) for m in methods}


def estimators_of(names: Sequence[str], task: str = "synthetic") -> list[Estimator]:
    """The `builtin_estimators` named, or any other method of `maspo_lab.methods` that selects a policy loss (as
    ``task`` runs it); ``ValueError`` naming ``--estimators`` otherwise."""
    from maspo_lab.methods import BUILTIN_METHODS, MethodError
    from maspo_lab.runs.tasks import task_named

    known = builtin_estimators(task=task)
    unknown = [name for name in names if name not in known and name not in BUILTIN_METHODS]
    if unknown or not names:
        valid = ", ".join(dict.fromkeys([*known, *BUILTIN_METHODS]))
        raise ValueError(f"--estimators: unknown {unknown or 'empty list'}; valid: {valid}")
    try:
        return [
            known[name] if name in known else Estimator.from_method(task_named(task).method(name)) for name in names
        ]
    except MethodError as error:
        raise ValueError(str(error)) from None


def grpo_estimator() -> Estimator:
    """GRPO, the loss whose updates make the batch stale."""
    from maspo_lab.methods import BUILTIN_METHODS

    return Estimator.from_method(BUILTIN_METHODS["grpo"])


@dataclass
class FidelitySettings:
    """What one measurement runs; its fields but ``task`` and ``extra`` are ``maspo-verl fidelity``'s flags
    (`maspo_base.typed_settings.add_arguments`), and `validate` rejects bad values naming the flag. ``task`` (a name of
    `maspo_lab.runs.tasks`) runs the methods as that task does; the batch shape, learning rate, temperature and
    response budget default to the synthetic task's run (`TASK_DEFAULTS`, read from ``trainer_config/scale/tiny.yaml``;
    `for_task` takes another task's)."""

    task: str = "synthetic"
    updates: tuple[int, ...] = field(default=DEFAULT_UPDATES, metadata={"help": "k values, e.g. 0,1,4"})
    estimators: tuple[str, ...] = field(
        default=tuple(builtin_estimators()),
        metadata={
            "help": "comma-separated methods (maspo_verl/trainer_config/method/, as the task runs them; "
            "maspo-fixed<W> for the windows of the default list)"
        },
    )
    repeats: int = field(default=3, metadata={"help": "independent stale batches"})
    batch: int = field(default=TASK_DEFAULTS["batch"], metadata={"help": "prompts per batch"})
    n: int = field(default=TASK_DEFAULTS["n"], metadata={"help": "responses per prompt (GRPO group)"})
    mini_batches: int = field(default=TASK_DEFAULTS["mini_batches"], metadata={"help": "GRPO updates cycle over these"})
    lr: float = field(default=TASK_DEFAULTS["lr"], metadata={"help": "learning rate of the GRPO updates"})
    temperature: float = field(default=TASK_DEFAULTS["temperature"], metadata={"help": "sampling temperature"})
    response_length: int = field(
        default=TASK_DEFAULTS["response_length"], metadata={"help": "response budget in tokens"}
    )
    reference_groups: int = field(
        default=2,
        metadata={
            "help": "fresh groups of n per prompt for the reference at every k, in two halves; its size, and with "
            "it the half-split cosine, grows with it. 0: no reference and no estimator gradients, the log-ratios' "
            "structure only (pi_old's batches are all that is scored)"
        },
    )
    micro_batch: int = field(default=16, metadata={"help": "responses per forward/backward pass"})
    score_batch: int = field(
        default=64, metadata={"help": "responses per call of the reward (each call timed and reported)"}
    )
    vocabulary_gradient: bool = field(
        default=False,
        metadata={
            "help": "measure the gradient over every parameter, the (tied) vocabulary matrix too (default: all but "
            "it; exact either way, far slower: docs/fidelity.md)"
        },
    )
    target_lengths: tuple[int, ...] = field(
        default=DEFAULT_TARGET_LENGTHS, metadata={"flag": "--target-length", "help": "segment lengths"}
    )
    window_lengths: tuple[int, ...] = field(
        default=STD_WINDOW_LENGTHS,
        metadata={"help": "window lengths L of the log-ratio's window std (maspo_lab.analysis.log_ratios)"},
    )
    max_lag: int = field(default=MAX_LAG, metadata={"help": "lags 1..max_lag of the log-ratio's autocorrelation"})
    device: str = field(default="cpu", metadata={"help": "device of the policy (cpu, cuda, ...)"})
    dtype: Literal["float32", "float64"] = "float32"
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def for_task(cls, task: str, **changes) -> FidelitySettings:
        """The settings with ``task``'s run shape (`maspo_lab.runs.tasks`: batch, n, mini-batches, lr,
        temperature, response budget), then the measurement's own for the task (`TASK_SETTINGS`), then
        ``changes``."""
        from maspo_lab.runs.tasks import task_named

        d = task_named(task).defaults
        shape = {key: d[key] for key in ("batch", "n", "mini_batches", "lr", "temperature", "response_length")}
        return cls(task=task, **{**shape, **TASK_SETTINGS.get(task, {}), **changes})

    def validate(self) -> None:
        from maspo_lab.runs.tasks import TASK_NAMES

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
    ``prompts``, scored by ``scorer`` (`maspo_lab.analysis.fidelity_scoring`'s scorers or any object with their
    ``score``).

    Returns ``rows`` (one per repeat, k, estimator and clip: cosine, relative norm, clip fraction), ``references``
    (per repeat and k: half-split cosine, ppo_kl), ``log_ratios`` (per repeat and k > 0: `log_ratio_statistics`),
    ``thresholds`` (per segmenter and target length), ``batches`` (scores of pi_old's
    batches) and ``scoring`` (responses scored, seconds, seconds per response)."""
    from maspo_lab.runs.tasks import task_named
    from maspo_lab.sampler import Sampler

    settings.validate()
    run = _Measurement(
        settings,
        Sampler(model, tokenizer, settings.seed, settings.temperature, settings.response_length),
        ScoreMeter(scorer, settings.score_batch, planned_responses(settings), progress),
        estimators_of(settings.estimators, settings.task),
        progress,
    )
    rng = random.Random(settings.seed)
    torch.manual_seed(settings.seed)
    model.eval()
    old_batches = []
    for repeat in range(settings.repeats):
        chosen = (
            rng.sample(prompts, settings.batch)
            if len(prompts) >= settings.batch
            else rng.choices(prompts, k=settings.batch)
        )
        old_batches.append(run.repeat(repeat, chosen))
    return {
        "rows": run.rows,
        "references": run.references,
        "log_ratios": run.ratio_stats,
        "thresholds": segmenter_thresholds(
            old_batches, settings.target_lengths, task_named(settings.task).model_layout()
        ),
        "batches": run.batch_scores,
        "scoring": {
            "responses": run.meter.responses,
            "seconds": run.meter.seconds,
            "seconds_per_response": run.meter.seconds_per_response,
        },
    }


class _Measurement:
    """One measurement's state across its repeats: the sampler and its streams' version, the estimators' configs,
    and what has been measured so far (`measure` returns it)."""

    def __init__(self, settings: FidelitySettings, sampler, meter: ScoreMeter, estimators, progress) -> None:
        from verl.workers.config import FSDPOptimizerConfig

        self.settings, self.sampler, self.meter, self.estimators, self.progress = (
            settings,
            sampler,
            meter,
            estimators,
            progress,
        )
        self.configs = {(e.name, clipped): e.actor_config(clipped) for e in estimators for clipped in (True, False)}
        self.grpo_config = grpo_estimator().actor_config(True)
        self.optim = FSDPOptimizerConfig(lr=settings.lr)
        self.version = 0
        self.start = time.monotonic()
        self.rows, self.references, self.ratio_stats, self.batch_scores = [], [], [], []

    def repeat(self, repeat: int, chosen: list[Prompt]) -> Batch:
        """pi_old's batch for ``chosen``, then at each k: the stale policy, its reference and the estimators'
        gradients against it (module docstring, steps 1-4). Returns pi_old's batch."""
        settings, temperature, pad_id = self.settings, self.settings.temperature, self.sampler.pad_id
        model = self.sampler.model  # pi_old
        self.version += 1
        responses = self.sampler.sample([p.ids for p in chosen for _ in range(settings.n)], self.version)
        batch = grpo_batch(chosen, responses, settings.n, self.meter, settings.device, "pi_old's batch")
        with torch.no_grad():
            batch.old_log_prob = response_log_probs(model, batch, temperature, pad_id)
        self.batch_scores.append(
            {"repeat": repeat, "score": float(batch.scores.mean()), "length": float(batch.mask.sum(dim=1).mean())}
        )
        policy = copy.deepcopy(model)
        optimizer = torch.optim.AdamW(
            policy.parameters(), lr=self.optim.lr, betas=tuple(self.optim.betas), weight_decay=self.optim.weight_decay
        )
        done = 0
        for k in sorted(set(settings.updates)):
            done = self.make_stale(policy, optimizer, batch, done, k)
            with torch.no_grad():
                log_prob = response_log_probs(policy, batch, temperature, pad_id)
            ppo_kl = float(policy_loss(self.grpo_config, batch, log_prob)[1]["actor/ppo_kl"])
            if k > 0:
                self.ratio_stats.append(log_ratio_statistics(repeat, k, log_prob, batch, settings))
            self.version += 1  # the reference's streams, drawn or not: later batches are the same either way
            if not settings.reference_groups:
                self.references.append(
                    {"repeat": repeat, "k": k, "half_split_cosine": math.nan, "ceiling": math.nan, "ppo_kl": ppo_kl}
                )
                self.progress(self.step_line(repeat, k, ppo_kl, "(no reference: log-ratios only)"))
                continue
            reference, split = self.reference(policy, chosen)
            self.references.append(
                {
                    "repeat": repeat,
                    "k": k,
                    "half_split_cosine": split,
                    "ceiling": noise_ceiling(split),
                    "ppo_kl": ppo_kl,
                }
            )
            shown = self.compare(policy, batch, log_prob, reference, repeat, k)
            cosines = f"half-split cos {split:.3f}  cos: " + " ".join(f"{n} {c:.3f}" for n, c in shown.items())
            self.progress(self.step_line(repeat, k, ppo_kl, cosines))
        return batch

    def make_stale(self, policy, optimizer, batch: Batch, done: int, k: int) -> int:
        """GRPO updates on the batch's mini-batches in turn until ``k`` have been made (``done`` so far)."""
        settings = self.settings
        per_mini = batch.response_ids.shape[0] // settings.mini_batches
        while done < k:
            m = done % settings.mini_batches
            grpo_update(
                policy,
                optimizer,
                batch.rows(slice(m * per_mini, (m + 1) * per_mini)),
                self.grpo_config,
                settings.temperature,
                self.sampler.pad_id,
                self.optim.clip_grad,
            )
            done += 1
        return done

    def reference(self, policy, chosen: list[Prompt]) -> tuple[torch.Tensor, float]:
        """The on-policy gradient at pi_theta from fresh samples for the same prompts, in two halves: their mean
        and their cosine (the half-split cosine)."""
        settings, group = self.settings, self.settings.n
        per_prompt, per_half = group * settings.reference_groups, group * (settings.reference_groups // 2)
        fresh = self.sampler.with_model(policy).sample([p.ids for p in chosen for _ in range(per_prompt)], self.version)
        half_grads = []
        for h in range(2):
            picked = [fresh[i * per_prompt + h * per_half + j] for i in range(len(chosen)) for j in range(per_half)]
            half = grouped_batch(
                chosen, picked, per_half, group, self.meter, settings.device, f"reference half {h + 1}"
            )
            half_grads.append(self.gradients(policy, half, [onpolicy_upstream(half)])[0])
        return (half_grads[0] + half_grads[1]) / 2, cosine(*half_grads)

    def compare(self, policy, batch: Batch, log_prob: torch.Tensor, reference: torch.Tensor, repeat: int, k: int):
        """Each estimator's gradient on the stale batch, clip on and off, against ``reference`` (rows); returns the
        clipped cosines by estimator, for the progress line."""
        keys, upstream, clipfracs = estimator_upstreams(self.estimators, self.configs, batch, log_prob)
        ref_norm = float(reference.norm())
        shown = {}
        for (name, clipped), grad, clipfrac in zip(keys, self.gradients(policy, batch, upstream), clipfracs):
            row = {
                "repeat": repeat,
                "k": k,
                "estimator": name,
                "clip": "on" if clipped else "off",
                "cosine": cosine(grad, reference),
                "relative_norm": float(grad.norm()) / ref_norm if ref_norm > 0 else float("nan"),
                "clip_fraction": clipfrac,
            }
            self.rows.append(row)
            if clipped:
                shown[name] = row["cosine"]
        return shown

    def gradients(self, policy, batch: Batch, upstream: list[torch.Tensor]) -> list[torch.Tensor]:
        s = self.settings
        return parameter_gradients(
            policy, batch, upstream, s.temperature, self.sampler.pad_id, s.micro_batch, s.vocabulary_gradient
        )

    def step_line(self, repeat: int, k: int, ppo_kl: float, what: str) -> str:
        return _step_line(repeat, self.settings.repeats, k, self.start, ppo_kl, what, self.meter)


def _step_line(repeat: int, repeats: int, k: int, start: float, ppo_kl: float, what: str, meter: ScoreMeter) -> str:
    """The progress line of one repeat and k: time since ``start``, ppo_kl, ``what`` was measured, the scoring."""
    return (
        f"  repeat {repeat + 1}/{repeats} k={k:<2d} [{time.monotonic() - start:5.0f}s] "
        f"ppo_kl {ppo_kl:.2e}  {what}  [{meter.status()}]"
    )


def log_ratio_statistics(repeat: int, k: int, log_prob: torch.Tensor, batch: Batch, settings) -> dict[str, Any]:
    """The structure of ``d_t = log pi_theta - log pi_old`` on the stale batch (`maspo_lab.analysis.log_ratios`):
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


def segmenter_thresholds(
    batches: list[Batch], targets: Sequence[int], layout: str = "llasa-1b"
) -> list[dict[str, Any]]:
    """Per threshold segmenter and target mean segment length: the threshold that comes nearest on pi_old's
    batches (`log_ratios.threshold_for_length`, the codes read with ``layout``) and the mean length it gives."""
    old = pad_cat([b.old_log_prob for b in batches])
    mask = pad_cat([b.mask for b in batches])
    ids = pad_cat([b.response_ids for b in batches])
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
