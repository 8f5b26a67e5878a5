"""Policy-optimisation methods as typed objects: the one vocabulary of every command and recipe.

A method is what differs between two runs of the same task: the policy loss, its clip ranges, its aggregation and,
for a credit method, the advantage estimator. Everything else (data, model, warm start, seeds, batch shape) is the
run's, so a grid of methods x seeds compares methods only.

The built-in methods are the Hydra config group ``maspo_verl/trainer_config/method/*.yaml``, their only
definition (the recipes select them with ``method=NAME``); `BUILTIN_METHODS` holds each as a `Method`: the config
Hydra composes for ``method=NAME`` (`method_config`), a nested mapping, typed as `MethodSettings`.
`DEFAULT_GRID` is ablate's default: ``grpo``, ``gspo``, ``maspo-fixed4`` and ``maspo-fsq``.

A method travels as a `Method` from where it is named to where a run is launched, and only there is it written as
veRL's ``++key=value`` overrides, by one function (`as_overrides`, `Method.overrides`), which compose to the config
``method=NAME`` gives (``tests/test_methods.py``). Every other form is read into a `Method` where it is given, its
bad items named there (`overrides_config`, the one reader of ``key=value`` strings):

- a user method, ``name:override,override,...`` (`parse_method`), Hydra overrides on top of the run, e.g.
  ``grpo-lowclip:actor_rollout_ref.actor.clip_ratio_low=0.1,actor_rollout_ref.actor.clip_ratio_high=0.1``; a
  built-in name alone selects it;
- a run's refinement, Hydra overrides after the method's own (`refine`, `Method.refined`; the commands'
  ``--set KEY=VALUE``);
- a task's refinement: a task whose responses differ from real speech refines some methods for itself in
  ``maspo_verl/trainer_config/task/<task>.yaml`` (method name -> ``key=value`` list, read as the config it adds,
  `task_refinements`, and applied by `task_method`): the synthetic task's short units take a smaller
  ``token_jump`` threshold, for example. The recipe, which selects a built-in by ``method=NAME``, adds it as
  overrides (`task_refinement_overrides`).

The layout of the task's model is no refinement: its checkpoint declares it, and `task_method` applies it to every
method, built-in or not, as the driver does.

`validate_methods` composes each method's config with veRL's own Hydra config and builds its typed actor and
algorithm configs, so a bad override fails in seconds, naming the method, before any run.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib.resources import files
from typing import Any, TypeVar

T = TypeVar("T")

ACTOR = "actor_rollout_ref.actor"
MASPO_KEY = f"{ACTOR}.policy_loss.maspo"
METHOD_GROUP = files("maspo_verl.trainer_config") / "method"
"""The methods' config group: one YAML file per method; a name starting with ``_`` is a part, not a method."""


@dataclass(frozen=True)
class Method:
    """A named method: the config it sets (a nested mapping, what Hydra composes for ``method=NAME`` or what a user's
    overrides say), typed as `MethodSettings` (`settings`) and written once as ``++key=value`` overrides for a
    command line (`overrides`), the only direction the config travels."""

    name: str
    config: Mapping[str, Any]
    description: str = ""

    @property
    def overrides(self) -> tuple[str, ...]:
        return as_overrides(self.config)

    @functools.cached_property
    def settings(self) -> MethodSettings:
        return MethodSettings.of(self)

    def refined(self, config: Mapping[str, Any], name: str | None = None) -> Method:
        """This method with ``config`` (a nested mapping: a task's refinement, `task_refinements`, or a run's
        ``--set`` read by `overrides_config`) merged over its own, a later value of a key winning; the method itself
        when there is nothing to change."""
        from omegaconf import OmegaConf

        if not config and name is None:
            return self
        merged = OmegaConf.to_container(OmegaConf.merge(self.config, config))
        return Method(name or self.name, merged, self.description)


@dataclass(frozen=True)
class MethodSettings:
    """What a method sets, typed: the policy loss and its clip, MASPO's settings (defaults filled), the advantage
    estimator and segment credit's settings; ``sections``: every top-level config section it sets."""

    loss_mode: str | None
    clip: Mapping[str, float]
    """The actor's ``clip_ratio_low``/``clip_ratio_high`` the method sets (veRL's losses)."""
    maspo: Any
    """`maspo_verl.config.MaspoConfig` for ``loss_mode=maspo``, else None."""
    maspo_block: Mapping[str, Any]
    """The ``policy_loss.maspo`` keys the method sets, as it says them (what a loss built elsewhere takes)."""
    adv_estimator: str | None
    credit: Any
    """`maspo_verl.credit_config.CreditConfig` when the method sets ``algorithm.maspo``, else None."""
    sections: frozenset[str]

    @classmethod
    def of(cls, method: Method) -> MethodSettings:
        from maspo_verl.config import MaspoConfig
        from maspo_verl.credit_config import CreditConfig

        actor = method.config.get("actor_rollout_ref", {}).get("actor", {})
        policy_loss = actor.get("policy_loss", {})
        loss_mode = policy_loss.get("loss_mode")
        block = dict(policy_loss.get("maspo", {}))
        algorithm = method.config.get("algorithm", {})
        try:
            maspo = MaspoConfig.from_mapping(block, key=MASPO_KEY) if loss_mode == "maspo" else None
            credit = CreditConfig.from_mapping(algorithm["maspo"]) if "maspo" in algorithm else None
        except ValueError as error:
            raise MethodError(f"--method {method.name!r}: {error}") from None
        return cls(
            loss_mode=loss_mode,
            clip={key: float(actor[key]) for key in ("clip_ratio_low", "clip_ratio_high") if key in actor},
            maspo=maspo,
            maspo_block=block,
            adv_estimator=algorithm.get("adv_estimator"),
            credit=credit,
            sections=frozenset(method.config),
        )


def method_config(name: str) -> dict[str, Any]:
    """The config ``method=NAME`` adds to a run, as Hydra composes it (the method's file over its ``defaults``)."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    if not (METHOD_GROUP / f"{name}.yaml").is_file():
        raise MethodError(f"no method {name!r} in {METHOD_GROUP}")
    with initialize_config_module("maspo_verl.trainer_config", version_base=None):
        config = OmegaConf.to_container(compose(config_name=None, overrides=[f"+method={name}"]))
    config.pop("hydra", None)
    return config


def _value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str) and any(c in value for c in " ,=[]{}'\"\\()"):
        return "'" + value.replace("'", "\\'") + "'"
    return str(value)


def as_overrides(config: Mapping[str, Any], prefix: str = "") -> tuple[str, ...]:
    """``++dotted.key=value`` for every leaf of ``config`` (``++``: set, whether the base config has the key or not)."""
    out: list[str] = []
    for key, value in config.items():
        if isinstance(value, Mapping):
            out.extend(as_overrides(value, f"{prefix}{key}."))
        else:
            out.append(f"++{prefix}{key}={_value(value)}")
    return tuple(out)


def _description(name: str) -> str:
    """The first line of the method file's comment."""
    lines = (METHOD_GROUP / f"{name}.yaml").read_text().splitlines()
    return next((line.lstrip("# ") for line in lines if line.startswith("#") and "@package" not in line), "")


def builtin_method_names() -> list[str]:
    return sorted(
        p.name[: -len(".yaml")] for p in METHOD_GROUP.iterdir() if p.name.endswith(".yaml") and p.name[0] != "_"
    )


BUILTIN_METHODS: dict[str, Method] = {
    name: Method(name, method_config(name), _description(name)) for name in builtin_method_names()
}
DEFAULT_GRID = ("grpo", "gspo", "maspo-fixed4", "maspo-fsq")


TASK_GROUP = files("maspo_verl.trainer_config") / "task"
"""Per task, the methods it refines: one YAML file per task, ``method name: [key=value, ...]``."""


def overrides_config(overrides: Sequence[str]) -> dict[str, Any]:
    """What ``key=value`` overrides (``+``/``++`` allowed) set, as a nested mapping: the one place the strings of a
    user's method, a task's refinement or a run's ``--set`` are read, before they travel in a `Method`."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.from_dotlist([o.lstrip("+") for o in overrides]))


def not_key_value(overrides: Sequence[str]) -> list[str]:
    """The items of ``overrides`` that are not ``key=value`` (a deletion ``~key`` refines nothing)."""
    return [o for o in overrides if "=" not in o or o.startswith("~")]


def refine(method: Method, overrides: Sequence[str], name: str | None = None) -> Method:
    """``method`` with Hydra ``overrides`` (``key=value``, a run's ``--set``) after its own (`Method.refined`): a
    later value of a key wins."""
    bad = not_key_value(overrides)
    if bad:
        raise MethodError(f"--set {bad}: a refinement of --method {method.name!r} must be key=value")
    return method.refined(overrides_config(overrides), name)


def task_refinements(task: str) -> dict[str, dict[str, Any]]:
    """``trainer_config/task/<task>.yaml``: per built-in method, the config the task adds to it (its list of
    ``key=value`` read as a nested mapping; `MethodError` naming the file for a name that is no method or an item
    that is not ``key=value``)."""
    import yaml

    path = TASK_GROUP / f"{task}.yaml"
    if not path.is_file():
        raise MethodError(f"no task {task!r} in {TASK_GROUP}")
    refinements = yaml.safe_load(path.read_text()) or {}
    unknown = sorted(set(refinements) - set(BUILTIN_METHODS))
    if unknown:
        raise MethodError(f"{path}: {unknown} are not methods; built-ins are {', '.join(BUILTIN_METHODS)}")
    bad = {name: not_key_value(overrides) for name, overrides in refinements.items() if not_key_value(overrides)}
    if bad:
        raise MethodError(f"{path}: every refinement must be key=value, got {bad}")
    return {name: overrides_config(overrides) for name, overrides in refinements.items()}


def task_refinement_overrides(method: str, task: str) -> tuple[str, ...]:
    """What ``task`` adds to the built-in ``method`` as Hydra overrides (``++key=value``, `as_overrides`), for a
    launcher that selects the method by its config group (``method=NAME``: ``recipes/llasa_1b/run.sh`` with
    ``MODEL=mini``)."""
    return as_overrides(task_refinements(task).get(method, {}))


def task_method(spec: str | Method, task: str, refinements: Sequence[str] = (), *, layout: str | None) -> Method:
    """A method (`parse_method`'s ``spec``, a built-in or a user's) as it runs on ``task``: a built-in with the
    task's refinement of it (`task_refinements`), then ``refinements`` (a run's ``--set``), then the layout of the
    task's model (``layout``: what its checkpoint declares, None: nothing) in every codec block the method reads, by
    the driver's rule (`maspo_verl.model_layout.apply_model_layout`: a block that names another layout is refused).
    A task gives its model's (`maspo_lab.runs.task.Task.method`)."""
    from maspo_verl.model_layout import apply_model_layout

    method = parse_method(spec) if isinstance(spec, str) else spec
    own = task_refinements(task).get(method.name, {}) if method is BUILTIN_METHODS.get(method.name) else {}
    refined = refine(method.refined(own), refinements)
    config = copy.deepcopy(dict(refined.config))
    try:
        apply_model_layout(config, layout, f"of the {task} task")
    except ValueError as error:
        raise MethodError(f"--method {method.name!r}: {error}") from None
    return refined if config == refined.config else Method(refined.name, config, refined.description)


def method_help(default: str) -> str:
    """The help of a command's ``--method``."""
    return (
        f"a method of maspo_verl/trainer_config/method/ ({', '.join(BUILTIN_METHODS)}) or NAME:key=value,...; "
        f"on the synthetic task with the task's refinement of it (trainer_config/task/synthetic.yaml) "
        f"(default: {default})"
    )


def add_set_argument(parser, example: str) -> None:
    """``--set KEY=VALUE`` (repeatable, into ``args.refinements``): Hydra overrides after each method's (`refine`)."""
    parser.add_argument(
        "--set",
        dest="refinements",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"a Hydra override after the method's, repeatable (e.g. --set {example})",
    )


class MethodError(ValueError):
    """A ``--method`` that cannot be parsed or whose overrides veRL's config rejects; the message names it."""


def user_method(name: str, overrides: tuple[str, ...]) -> Method:
    return Method(name, overrides_config(overrides), "user-defined")


def parse_named_overrides(spec: str, flag: str, builtins: Mapping[str, T], build: Callable[[str, tuple], T]) -> T:
    """``name`` (one of ``builtins``) or ``name:override,override,...`` (user-defined, made by ``build(name,
    overrides)``), as given to ``flag``."""
    name, sep, rest = spec.partition(":")
    name = name.strip()
    if not name:
        raise MethodError(f"{flag} {spec!r}: expected NAME or NAME:key=value,key=value")
    if not sep:
        if name not in builtins:
            raise MethodError(
                f"{flag} {spec!r}: unknown name {name!r}; built-ins are {', '.join(builtins)}, "
                "or define one as NAME:key=value,key=value"
            )
        return builtins[name]
    overrides = tuple(item.strip() for item in rest.split(",") if item.strip())
    bad = not_key_value(overrides)
    if not overrides or bad:
        raise MethodError(f"{flag} {name!r}: every override must be key=value, got {bad or [rest]}")
    return build(name, overrides)


def parse_method(spec: str) -> Method:
    """``name`` (a built-in) or ``name:override,override,...`` (a user method)."""
    return parse_named_overrides(spec, "--method", BUILTIN_METHODS, user_method)


def parse_named_overrides_list(
    specs: Iterable[str], flag: str, builtins: Mapping[str, T], build: Callable[[str, tuple], T]
) -> list[T]:
    """Each of ``specs`` as `parse_named_overrides`; the names must be unique."""
    parsed = [parse_named_overrides(spec, flag, builtins, build) for spec in specs]
    names = [m.name for m in parsed]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise MethodError(f"{flag} names must be unique, repeated: {duplicates}")
    return parsed


def parse_methods(specs: Iterable[str]) -> list[Method]:
    return parse_named_overrides_list(specs, "--method", BUILTIN_METHODS, user_method)


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

    from maspo_verl.credit_config import validate_algorithm_config
    from maspo_verl.model_layout import fill_model_layout
    from maspo_verl.policy_loss_shorthand import normalize_policy_loss

    for method in methods:
        try:
            overrides = [*run_overrides, *method.overrides]
            config = compose_config(overrides)
            normalize_policy_loss(config, overrides)  # the shorthand policy_loss=<name>, as the plugin's driver hook
            fill_model_layout(config)  # the model's speech-token layout, as the driver hook
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
