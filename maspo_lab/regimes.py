"""Training regimes for ``maspo-verl ablate``: named run-shape overrides, the grid's second axis beside the methods.

A regime changes how hard the run pushes the policy away from the one that sampled its data, the same way for every
method: the task, warm start and seeds stay the run's, so a method x regime x seed grid compares methods within a
regime. Built in, the same on every task (`maspo_lab.runs.tasks`), each relative to the task's own run:

- ``default``: the task's run (synthetic: 4 mini-batches per rollout batch, one epoch, lr 5e-4; speech: the code
  ear's learning setting, 2 mini-batches, lr 1e-4 with a KL term, `maspo_lab.runs.speech_run.LEARNING_SETTING`);
- ``stale``: 4 epochs over the task's mini-batches (16 actor updates per rollout batch on the synthetic task, 8 on
  speech), so the later updates see ratios far from 1 (``actor_rollout_ref.actor.ppo_epochs=4``);
- ``hot``: a learning rate far above the task's (`HOT_LR`): synthetic 2e-3, 4x its 5e-4, where GRPO's entropy blew
  up in the demo's tuning (docs/history.md); speech 1e-3, 10x its 1e-4 (at 2e-4, then 10x the task's 2e-5, every
  method doubled mini-llasa's held-out CER within 25 steps under the Whisper reward: docs/long-runs.md).

A user regime is ``name:override,override,...`` (the ``--method`` syntax, `maspo_lab.methods.parse_named_overrides`);
its overrides come after the run's and before the method's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from maspo_lab.methods import ACTOR, parse_named_overrides_list


@dataclass(frozen=True)
class Regime:
    """A named set of run-shape overrides (Hydra ``key=value``), applied after the run's and before the method's."""

    name: str
    overrides: tuple[str, ...]
    description: str = ""


def user_regime(name: str, overrides: tuple[str, ...]) -> Regime:
    return Regime(name, overrides, "user-defined")


STALE_EPOCHS = 4
HOT_LR = {"synthetic": "2e-3", "speech": "1e-3"}
"""``hot``'s learning rate per task (module docstring), as written into the override."""
DEFAULT_REGIMES = ("default",)
DEFAULT_REGIME = Regime("default", (), "the task's run")


def builtin_regimes(task: str) -> dict[str, Regime]:
    """``default``, ``stale`` and ``hot`` on ``task`` (a name of `maspo_lab.runs.tasks`)."""
    from maspo_lab.runs.tasks import task_named

    d = task_named(task).defaults
    updates = d["mini_batches"]
    return {
        "default": Regime("default", (), f"the task's run: {updates} actor updates per rollout batch, lr {d['lr']:g}"),
        "stale": Regime(
            "stale",
            (f"{ACTOR}.ppo_epochs={STALE_EPOCHS}",),
            f"{STALE_EPOCHS} epochs over the {updates} mini-batches: {STALE_EPOCHS * updates} updates per batch",
        ),
        "hot": Regime(
            "hot",
            (f"{ACTOR}.optim.lr={HOT_LR[task]}",),
            f"lr {HOT_LR[task]}, {float(HOT_LR[task]) / d['lr']:g}x the task's",
        ),
    }


def parse_regimes(specs: Iterable[str], task: str) -> list[Regime]:
    """Built-in names (`builtin_regimes` of ``task``) or ``name:key=value,...``; names must be unique. Raises
    `MethodError` naming ``--regime``."""
    return parse_named_overrides_list(specs, "--regime", builtin_regimes(task), user_regime)
