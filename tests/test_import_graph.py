"""The project's modules import each other without a circle (function-level imports count too).

A circle through lazy imports still couples its modules and makes import order matter: the one that ran through
config -> plugin -> loss -> config made ``import maspo_verl.config`` in a fresh interpreter fail the plugin."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("maspo_base", "reward_fns", "maspo_verl", "maspo_lab")
ROOMS = {
    "maspo_base": set(),
    "reward_fns": {"maspo_base"},
    "maspo_verl": {"maspo_base"},
    "maspo_lab": {"maspo_base", "reward_fns", "maspo_verl"},
}
"""Which rooms a room may import (docs/layout.md): the lab uses everything, the plugin and the reward only the base,
the base nothing of the project."""


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """``module -> the project's modules it imports`` (every import statement, at any depth of the file)."""
    files = {module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets.add(base)
                targets.update(f"{base}.{alias.name}" for alias in node.names)
        graph[name] = {t for t in targets if t in files and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_graph_sees_the_imports_it_should():
    graph = import_graph()
    assert "maspo_verl.config" in graph["maspo_verl.loss"]
    assert "maspo_verl.verl_patches" in graph["maspo_verl.verl_plugin"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_among_the_project_modules():
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle)


def test_config_imports_no_plugin():
    graph = import_graph()
    assert not graph["maspo_verl.config"] & {"maspo_verl.verl_plugin", "maspo_verl.loss", "maspo_verl.advantage"}


def crossings(graph: dict[str, set[str]]) -> set[str]:
    """``module -> target`` for every import from one room into a room it may not import."""
    return {
        f"{name} -> {target}"
        for name, targets in graph.items()
        for target in targets
        if (room := name.split(".")[0]) != (other := target.split(".")[0]) and other not in ROOMS[room]
    }


def test_rooms_import_only_downward():
    """Lab -> plugin and reward -> base, never back and never plugin <-> reward (docs/layout.md)."""
    graph = import_graph()
    assert "reward_fns.score_record" in graph["reward_fns.pipeline"]
    assert "maspo_base.codecs" in graph["maspo_verl.listening"]  # the graph sees every room
    assert "maspo_verl.loss" in graph["maspo_lab.analysis.policy_gradients"]
    assert crossings({"maspo_base.a": {"reward_fns.b"}, "maspo_lab.c": {"maspo_verl.d"}}) == {
        "maspo_base.a -> reward_fns.b"
    }
    assert not crossings(graph), sorted(crossings(graph))


def test_only_the_cli_imports_a_command():
    """A command is an entry point: what two commands share lives outside ``maspo_lab.commands``."""
    graph = import_graph()
    commands = {name for name in graph if name.startswith("maspo_lab.commands.")}
    importers = {name: sorted(graph[name] & commands) for name in graph if name != "maspo_lab.cli"}
    assert {name: found for name, found in importers.items() if found} == {}
