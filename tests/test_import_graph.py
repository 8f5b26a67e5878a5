"""The project's modules import each other without a circle (function-level imports count too).

A circle through lazy imports still couples its modules and makes import order matter: the one that ran through
config -> plugin -> loss -> config made ``import maspo_verl.config`` in a fresh interpreter fail the plugin."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("maspo_verl", "reward_fns")


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


def test_reward_fns_imports_nothing_of_the_plugin():
    """``reward_fns`` is the base speech library; ``maspo_verl`` builds on it, never the other way (docs/layout.md)."""
    graph = import_graph()
    assert "reward_fns.score_record" in graph["reward_fns.pipeline"]  # the graph sees reward_fns' relative imports
    upward = {
        f"{name} -> {target}"
        for name, targets in graph.items()
        if name.startswith("reward_fns")
        for target in targets
        if target.split(".")[0] == "maspo_verl"
    }
    assert not upward, sorted(upward)


def test_only_the_cli_imports_a_command():
    """A command is an entry point: what two commands share lives outside ``maspo_verl.commands``."""
    graph = import_graph()
    commands = {name for name in graph if name.startswith("maspo_verl.commands.")}
    importers = {name: sorted(graph[name] & commands) for name in graph if name != "maspo_verl.cli"}
    assert {name: found for name, found in importers.items() if found} == {}
