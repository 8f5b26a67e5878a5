"""The shape of a GRPO run of veRL's trainer on CPU, shared by every task (`maspo_lab.runs.tasks`).

A task's sizes have one home, its scale file (``maspo_verl/trainer_config/scale/<name>.yaml``, which the recipes
select with ``scale=<name>`` too); `scale_defaults` reads a run's shape from it, and `grpo_overrides` writes the
veRL overrides of a run of that shape: the data files, the model, ``batch`` prompts x ``n`` responses per step in
``mini_batches`` actor updates, and veRL's validation before the first step and after the last (``eval_samples``
responses per text, sampled as the rollout samples) when ``eval_samples`` > 0. The task adds its reward; the method's
overrides go after all of these. The CPU settings come from `maspo_lab.runs.cpu_overrides` (added by
`maspo_lab.runs.launch`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from importlib.resources import files
from pathlib import Path


def read_scale(name: str) -> dict:
    """``maspo_verl/trainer_config/scale/<name>.yaml``."""
    import yaml

    return yaml.safe_load((files("maspo_verl.trainer_config") / "scale" / f"{name}.yaml").read_text())


def recipe_overrides(scale: str, train: Path, validation: Path, model: Path) -> list[str]:
    """What ``recipes/llasa_1b/run.sh`` adds for a CPU task (``MODEL=tiny`` or ``mini``): the task's scale and its data
    files and model, after the recipe's own config."""
    return [
        f"scale={scale}",
        f"data.train_files={train}",
        f"data.val_files={validation}",
        f"actor_rollout_ref.model.path={model}",
    ]


def scale_defaults(scale: dict) -> dict:
    """A run's shape from a scale: steps, prompts per step, responses per prompt, actor updates per step, learning
    rate, response budget, sampling temperature, the KL term's coefficient (0 where the scale has none)."""
    data, actor = scale["data"], scale["actor_rollout_ref"]["actor"]
    rollout = scale["actor_rollout_ref"]["rollout"]
    return {
        "steps": scale["trainer"]["total_training_steps"],
        "batch": data["train_batch_size"],
        "n": rollout["n"],
        "mini_batches": data["train_batch_size"] // actor["ppo_mini_batch_size"],
        "lr": actor["optim"]["lr"],
        "response_length": data["max_response_length"],
        "temperature": rollout["temperature"],
        "kl_coef": actor["kl_loss_coef"] if actor.get("use_kl_loss") else 0.0,
    }


def grpo_overrides(
    *,
    train: Path,
    validation: Path,
    model: Path,
    steps: int,
    seed: int,
    batch: int,
    n: int,
    mini_batches: int,
    micro_batch: int,
    prompt_length: int,
    response_length: int,
    lr: float,
    temperature: float,
    eval_samples: int,
    reward: Sequence[str],
    project: str,
    experiment: str,
    v1: bool | None = None,
    eval_every: int | None = None,
    kl_coef: float = 0.0,
) -> list[str]:
    """veRL overrides of a GRPO run (module docstring); ``reward``: the task's reward overrides; ``validation``: the
    file veRL's validation scores (the evaluated texts); ``v1``: the trainer (None: the caller sets it);
    ``eval_every``: evaluate every this many steps as well (veRL's ``test_freq``; None: after the last only);
    ``kl_coef`` > 0: a KL term to the starting model in the actor's loss, ``kl_coef * KL`` with veRL's ``low_var_kl``
    estimator (the reference policy's log-probs are then computed every step)."""
    from maspo_base.speech_tokens.llasa_prompt import speech_template_override

    if batch % mini_batches:
        raise ValueError(f"batch={batch} prompts do not split into mini_batches={mini_batches}")
    if eval_samples < 0:
        raise ValueError(f"eval_samples={eval_samples} must be >= 0 (0: no validation)")
    if eval_every is not None and not (eval_every >= 1 and steps % eval_every == 0):
        raise ValueError(
            f"eval_every={eval_every} must be >= 1 and divide steps={steps} (an evaluation after the last)"
        )
    evaluated = [
        "trainer.val_before_train=True",
        f"trainer.test_freq={eval_every or steps}",
        f"actor_rollout_ref.rollout.val_kwargs.n={eval_samples}",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
        f"actor_rollout_ref.rollout.val_kwargs.temperature={temperature}",
        "actor_rollout_ref.rollout.val_kwargs.top_p=1.0",
        "actor_rollout_ref.rollout.val_kwargs.top_k=-1",
    ]
    not_evaluated = ["trainer.val_before_train=False", "trainer.test_freq=-1"]
    return [
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        f"data.train_files={train}",
        f"data.val_files={validation}",
        *(evaluated if eval_samples else not_evaluated),
        f"data.train_batch_size={batch}",
        f"data.max_prompt_length={prompt_length}",
        f"data.max_response_length={response_length}",
        f"data.seed={seed}",
        f"actor_rollout_ref.model.path={model}",
        speech_template_override(),
        f"actor_rollout_ref.rollout.n={n}",
        f"actor_rollout_ref.rollout.temperature={temperature}",
        f"actor_rollout_ref.rollout.seed={seed}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={batch // mini_batches}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro_batch}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro_batch}",
        # the reference policy's log-probs, computed when a KL term is asked for (actor.use_kl_loss=True)
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={micro_batch}",
        f"actor_rollout_ref.actor.optim.lr={lr}",
        *kl_term_overrides(kl_coef),
        "actor_rollout_ref.actor.entropy_coeff=0",
        *reward,
        f"trainer.total_training_steps={steps}",
        "trainer.save_freq=-1",
        f"trainer.project_name={project}",
        f"trainer.experiment_name={experiment}",
        *([] if v1 is None else [f"trainer.use_v1={v1}"]),
    ]


def kl_term_overrides(kl_coef: float) -> list[str]:
    """The actor's KL term to the starting model, ``kl_coef * KL`` with veRL's ``low_var_kl`` estimator (the k3
    estimator ``exp(ref - logp) - (ref - logp) - 1`` per token, clipped to [-10, 10]); none at 0. Raises
    ``ValueError`` for a negative or non-finite ``kl_coef``."""
    if not (math.isfinite(kl_coef) and kl_coef >= 0):
        raise ValueError(f"kl_coef={kl_coef} must be a finite number >= 0 (0: no KL term)")
    if not kl_coef:
        return ["actor_rollout_ref.actor.use_kl_loss=False"]
    return [
        "actor_rollout_ref.actor.use_kl_loss=True",
        f"actor_rollout_ref.actor.kl_loss_coef={kl_coef}",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    ]
