"""The built JupyterLab extension (made by the build backend) is the build of the sources in ui/labextension."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILT = REPO / "gpuspawner" / "notebook_ext" / "labextension"


def test_the_build_matches_its_sources():
    stamp = runpy.run_path(str(REPO / "scripts" / "labextension_stamp.py"))
    recorded = (BUILT / "source.sha256").read_text().strip()
    assert recorded == stamp["digest"](), "ui/labextension changed since the last build: run `make labextension`"


def test_the_build_is_a_prebuilt_extension_jupyterlab_can_load():
    meta = json.loads((BUILT / "package.json").read_text())
    assert meta["name"] == "gpuspawner-gpu-view"
    load = meta["jupyterlab"]["_build"]["load"]
    assert (BUILT / load).is_file() and load.startswith("static/remoteEntry.")
    from gpuspawner.notebook_ext import LABEXTENSION

    assert meta["name"] == LABEXTENSION
