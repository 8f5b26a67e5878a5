"""Every veRL function the plugin wraps still exists, with the parameters its wrapper expects, and is wrapped.

A veRL upgrade that renames, moves or reshapes a target fails here, naming it, instead of training silently
without MASPO's inputs. `VERL_VERSION` says which release the list was last checked against."""

from __future__ import annotations

import importlib
import inspect

import pytest
import verl

from maspo_verl.verl_patches import CPU_TARGETS, PATCHES, VERL_VERSION, WRAPPED, resolve


def test_the_list_was_checked_against_the_installed_verl():
    assert verl.__version__ == VERL_VERSION, (
        f"veRL {verl.__version__} is installed, maspo_verl.verl_patches was checked against {VERL_VERSION}: check "
        "each target's code (what the wrapper assumes, not only its signature), then update VERL_VERSION"
    )


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: f"{p.module}.{p.attribute}")
def test_target_exists_with_the_expected_parameters(patch):
    module = importlib.import_module(patch.module)
    _, _, target = resolve(module, patch.attribute)
    checked = getattr(target, patch.checked) if patch.checked else target
    parameters = tuple(inspect.signature(checked).parameters)  # through functools.wraps: the original's
    assert parameters == patch.parameters, f"{patch.module}.{patch.attribute}: {parameters} != {patch.parameters}"
    assert getattr(target, WRAPPED, False), f"{patch.module}.{patch.attribute} is not wrapped"
    assert patch.reason


@pytest.mark.parametrize("target", CPU_TARGETS, ids=lambda t: f"{t.module}.{t.attribute}")
def test_cpu_glue_target_exists_with_the_expected_parameters(target):
    _, _, function = resolve(importlib.import_module(target.module), target.attribute)
    parameters = tuple(inspect.signature(function).parameters)  # the original's, wrapped or not
    assert parameters == target.parameters, f"{target.module}.{target.attribute}: {parameters} != {target.parameters}"
    importlib.import_module(target.installed_by)
    assert target.reason


def test_a_name_bound_in_several_modules_is_wrapped_once():
    """``from x import f`` copies f into each module: all of them hold the same wrapper, wrapped once (one wrap
    function may also serve several distinct targets, e.g. both trainers' ``_dump_generations``)."""
    by_original: dict[int, list] = {}
    for patch in PATCHES:
        wrapper = resolve(importlib.import_module(patch.module), patch.attribute)[2]
        inner = wrapper.__wrapped__ if hasattr(wrapper, "__wrapped__") else wrapper.__mro__[1]  # a subclass: its base
        assert not getattr(inner, WRAPPED, False), patch.attribute
        by_original.setdefault(id(inner), []).append(wrapper)
    for wrappers in by_original.values():
        assert all(wrapper is wrappers[0] for wrapper in wrappers)
    assert len(by_original) < len(PATCHES)  # some names are bound in several modules
