"""A Jupyter project's habits, checked on the source: one version everywhere it is written,
the license, the typing marker, and the changelog."""

from __future__ import annotations

import tomllib
from pathlib import Path

import gpuspawner

REPO = Path(__file__).resolve().parents[2]


def test_the_package_chart_and_lab_extension_carry_one_version():
    # tbump.toml lists every file that holds the version; tbump rewrites them together.
    config = tomllib.loads((REPO / "tbump.toml").read_text())
    current = config["version"]["current"]
    assert gpuspawner.__version__ == current
    missing = [
        f"{f['src']}: {f['search'].format(current_version=current)!r}"
        for f in config["file"]
        if f["search"].format(current_version=current) not in (REPO / f["src"]).read_text()
    ]
    assert missing == [], "these files do not hold the version tbump.toml says; run tbump"
    named = {f["src"] for f in config["file"]}
    assert {"gpuspawner/__init__.py", "charts/gpuspawner/Chart.yaml", "ui/labextension/package.json"} <= named


def test_license_typing_marker_and_changelog_are_there():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["project"]["license"] == "BSD-3-Clause"
    assert (REPO / "LICENSE").read_text().startswith("BSD 3-Clause License")
    assert (REPO / "gpuspawner" / "py.typed").exists()  # PEP 561: the package's annotations are for its users too
    assert "## Unreleased" in (REPO / "CHANGELOG.md").read_text()
    assert "Typing :: Typed" in pyproject["project"]["classifiers"]
