"""`maspo_verl.methods` reads the method config group: the same methods, composing to the same configs."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import maspo_verl.trainer_config
from maspo_verl import methods

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


def test_the_methods_are_the_files_of_the_group():
    assert set(methods.BUILTIN_METHODS) == {p.stem for p in METHOD_FILES if not p.stem.startswith("_")}
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


def test_the_maspo_part_and_a_segmenter_are_maspo_fsq():
    fsq = methods.maspo_overrides("fsq", {"metric": "l1", "threshold": 2})
    assert methods.compose_config(fsq) == methods.compose_config(methods.BUILTIN_METHODS["maspo-fsq"].overrides)


def test_values_hydra_would_misread_are_quoted():
    assert methods.as_overrides({"a": {"b": "x, y", "c": None, "d": True, "e": 3e-4}}) == (
        "++a.b='x, y'",
        "++a.c=null",
        "++a.d=true",
        "++a.e=0.0003",
    )
    with pytest.raises(methods.MethodError, match="no method 'nosuch'"):
        methods.method_config("nosuch")
