"""The tasks veRL's trainer runs on CPU, by name: ``speech`` (`maspo_lab.runs.speech_run`: mini-llasa, the real speech
reward) and ``synthetic`` (`maspo_lab.runs.synthetic_run`: the tiny Llasa-shaped model, a synthetic listener).

`task_named` gives a task as the typed `maspo_lab.runs.task.Task` its run module builds (its ``TASK``), so the
commands (``ablate``, ``demo``, ``fidelity``, ``segments``) read the task they are given and nothing task-specific;
the options every command shares about a task are here too (``--task``, read first since the other options'
defaults are the task's; ``--eval-samples``; a run's shape checked).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from maspo_lab.runs.task import Task

TASK_NAMES = ("speech", "synthetic")
"""The tasks, the default first."""


def task_named(name: str) -> Task:
    """Task ``name`` (`TASK_NAMES`); ``ValueError`` naming the valid ones."""
    if name == "speech":
        from maspo_lab.runs import speech_run

        return speech_run.TASK
    if name == "synthetic":
        from maspo_lab.runs import synthetic_run

        return synthetic_run.TASK
    raise ValueError(f"no task {name!r}; valid: {', '.join(TASK_NAMES)}")


def task_of(argv: list[str]) -> Task:
    """The task ``argv``'s ``--task`` names, read before the other options (their defaults are the task's); the
    default one where it names none, or one that is not a task (the command's own parser then rejects it)."""
    import argparse

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--task", default=TASK_NAMES[0])
    name = pre.parse_known_args(argv)[0].task
    return task_named(name if name in TASK_NAMES else TASK_NAMES[0])


def add_task_argument(parser) -> None:
    """``--task`` (`TASK_NAMES`, speech by default)."""
    parser.add_argument(
        "--task",
        choices=TASK_NAMES,
        default=TASK_NAMES[0],
        help="speech (default: mini-llasa heard by Whisper tiny.en) or synthetic (the tiny Llasa-shaped model on "
        "the synthetic TTS task)",
    )


def add_eval_samples_argument(parser, default: int) -> None:
    """``--eval-samples``, the evaluation's responses per text (checked by `check_run_shape`)."""
    parser.add_argument(
        "--eval-samples",
        type=int,
        default=default,
        help=f"responses per evaluated text scored before the first step and after the last (0: no evaluation; "
        f"default {default})",
    )


def check_run_shape(parser, args) -> None:
    """Reject (``parser.error``) a run shape veRL cannot split: counts below 1, prompts not a multiple of the
    mini-batches, a negative ``--eval-samples``, a negative or non-finite ``--kl-coef``, an ``--eval-every`` that does
    not divide ``--steps``. ``args`` has ``steps``, ``batch``, ``n``, ``mini_batches``, ``eval_samples`` (and
    ``kl_coef``, ``eval_every`` where the command has them)."""
    for key in ("steps", "batch", "n", "mini_batches"):
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
    if args.batch % args.mini_batches:
        parser.error(f"--batch {args.batch} must be a multiple of --mini-batches {args.mini_batches}")
    if args.eval_samples < 0:
        parser.error(f"--eval-samples must be >= 0 (0: no evaluation), got {args.eval_samples}")
    kl_coef = getattr(args, "kl_coef", 0.0)
    if not (math.isfinite(kl_coef) and kl_coef >= 0):
        parser.error(f"--kl-coef must be a finite number >= 0 (0: no KL term), got {kl_coef}")
    every = getattr(args, "eval_every", None)
    if every is not None and not (every >= 1 and args.steps % every == 0):
        parser.error(f"--eval-every {every} must be >= 1 and divide --steps {args.steps}")
