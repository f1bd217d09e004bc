"""One name per module: no two modules of gpuspawner share a basename (issue 40), so a name in
a traceback, a log line, a doc or a grep points at one file. ``__init__`` and ``__main__`` are
Python's own names and do not count."""

from __future__ import annotations

from collections import defaultdict

from tests.unit.test_layer_contracts import PACKAGE


def test_no_two_modules_of_gpuspawner_share_a_basename() -> None:
    where: defaultdict[str, list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.stem not in ("__init__", "__main__"):
            where[path.stem].append(str(path.relative_to(PACKAGE)))
    repeated = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not repeated, f"modules that share a name (rename one, docs/architecture.md): {repeated}"
