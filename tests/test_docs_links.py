"""The docs name only what exists: every relative link and every backticked repository path in the README, the
pages under ``docs/`` and the recipes' READMEs resolves to a file or folder of this checkout, and a link's
``#anchor`` into a markdown page to one of its headings (GitHub's slugs: lower case, punctuation dropped, spaces as
``-``, a repeated heading's slug numbered ``-1``, ``-2`` ...).

A path is a backticked token that starts with one of the repository's top-level folders (``maspo_verl/``,
``tests/``, ...) or is a root file such as ``pyproject.toml``; ``*`` and ``<PLACEHOLDER>`` match as globs and
``path::test_name`` is checked as ``path``. Fenced code blocks are commands, not references, and are skipped.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PATH_PREFIXES = (
    "maspo_verl/",
    "reward_fns/",
    "recipes/",
    "tests/",
    "benchmarks/",
    "docs/",
    "scripts/",
    ".ci/",
)
ROOT_FILE = re.compile(r"^(?:[\w.-]+\.(?:toml|cfg|ini|lock)|README\.md|LICENSE|CITATION\.cff|\.gitignore)$")
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, pkg:, ...


def documentation_files(root: Path) -> list[Path]:
    return [
        *(p for p in [root / "README.md"] if p.exists()),
        *sorted((root / "docs").rglob("*.md")),
        *sorted(root.glob("recipes/*/README.md")),
    ]


def _exists(root: Path, path: str) -> bool:
    pattern = re.sub(r"<[^>]*>", "*", path).rstrip("/")
    if any(ch in pattern for ch in "*?["):
        return any(root.glob(pattern))
    return (root / pattern).exists()


def repository_paths(text: str) -> list[str]:
    """Backticked tokens of ``text`` (fenced blocks removed) that name a repository path."""
    paths = []
    for match in CODE_SPAN.finditer(FENCE.sub("", text)):
        for token in match.group(2).split():
            token = token.split("::")[0].strip("\"'()[],;:.")
            if token.startswith("./"):
                token = token[2:]
            if token.startswith(PATH_PREFIXES) or ROOT_FILE.match(token):
                paths.append(token)
    return paths


def link_targets(text: str) -> list[tuple[str, str]]:
    """``(target, anchor)`` of the relative markdown links of ``text`` (fenced blocks removed): the target without
    its query (empty for a link inside the page), the anchor ("" when none)."""
    targets = []
    for match in LINK.finditer(FENCE.sub("", text)):
        target, _, anchor = match.group(1).partition("#")
        target = target.split("?")[0]
        if (target or anchor) and not EXTERNAL.match(target):
            targets.append((target, anchor))
    return targets


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of a markdown page."""
    anchors, seen = set(), {}
    for line in FENCE.sub("", text).splitlines():
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
            anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


def broken_references(root: Path, files: list[Path]) -> list[str]:
    """``file: link -> target`` / ``file: path`` for every reference that does not resolve under ``root``."""
    broken = []
    for file in files:
        text = file.read_text(encoding="utf-8")
        name = file.relative_to(root).as_posix()
        for target, anchor in link_targets(text):
            if not target:
                resolved = file
            elif target.startswith("/"):
                resolved = root / target.lstrip("/")
            else:
                resolved = file.parent / target
            shown = Path(os.path.relpath(os.path.normpath(resolved), root)).as_posix()
            if not resolved.exists():
                broken.append(f"{name}: link ({target}) -> {shown} is missing")
            elif anchor and resolved.suffix == ".md" and anchor not in heading_anchors(resolved.read_text()):
                broken.append(f"{name}: link ({target}#{anchor}) -> {shown} has no heading #{anchor}")
        for path in repository_paths(text):
            if not _exists(root, path):
                broken.append(f"{name}: `{path}` is missing")
    return broken


def test_every_link_and_named_path_in_the_docs_exists():
    files = documentation_files(ROOT)
    assert ROOT / "README.md" in files and len(files) > 3, files
    broken = broken_references(ROOT, files)
    assert not broken, "the docs name files that do not exist:\n" + "\n".join(broken)


def test_the_checker_reports_a_broken_link_and_a_missing_path(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "maspo_verl").mkdir()
    (tmp_path / "maspo_verl" / "loss.py").write_text("")
    (tmp_path / "docs" / "loss.md").write_text(
        "# loss\n\n## Settings: `clip` (L^-0.5)\n\n## Settings: `clip` (L^-0.5)\n"
    )
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "README.md").write_text(
        "See [the loss](docs/loss.md#settings-clip-l-05), [again](docs/loss.md#settings-clip-l-05-1), "
        "[credit](docs/credit.md), [no such part](docs/loss.md#settings) and [veRL](https://github.com/x/y).\n"
        "Code: `maspo_verl/loss.py::test_x`, `maspo_verl/*.py`, `maspo_verl/<NAME>.py`, `pyproject.toml`,\n"
        "`python -m maspo_verl.loss` and `maspo_verl/advantage.py`, `setup.cfg`.\n"
        "```bash\ncat maspo_verl/not_checked_in_a_fence.py  [x](docs/fenced.md)\n```\n"
    )
    (tmp_path / "docs" / "page.md").write_text(
        "# Page\n[back](../README.md), [gone](../recipes/none/README.md), [top](#page), [nowhere](#elsewhere)\n"
    )

    broken = broken_references(tmp_path, documentation_files(tmp_path))

    assert broken == [
        "README.md: link (docs/credit.md) -> docs/credit.md is missing",
        "README.md: link (docs/loss.md#settings) -> docs/loss.md has no heading #settings",
        "README.md: `maspo_verl/advantage.py` is missing",
        "README.md: `setup.cfg` is missing",
        "docs/page.md: link (../recipes/none/README.md) -> recipes/none/README.md is missing",
        "docs/page.md: link (#elsewhere) -> docs/page.md has no heading #elsewhere",
    ]
