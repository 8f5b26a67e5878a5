"""The tasks veRL's trainer runs on CPU, by name: ``speech`` (`maspo_lab.runs.speech_run`: mini-llasa, the real speech
reward) and ``synthetic`` (`maspo_lab.runs.synthetic_run`: the tiny Llasa-shaped model, a synthetic listener).

Each run module gives the commands (``ablate``, ``demo``, ``fidelity``, ``segments``) the same interface, so a
command reads the task it is given and nothing task-specific:

- ``TASK``: the name of the methods' refinements for the task (``trainer_config/task/<TASK>.yaml``);
- ``TASK_DEFAULTS``: the run's shape (steps, batch, n, mini_batches, lr, texts, response_length, temperature,
  eval_samples), the commands' defaults; ``DEMO_SHAPE``: what the demo changes of it to fit its time;
- ``model_layout(model=None)``: the speech-token layout the task's model declares (its ``speech_tokens.json``);
  ``task_method(spec, refinements, model=None)``: a method as the task runs it, the task's refinement and its model's
  layout applied (`maspo_lab.methods.task_method`);
- ``DESCRIPTION`` (plot titles), ``CONTENT`` (what content is: ``1 - unit error rate``, ``1 - CER``), ``VALID``
  (what the valid rate counts: the end tag, a scored response), ``TIMEOUT_S`` (ablate's time limit per run);
- ``EVAL_SETS``: the sets an evaluation scores, key -> label (``train`` first; ``heldout`` on speech);
- ``task_paths(workdir)``: where ``build_task`` puts the task (nothing written; for validating overrides);
- ``add_task_arguments(parser)``, ``task_settings(args)``: a command's options that build the task and what they
  set (recorded beside the task), and ``build_task(workdir, settings, reuse=...)`` builds it;
- ``task_overrides(task, *, steps, seed, **shape)``: veRL's overrides of a GRPO run (the method's go after);
- ``step_content(record)``: a training step's content (NaN when not logged);
- ``evaluation_figures(records, samples)``: per evaluation (veRL's validation before the first step and after the
  last, ``samples`` responses per text) and evaluated set: ``step``, ``set``, ``content``, ``valid`` and the
  task's other figures.
"""

from __future__ import annotations

from types import ModuleType

TASK_NAMES = ("speech", "synthetic")
"""The tasks, the default first."""


def task_run(name: str) -> ModuleType:
    """The run module of task ``name`` (`TASK_NAMES`); ``ValueError`` naming the valid ones."""
    if name == "speech":
        from maspo_lab.runs import speech_run

        return speech_run
    if name == "synthetic":
        from maspo_lab.runs import synthetic_run

        return synthetic_run
    raise ValueError(f"no task {name!r}; valid: {', '.join(TASK_NAMES)}")


def task_of(argv: list[str], default: str = TASK_NAMES[0]) -> str:
    """The ``--task`` of ``argv`` (``default`` otherwise), read before the other options: their defaults depend on
    it. An unknown task is left for the command's own parser to reject."""
    import argparse

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--task", default=default)
    return pre.parse_known_args(argv)[0].task


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
    mini-batches, a negative ``--eval-samples``, an ``--eval-every`` that does not divide ``--steps``. ``args`` has
    ``steps``, ``batch``, ``n``, ``mini_batches``, ``eval_samples`` (and ``eval_every`` where the command has it)."""
    for key in ("steps", "batch", "n", "mini_batches"):
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
    if args.batch % args.mini_batches:
        parser.error(f"--batch {args.batch} must be a multiple of --mini-batches {args.mini_batches}")
    if args.eval_samples < 0:
        parser.error(f"--eval-samples must be >= 0 (0: no evaluation), got {args.eval_samples}")
    every = getattr(args, "eval_every", None)
    if every is not None and not (every >= 1 and args.steps % every == 0):
        parser.error(f"--eval-every {every} must be >= 1 and divide --steps {args.steps}")
