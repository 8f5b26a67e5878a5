"""The packages stay readable in pieces: no function over 80 lines, no module over 600 (docs/layout.md)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("maspo_base", "reward_fns", "maspo_verl", "maspo_lab")
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 600


def oversized(root: Path = ROOT) -> list[str]:
    """``path: what`` for every module and function of the packages over its limit."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            source = path.read_text()
            name = path.relative_to(root)
            if len(source.splitlines()) > MAX_MODULE_LINES:
                found.append(f"{name}: {len(source.splitlines())} lines")
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        found.append(f"{name}: {node.name} {lines} lines")
    return found


def test_the_check_sees_a_long_function_and_a_long_module(tmp_path):
    for name in PACKAGES:
        (tmp_path / name).mkdir()
    package = tmp_path / "maspo_verl"
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (package / "long.py").write_text(f"def long():\n{body}\n" + "\n" * MAX_MODULE_LINES)
    assert oversized(tmp_path) == [
        f"maspo_verl/long.py: {MAX_MODULE_LINES + MAX_FUNCTION_LINES + 1} lines",
        f"maspo_verl/long.py: long {MAX_FUNCTION_LINES + 1} lines",
    ]


def test_no_function_over_80_lines_and_no_module_over_600():
    assert oversized() == []
