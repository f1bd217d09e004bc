"""Build the notebook's GPU view for JupyterLab (ui/labextension) into
gpuspawner/notebook_ext/labextension, and stamp the build with its sources' digest.

Run by the build backend (hatch-jupyter-builder runs `npm run build:prod` in ui/labextension,
after `tsc`), so a wheel or an install from a clean clone holds the prebuilt extension and
the build is never committed. JupyterLab's own builder (@jupyterlab/builder, from npm) is
given the core of the JupyterLab the build environment has (its ``staging`` folder), so
nothing is fetched beyond npm's packages.
"""

from __future__ import annotations

import os
import runpy
import subprocess
from pathlib import Path

import jupyterlab

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "ui" / "labextension"


def main() -> None:
    core = os.path.join(os.path.dirname(jupyterlab.__file__), "staging")
    builder = SOURCE / "node_modules" / "@jupyterlab" / "builder" / "lib" / "build-labextension.js"
    subprocess.check_call(["node", str(builder), "--core-path", core, "."], cwd=SOURCE)
    runpy.run_path(str(REPO / "scripts" / "labextension_stamp.py"))["write"]()


if __name__ == "__main__":
    main()
