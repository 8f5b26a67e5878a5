"""Training regimes for ``maspo-verl ablate``: named run-shape overrides, the grid's second axis beside the methods.

A regime changes how hard the run pushes the policy away from the one that sampled its data, the same way for every
method: the task, warm start and seeds stay the run's, so a method x regime x seed grid compares methods within a
regime. Built in:

- ``default``: the demo's run (4 mini-batches per rollout batch, one epoch, lr 5e-4): 4 actor updates per batch;
- ``stale``: 4 epochs over the 4 mini-batches, 16 actor updates per rollout batch, so the later updates see
  ratios far from 1 (``actor_rollout_ref.actor.ppo_epochs=4``);
- ``hot``: lr 2e-3, 4x the demo's, where GRPO's entropy blew up in the demo's tuning (docs/history.md).

A user regime is ``name:override,override,...`` (the ``--method`` syntax, `maspo_verl.methods.parse_named_overrides`);
its overrides come after the run's and before the method's.
"""

from __future__ import annotations

from collections.abc import Iterable

from maspo_verl.methods import ACTOR, Method, parse_named_overrides_list

Regime = Method
"""A named set of run-shape overrides (the same shape as a method)."""

BUILTIN_REGIMES: dict[str, Regime] = {
    "default": Regime("default", (), "the demo's run: 4 actor updates per rollout batch, lr 5e-4"),
    "stale": Regime("stale", (f"{ACTOR}.ppo_epochs=4",), "4 epochs over the 4 mini-batches: 16 updates per batch"),
    "hot": Regime("hot", (f"{ACTOR}.optim.lr=2e-3",), "lr 2e-3, 4x the demo's"),
}
DEFAULT_REGIMES = ("default",)


def parse_regimes(specs: Iterable[str]) -> list[Regime]:
    """Built-in names or ``name:key=value,...``; names must be unique. Raises `MethodError` naming ``--regime``."""
    return parse_named_overrides_list(specs, "--regime", BUILTIN_REGIMES)
