"""`maspo_lab.methods` reads the method config group: the same methods, composing to the same configs."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import maspo_verl.trainer_config
from maspo_lab import methods

METHOD_FILES = sorted((Path(maspo_verl.trainer_config.__file__).parent / "method").glob("*.yaml"))

SELECTS_A_METHOD = """
hydra:
  searchpath:
    - pkg://verl.trainer.config
    - pkg://maspo_verl.trainer_config
defaults:
  - ppo_trainer
  - _self_
  - method: null
"""
"""A primary config that selects a method from the group the way the recipes do (``method=NAME``)."""


def test_every_method_of_the_group_is_in_the_docs_table_and_no_other():
    """docs/methods.md's first table names each file of the method group once (a method added or removed without
    the docs fails here)."""
    import re

    docs = (Path(__file__).resolve().parents[1] / "docs" / "methods.md").read_text()
    table = docs.split("\n\n| method |", 1)[1].split("\n\n", 1)[0]
    named = {name for row in table.splitlines()[2:] for name in re.findall(r"`([a-z0-9-]+)`", row.split("|")[2])}
    assert named == {p.stem for p in METHOD_FILES if not p.stem.startswith("_")}
    assert set(methods.DEFAULT_GRID) <= set(methods.BUILTIN_METHODS)
    assert all(m.description for m in methods.BUILTIN_METHODS.values())


@pytest.fixture(scope="module")
def with_the_group(tmp_path_factory):
    folder = tmp_path_factory.mktemp("primary")
    (folder / "selects_a_method.yaml").write_text(SELECTS_A_METHOD)

    def compose_with_group(name: str):
        with initialize_config_dir(config_dir=str(folder), version_base=None):
            return compose("selects_a_method", overrides=[f"method={name}"])

    return compose_with_group


@pytest.mark.parametrize("name", sorted(methods.BUILTIN_METHODS))
def test_a_methods_overrides_compose_to_what_its_file_says(name, with_the_group):
    from_file = OmegaConf.to_container(with_the_group(name))
    from_overrides = OmegaConf.to_container(methods.compose_config(methods.BUILTIN_METHODS[name].overrides))
    assert from_overrides == from_file


SEGMENTER = f"{methods.MASPO_KEY}.segmenter"


def test_a_refinement_comes_after_the_method_and_wins():
    fixed5 = methods.refine(methods.BUILTIN_METHODS["maspo-fixed4"], [f"{SEGMENTER}.window=5"])
    assert fixed5.name == "maspo-fixed4"
    assert methods.compose_config(fixed5.overrides) == methods.compose_config(
        methods.BUILTIN_METHODS["maspo-fixed5"].overrides
    )
    assert fixed5.settings.maspo_block["segmenter"] == {"name": "fixed", "window": 5}
    assert fixed5.settings.maspo.segmenter.params.window == 5
    with pytest.raises(methods.MethodError, match=r"--set \['window'\]"):
        methods.refine(fixed5, ["window"])


def test_the_synthetic_task_refines_token_jump_only():
    def segmenter(method):
        return methods.compose_config(method.overrides).actor_rollout_ref.actor.policy_loss.maspo.segmenter

    assert methods.task_refinements("synthetic") == {
        "maspo-token-jump": {
            "actor_rollout_ref": {"actor": {"policy_loss": {"maspo": {"segmenter": {"threshold": 64}}}}}
        }
    }
    assert segmenter(methods.BUILTIN_METHODS["maspo-token-jump"]).threshold == 4096
    assert segmenter(methods.task_method("maspo-token-jump", "synthetic", layout=None)).threshold == 64
    assert methods.task_method("maspo-fsq", "synthetic", layout=None) is methods.BUILTIN_METHODS["maspo-fsq"]
    # a user method named like a built-in is not the built-in: the task does not refine it
    user = methods.task_method(f"maspo-token-jump:{SEGMENTER}.name=token_jump", "synthetic", layout=None)
    assert user.overrides == (f"++{SEGMENTER}.name=token_jump",)
    # a run's refinement comes after the task's
    run = methods.task_method("maspo-token-jump", "synthetic", [f"{SEGMENTER}.threshold=8"], layout=None)
    assert segmenter(run).threshold == 8


USER_MASPO = f"mine:{methods.ACTOR}.policy_loss.loss_mode=maspo,{SEGMENTER}.name=fsq,algorithm.adv_estimator=maspo"
"""A user's own MASPO method with segment credit, defined on the command line (``--method NAME:key=value,...``)."""


def test_a_users_maspo_method_on_the_speech_task_reads_the_models_layout():
    """The speech task's model declares mini-llasa (its speech_tokens.json); a user's method gets that layout in its
    loss and its credit, as the built-ins do, and no task file says it."""
    from maspo_lab.runs import speech_run

    assert speech_run.TASK.model_layout() == "mini-llasa"
    user = speech_run.TASK.method(USER_MASPO).settings
    assert user.maspo.codec.speech_tokens.name == "mini-llasa" == user.credit.codec.speech_tokens.name
    for name in methods.BUILTIN_METHODS:
        settings = speech_run.TASK.method(name).settings
        assert settings.maspo is None or settings.maspo.codec.layout == "mini-llasa", name
        assert settings.credit is None or settings.credit.codec.layout == "mini-llasa", name
    # the synthetic task's tiny Llasa declares none: Llasa-1B's layout, as configured
    from maspo_lab.runs import synthetic_run

    assert synthetic_run.TASK.model_layout() == "llasa-1b"
    assert synthetic_run.TASK.method(USER_MASPO).settings.maspo.codec.speech_tokens.name == "llasa-1b"


def test_a_method_naming_another_layout_than_the_models_is_refused():
    from maspo_lab.runs import speech_run

    wrong = f"{USER_MASPO},{methods.MASPO_KEY}.codec.layout=llasa-1b"
    with pytest.raises(
        methods.MethodError, match=r"--method 'mine': .*codec.layout='llasa-1b', but the model .*'mini-llasa'"
    ):
        speech_run.TASK.method(wrong)
    same = f"{USER_MASPO},{methods.MASPO_KEY}.codec.layout=mini-llasa"
    assert speech_run.TASK.method(same).settings.maspo.codec.layout == "mini-llasa"


def test_a_task_file_naming_no_method_or_a_bare_key_is_rejected(tmp_path, monkeypatch):
    (tmp_path / "odd.yaml").write_text("maspo-fixed7:\n  - a.b=1\n")
    monkeypatch.setattr(methods, "TASK_GROUP", tmp_path)
    with pytest.raises(methods.MethodError, match=r"\['maspo-fixed7'\] are not methods"):
        methods.task_refinements("odd")
    with pytest.raises(methods.MethodError, match="no task 'nope'"):
        methods.task_refinements("nope")
    (tmp_path / "bare.yaml").write_text("maspo-fsq:\n  - a.b=1\n  - threshold\n")
    with pytest.raises(
        methods.MethodError,
        match=r"bare.yaml: every refinement must be key=value, got \{'maspo-fsq': \['threshold'\]\}",
    ):
        methods.task_refinements("bare")


def test_values_hydra_would_misread_are_quoted():
    assert methods.as_overrides({"a": {"b": "x, y", "c": None, "d": True, "e": 3e-4}}) == (
        "++a.b='x, y'",
        "++a.c=null",
        "++a.d=true",
        "++a.e=0.0003",
    )
    with pytest.raises(methods.MethodError, match="no method 'nosuch'"):
        methods.method_config("nosuch")


def test_a_method_is_typed_once_from_its_config():
    """`Method.settings`: the loss, its clip, MASPO's and credit's settings as the plugin builds them."""
    gspo = methods.BUILTIN_METHODS["gspo"].settings
    assert (gspo.loss_mode, gspo.maspo, gspo.credit) == ("gspo", None, None)
    assert gspo.clip == {"clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4}
    credit = methods.BUILTIN_METHODS["maspo-credit"].settings
    assert (credit.loss_mode, credit.adv_estimator) == ("maspo", "maspo")
    assert (
        credit.credit.credit_weight
        == methods.BUILTIN_METHODS["maspo-credit"].config["algorithm"]["maspo"]["credit_weight"]
    )
    fsq = methods.BUILTIN_METHODS["maspo-fsq"].settings.maspo
    assert (fsq.segmenter.name, fsq.segmenter.params.threshold) == ("fsq", 2)
    with pytest.raises(methods.MethodError, match="'bad'.*window"):
        methods.MethodSettings.of(
            methods.parse_method(f"bad:{methods.ACTOR}.policy_loss.loss_mode=maspo,{SEGMENTER}.window=0")
        )


def test_gmpo_is_verls_geo_mean_clipping_each_token_in_log_space():
    """``gmpo`` runs veRL's ``geo_mean`` with the paper's range: token log-ratios clipped to (-0.4, 0.4), by hand.

    One response, d = [0.6, -0.1, -0.5]: for A = +1 only the 0.6 is held (at 0.4), so the ratio is
    exp((0.4 - 0.1 - 0.5) / 3); for A = -1 only the -0.5 is held (at -0.4): exp((0.6 - 0.1 - 0.4) / 3).
    """
    import math

    import torch
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.workers.config import ActorConfig, PolicyLossConfig

    gmpo = methods.BUILTIN_METHODS["gmpo"].settings
    assert (gmpo.loss_mode, gmpo.maspo, gmpo.credit) == ("geo_mean", None, None)
    policy_loss = PolicyLossConfig(loss_mode=gmpo.loss_mode)
    config = ActorConfig(
        strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, policy_loss=policy_loss, **gmpo.clip
    )
    old = torch.tensor([[-1.0, -2.0, -0.5]], dtype=torch.float64)
    new = old + torch.tensor([[0.6, -0.1, -0.5]], dtype=torch.float64)
    for advantage, kept in ((1.0, -0.2), (-1.0, 0.1)):
        loss, _ = get_policy_loss_fn(gmpo.loss_mode)(
            old, new, torch.full_like(old, advantage), torch.ones_like(old), config=config
        )
        assert loss.item() == pytest.approx(-advantage * math.exp(kept / 3), rel=1e-7), advantage


def test_p_gspo_is_one_segment_per_response_at_every_configured_length():
    """``p-gspo``: MASPO with one fixed window longer than any response a recipe or scale allows, the ratio's
    length exponent 0.5, a fixed range and no dual clip (its loss against the written-out objective:
    tests/test_loss_equivalence.py)."""
    import yaml

    config_root = METHOD_FILES[0].parents[1]
    recipe = config_root.parents[1] / "recipes" / "llasa_1b" / "llasa_1b.yaml"
    configs = [recipe, *(config_root / "scale").glob("*.yaml")]
    lengths = [yaml.safe_load(path.read_text())["data"]["max_response_length"] for path in configs]
    p_gspo = methods.BUILTIN_METHODS["p-gspo"].settings.maspo
    assert (p_gspo.segmenter.name, p_gspo.ratio_length_exponent) == ("fixed", 0.5)
    assert p_gspo.segmenter.params.window >= max(lengths) >= 1500
    assert (p_gspo.clip_length_exponent, p_gspo.clip_ratio_c) == (0.0, None)


TASK_FILES = METHOD_FILES[0].parents[1] / "task"


def file_config(name: str) -> dict:
    """What a method's file sets, read from the files alone: its ``defaults`` merged in their order, ``_self_``
    where it stands."""
    import yaml

    own = yaml.safe_load((METHOD_FILES[0].parent / f"{name}.yaml").read_text()) or {}
    merged = OmegaConf.create()
    for part in own.pop("defaults", ["_self_"]):
        merged = OmegaConf.merge(merged, own if part == "_self_" else file_config(part))
    return OmegaConf.to_container(merged)


def file_overrides(config: dict, prefix: str = "") -> list[str]:
    """``++dotted.key=value`` per leaf, as YAML writes the value."""
    out = []
    for key, value in config.items():
        if isinstance(value, dict):
            out += file_overrides(value, f"{prefix}{key}.")
        else:
            written = "null" if value is None else str(value).lower() if isinstance(value, bool) else value
            out.append(f"++{prefix}{key}={written}")
    return out


def on_task_from_files(name: str, task: str) -> tuple[list[str], list[str]]:
    """Built-in ``name`` as ``task`` runs it, from the files alone: the method's file, then the task file's list for
    it, then the layout the task's model declares (the speech task's shipped mini-llasa; the tiny Llasa none) in the
    loss's codec block (a MASPO loss) and credit's (the maspo estimator); and the task's refinement alone."""
    import json

    import yaml

    from maspo_lab.speaking_model import SHIPPED_MODEL

    refinement = OmegaConf.from_dotlist((yaml.safe_load((TASK_FILES / f"{task}.yaml").read_text()) or {}).get(name, []))
    config = OmegaConf.merge(file_config(name), refinement)
    layout = json.loads((SHIPPED_MODEL / "speech_tokens.json").read_text())["layout"] if task == "speech" else None
    if layout and OmegaConf.select(config, f"{methods.ACTOR}.policy_loss.loss_mode") == "maspo":
        OmegaConf.update(config, f"{methods.MASPO_KEY}.codec.layout", layout, force_add=True)
    if layout and (
        OmegaConf.select(config, "algorithm.adv_estimator") == "maspo" or "maspo" in config.get("algorithm", {})
    ):
        OmegaConf.update(config, "algorithm.maspo.codec.layout", layout, force_add=True)
    return file_overrides(OmegaConf.to_container(config)), file_overrides(OmegaConf.to_container(refinement))


@pytest.mark.parametrize("task", ["speech", "synthetic"])
def test_every_builtin_method_renders_on_each_task_what_its_files_say(task):
    """The overrides each built-in method gives a run of each task (ablate, demo), and those the recipe adds to
    ``method=NAME`` for the task (`task_refinement_overrides`), are what the method, task and model files say, in
    order."""
    from maspo_lab.runs.tasks import task_named

    for name in methods.BUILTIN_METHODS:
        whole, refinement = on_task_from_files(name, task)
        assert list(task_named(task).method(name).overrides) == whole, name
        assert list(methods.task_refinement_overrides(name, task)) == refinement, name
