"""What docs/architecture.md promises about the repository's parts, checked on the source.

The benchmarks under bench/ run without the test suite: they import nothing from tests/
(a shared harness belongs to the package's dev tools, gpuspawner/devcluster).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: the test suite's own top-level modules, which tests/ puts on sys.path for itself
TEST_MODULES = {p.stem for p in (REPO / "tests").rglob("*.py")} - {"__init__", "conftest"}


def imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_the_benchmarks_import_nothing_from_the_tests():
    wrong = {}
    for path in sorted((REPO / "bench").glob("*.py")):
        text = path.read_text()
        found = {n for n in imported(path) if n.split(".")[0] in TEST_MODULES | {"tests"}}
        if '"tests"' in text or "'tests'" in text:  # e.g. sys.path.insert(0, REPO / "tests" / ...)
            found.add("a path into tests/")
        if found:
            wrong[path.name] = sorted(found)
    assert not wrong, f"bench/ must not import from tests/: {wrong}"
