"""The digest of the JupyterLab extension's sources, kept beside its committed build.

The built extension (gpuspawner/notebook_ext/labextension) is made by the build backend
(scripts/build_labextension.py, on install and wheel builds) once per checkout, and this
digest is written into ``source.sha256`` there; tests/notebook_ext/test_labextension.py
recomputes it, so a change to ui/labextension that was not rebuilt fails the tests, naming
the command (`make labextension`).

    python scripts/labextension_stamp.py          # print the digest
    python scripts/labextension_stamp.py --write  # write it beside the build
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "ui" / "labextension"
STAMP = REPO / "gpuspawner" / "notebook_ext" / "labextension" / "source.sha256"
#: What the build reads (not node_modules, lib or the lock file's resolution noise).
INPUTS = ("package.json", "tsconfig.json", "src", "style")


def digest() -> str:
    h = hashlib.sha256()
    for name in INPUTS:
        path = SOURCE / name
        for file in sorted([path] if path.is_file() else path.rglob("*")):
            if file.is_file():
                h.update(file.relative_to(SOURCE).as_posix().encode() + b"\0" + file.read_bytes() + b"\0")
    return h.hexdigest()


def write() -> None:
    STAMP.write_text(digest() + "\n")


if __name__ == "__main__":
    if "--write" in sys.argv[1:]:
        write()
    print(digest())
