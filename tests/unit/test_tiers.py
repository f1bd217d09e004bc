"""Every folder of tests belongs to one tier of the Makefile (README: the tiers), so a new folder
cannot run only in `make test` and in no tier of its own, or in two."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def variable(makefile: str, name: str) -> list[str]:
    match = re.search(rf"^{name} := (.*)$", makefile, re.M)
    assert match, f"the Makefile has no {name}"
    return match.group(1).split()


def test_each_test_folder_is_in_exactly_one_tier():
    makefile = (REPO / "Makefile").read_text()
    tiers = {
        "test-fast": ["tests/unit"],
        "test-hub": variable(makefile, "HUB_TIER"),
        "test-cluster": ["tests/integration"],
        "test-stories": variable(makefile, "STORIES"),
        "test-kueue": variable(makefile, "APART"),
    }
    for target in tiers:
        assert re.search(rf"^{target}:", makefile, re.M), f"no make target {target}"
    placed = [folder for folders in tiers.values() for folder in folders]
    assert len(placed) == len(set(placed)), f"a folder in two tiers: {placed}"
    folders = sorted(f"tests/{d.name}" for d in (REPO / "tests").iterdir() if d.is_dir() and any(d.glob("test_*.py")))
    assert sorted(placed) == folders
