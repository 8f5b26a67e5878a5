"""A task veRL's trainer runs on CPU, typed: `Task` holds what the commands (``ablate``, ``demo``, ``fidelity``,
``segments``) and the analyses read of a task, so a command reads the task it is given and nothing task-specific.

Each run module builds its own once, as its ``TASK`` (`maspo_lab.runs.speech_run`, `maspo_lab.runs.synthetic_run`);
`maspo_lab.runs.tasks.task_named` gives it by name. A missing or misspelt field fails where the module builds it, on
import, not in a run that reads it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from maspo_lab.methods import Method


class TaskFiles(Protocol):
    """Where a built task's files are (each run module's ``TaskPaths``): the model, the training and validation
    parquets."""

    model: Path
    train: Path
    val: Path


@dataclass(frozen=True)
class Task:
    """A task as every command reads it: its name, its run's shape, what its figures mean, how it is built, the
    veRL overrides of a run on it, how its metrics are read, and its methods as it runs them (`method`)."""

    name: str
    """``--task``, and the name of its refinements of the methods (``trainer_config/task/<name>.yaml``)."""
    model: Path | None
    """The checkpoint the task trains unless a command names another, whose ``speech_tokens.json`` declares the
    layout its methods read (`declared_layout`); None where each run builds its own (the tiny Llasa, which declares
    none)."""
    defaults: Mapping[str, Any]
    """The run's shape, the commands' defaults: steps, batch, n, mini_batches, lr, texts, response_length,
    temperature, eval_samples, and the task's own (speech: heldout, eval_texts; synthetic: warm_start_steps)."""
    demo_shape: Mapping[str, Any]
    """What the demo changes of `defaults` to fit its time (speech: under its default recogniser)."""
    description: str
    """The task in a plot's title."""
    content: str
    """What content is (``1 - unit error rate``, ``1 - CER``)."""
    valid: str
    """What an evaluation's valid rate counts (the end tag, a scored response)."""
    timeout_s: int
    """Seconds before ``ablate`` stops a run of the default length (its ``--timeout`` default)."""
    eval_sets: Mapping[str, str]
    """The sets an evaluation scores, key -> label (``train`` first; ``heldout`` on speech)."""
    paths: Callable[[str | Path], TaskFiles]
    """``paths(workdir)``: where `build` puts the task under ``workdir`` (nothing written; for validating
    overrides)."""
    add_build_arguments: Callable[[argparse.ArgumentParser], None]
    """A command's options that build the task."""
    build_settings: Callable[[argparse.Namespace], dict]
    """What those options set (recorded beside the built task); ``ValueError`` for a value the task refuses."""
    build: Callable[..., TaskFiles]
    """``build(workdir, settings, *, reuse=False)``: the task built under ``workdir`` (``reuse``: an earlier build's
    files kept)."""
    overrides: Callable[..., list[str]]
    """``overrides(files, *, steps, seed, **shape)``: veRL's overrides of a GRPO run on the built task with
    `defaults` (``shape`` replaces some); the method's go after."""
    step_content: Callable[[Mapping[str, float]], float]
    """A training step's content from its logged record (NaN when not logged)."""
    evaluation_figures: Callable[[list[dict], int], list[dict]]
    """``evaluation_figures(records, samples)``: per evaluation (veRL's validation before the first step and after
    the last, ``samples`` responses per text) and evaluated set: ``step``, ``set``, ``content``, ``valid`` and the
    task's other figures."""

    def declared_layout(self, model: str | Path | None = None) -> str | None:
        """The layout ``model`` (the task's own by default) declares in its ``speech_tokens.json``; None when it
        declares none (`maspo_base.speech_tokens.checkpoint_layout`)."""
        from maspo_base.speech_tokens.checkpoint_layout import declared_layout

        model = model or self.model
        return declared_layout(model) if model is not None else None

    def model_layout(self, model: str | Path | None = None) -> str:
        """The layout ``model`` (the task's own by default) speaks: the one it declares, else Llasa-1B's."""
        from maspo_base.speech_tokens.checkpoint_layout import DEFAULT_LAYOUT

        return self.declared_layout(model) or DEFAULT_LAYOUT

    def method(self, spec: str | Method, refinements: Sequence[str] = (), model: str | Path | None = None) -> Method:
        """A method (a built-in name, ``NAME:key=value,...`` or a `Method`) as this task runs it: the task's
        refinement of a built-in, then ``refinements`` (a run's ``--set``), then the layout its model declares
        (``model``: another checkpoint's) in every codec block the method reads (`maspo_lab.methods.task_method`)."""
        from maspo_lab.methods import task_method

        return task_method(spec, self.name, refinements, layout=self.declared_layout(model))
