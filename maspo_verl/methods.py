"""Policy-optimisation methods as named sets of veRL overrides: one home for the demo's ``--loss`` and ``ablate``.

A method is what differs between two runs of the same task: the policy loss, its clip ranges, its aggregation and,
for a credit method, the advantage estimator. Everything else (data, model, warm start, seeds, batch shape) is the
run's, so a grid of methods x seeds compares methods only. Built in (`BUILTIN_METHODS`):

- ``grpo``: veRL's ``vanilla`` PPO-clip loss on GRPO advantages, clip ``[1 - 0.2, 1 + 0.28]``, ``token-mean``.
- ``gspo``: veRL's ``gspo`` loss (sequence-level ratio), clip ``[1 - 3e-4, 1 + 4e-4]``, ``seq-mean-token-mean``,
  as in the GSPO paper.
- ``maspo-fixed``: MASPO with fixed windows of 4 tokens; ``maspo-fsq``: MASPO cut where the FSQ digits jump
  (threshold 2), the task's segmenter settings (`maspo_verl.data.synthetic_tts.SEGMENTER_SETTINGS`); both with
  MASPO's default clip (0.2/0.28 shrunk as ``L**-0.5``) and ``token-mean``.
- ``maspo-credit``: ``maspo-fsq`` with segment credit (``adv_estimator=maspo``, lambda 0.5); not in the default grid.

A user method is ``name:override,override,...`` (`parse_method`), Hydra overrides on top of the GRPO run, e.g.
``grpo-lowclip:actor_rollout_ref.actor.clip_ratio_low=0.1,actor_rollout_ref.actor.clip_ratio_high=0.1``; a built-in
name alone selects it. A credit method (e.g. ``maspo-credit`` with ``algorithm.adv_estimator=maspo``) is one more
entry with its overrides. `validate_methods` composes each method's config with veRL's own Hydra config and builds
its typed actor and algorithm configs, so a bad override fails in seconds, naming the method, before any run.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from maspo_verl.data.synthetic_tts import SEGMENTER_SETTINGS

ACTOR = "actor_rollout_ref.actor"
MASPO_KEY = f"{ACTOR}.policy_loss.maspo"


@dataclass(frozen=True)
class Method:
    """A named set of Hydra overrides for ``verl.trainer.main_ppo``."""

    name: str
    overrides: tuple[str, ...]
    description: str = ""


def maspo_overrides(segmenter: str, params: dict[str, object] | None = None) -> tuple[str, ...]:
    """Overrides selecting MASPO with ``segmenter`` and its parameters (validated by `maspo_verl.config`)."""
    return (
        f"{ACTOR}.policy_loss._target_=maspo_verl.config.MaspoPolicyLossConfig",
        f"{ACTOR}.policy_loss.loss_mode=maspo",
        f"+{MASPO_KEY}.segmenter.name={segmenter}",
        *(f"+{MASPO_KEY}.segmenter.{key}={value}" for key, value in (params or {}).items()),
    )


def _verl_loss(loss_mode: str, low: float, high: float, agg: str) -> tuple[str, ...]:
    return (
        f"{ACTOR}.policy_loss.loss_mode={loss_mode}",
        f"{ACTOR}.clip_ratio_low={low}",
        f"{ACTOR}.clip_ratio_high={high}",
        f"{ACTOR}.loss_agg_mode={agg}",
    )


BUILTIN_METHODS: dict[str, Method] = {
    method.name: method
    for method in (
        Method("grpo", _verl_loss("vanilla", 0.2, 0.28, "token-mean"), "veRL vanilla PPO-clip, GRPO advantages"),
        Method("gspo", _verl_loss("gspo", 3e-4, 4e-4, "seq-mean-token-mean"), "veRL gspo, as the GSPO paper"),
        Method(
            "maspo-fixed",
            (f"{ACTOR}.loss_agg_mode=token-mean", *maspo_overrides("fixed", SEGMENTER_SETTINGS["fixed"])),
            "MASPO, fixed windows of 4 tokens",
        ),
        Method(
            "maspo-fsq",
            (f"{ACTOR}.loss_agg_mode=token-mean", *maspo_overrides("fsq", SEGMENTER_SETTINGS["fsq"])),
            "MASPO, cut where FSQ digits jump (threshold 2)",
        ),
        Method(
            "maspo-credit",
            (
                f"{ACTOR}.loss_agg_mode=token-mean",
                *maspo_overrides("fsq", SEGMENTER_SETTINGS["fsq"]),
                "algorithm.adv_estimator=maspo",
                "++algorithm.maspo.credit_weight=0.5",
            ),
            "maspo-fsq plus segment credit (adv_estimator=maspo, lambda 0.5) from the task's frame errors",
        ),
    )
}
DEFAULT_GRID = ("grpo", "gspo", "maspo-fixed", "maspo-fsq")


class MethodError(ValueError):
    """A ``--method`` that cannot be parsed or whose overrides veRL's config rejects; the message names it."""


def parse_method(spec: str) -> Method:
    """``name`` (a built-in) or ``name:override,override,...`` (a user method)."""
    name, sep, rest = spec.partition(":")
    name = name.strip()
    if not name:
        raise MethodError(f"--method {spec!r}: expected NAME or NAME:key=value,key=value")
    if not sep:
        if name not in BUILTIN_METHODS:
            raise MethodError(
                f"--method {spec!r}: unknown method {name!r}; built-ins are {', '.join(BUILTIN_METHODS)}, "
                "or define one as NAME:key=value,key=value"
            )
        return BUILTIN_METHODS[name]
    overrides = tuple(item.strip() for item in rest.split(",") if item.strip())
    bad = [item for item in overrides if "=" not in item]
    if not overrides or bad:
        raise MethodError(f"--method {name!r}: every override must be key=value, got {bad or [rest]}")
    return Method(name, overrides, "user-defined")


def parse_methods(specs: Iterable[str]) -> list[Method]:
    methods = [parse_method(spec) for spec in specs]
    names = [m.name for m in methods]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise MethodError(f"--method names must be unique, repeated: {duplicates}")
    return methods


def compose_config(overrides: Sequence[str]):
    """veRL's ``ppo_trainer`` Hydra config with ``overrides`` (as ``main_ppo`` composes it)."""
    from hydra import compose, initialize_config_module

    with initialize_config_module("verl.trainer.config", version_base=None):
        return compose("ppo_trainer", overrides=list(overrides))


def validate_methods(methods: Sequence[Method], run_overrides: Sequence[str]) -> None:
    """Compose each method's config and build its typed actor and algorithm configs, as veRL's driver does.

    Raises `MethodError` naming the method and veRL's complaint (unknown key, bad value, unknown loss or
    advantage estimator). Takes seconds; nothing is started.
    """
    from omegaconf import OmegaConf
    from verl.trainer.ppo import core_algos
    from verl.utils.config import omega_conf_to_dataclass

    from maspo_verl.config import normalize_policy_loss, validate_algorithm_config

    for method in methods:
        try:
            overrides = [*run_overrides, *method.overrides]
            config = compose_config(overrides)
            normalize_policy_loss(config, overrides)  # the shorthand policy_loss=<name>, as the plugin's driver hook
            actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
            validate_algorithm_config(config)  # algorithm.maspo (segment credit), as the plugin does in the driver
            algorithm = OmegaConf.create(OmegaConf.to_container(config.algorithm))
            algorithm.pop("maspo", None)  # not an AlgoConfig field; veRL itself never builds AlgoConfig in the driver
            omega_conf_to_dataclass(algorithm)
            core_algos.get_policy_loss_fn(actor.policy_loss.loss_mode)
            estimator = config.algorithm.adv_estimator
            if estimator not in core_algos.ADV_ESTIMATOR_REGISTRY:
                raise ValueError(
                    f"algorithm.adv_estimator={estimator!r} is not registered; "
                    f"known: {', '.join(sorted(core_algos.ADV_ESTIMATOR_REGISTRY))}"
                )
        except Exception as exc:  # noqa: BLE001 - Hydra, OmegaConf, dataclass and registry errors alike
            raise MethodError(f"--method {method.name!r}: {type(exc).__name__}: {exc}") from exc
