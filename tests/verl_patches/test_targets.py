"""Every veRL function the plugin wraps still exists, with the parameters its wrapper expects, and is wrapped.

A veRL upgrade that renames, moves or reshapes a target fails here, naming it, instead of training silently
without MASPO's inputs. `VERL_VERSION` says which release the list was last checked against."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import verl

from maspo_verl.verl_patches import CPU_PATCHES, PATCHES, VERL_VERSION, WRAPPED, resolve


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


CPU_PROBE = """
import importlib, inspect, json
import verl  # the plugin, with MASPO_VERL_CPU=1: maspo_verl.cpu.install, CPU_PATCHES installed
from maspo_verl.verl_patches import CPU_PATCHES, WRAPPED, resolve
found = []
for patch in CPU_PATCHES:
    target = resolve(importlib.import_module(patch.module), patch.attribute)[2]
    found.append({
        "parameters": list(inspect.signature(target).parameters),  # through functools.wraps: the original's
        "wrapped": getattr(target, WRAPPED, False),
        "wrapper": target.__code__.co_filename,  # functools.wraps copies names, not the code
        "original": target.__wrapped__.__code__.co_filename,
        "identity": id(target),
    })
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def cpu_patched():
    """What each of `CPU_PATCHES` holds in a fresh process with the CPU switch on (the targets imported after the
    plugin, as a CPU run imports them)."""
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "VERL_ENGINE_DEVICE")}
    out = subprocess.run(
        [sys.executable, "-c", CPU_PROBE],
        env={**env, "MASPO_VERL_CPU": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(zip(CPU_PATCHES, json.loads(out.stdout.splitlines()[-1])))


@pytest.mark.parametrize("patch", CPU_PATCHES, ids=lambda p: f"{p.module}.{p.attribute}")
def test_cpu_patch_target_exists_and_applying_the_table_replaces_it(patch, cpu_patched):
    found = cpu_patched[patch]
    assert tuple(found["parameters"]) == patch.parameters, f"{patch.module}.{patch.attribute}"
    assert found["wrapped"], f"{patch.module}.{patch.attribute} is not wrapped"
    glue = Path(found["wrapper"])
    assert glue.parent.name == "cpu" and glue.parent.parent.name == "maspo_verl", found  # the CPU glue sits there now
    assert "verl" in Path(found["original"]).parts and "maspo_verl" not in found["original"], found  # veRL's own
    assert patch.reason


def test_the_ray_initialiser_bound_in_three_modules_is_one_wrapper(cpu_patched):
    ray_init = [found["identity"] for p, found in cpu_patched.items() if p.attribute.endswith("_ray")]
    assert len(ray_init) == 3 and len(set(ray_init)) == 1


def test_cpu_patches_are_not_installed_without_the_switch():
    for patch in CPU_PATCHES:
        target = resolve(importlib.import_module(patch.module), patch.attribute)[2]
        assert not getattr(target, WRAPPED, False), f"{patch.module}.{patch.attribute}"


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
