"""docs/architecture.md's map is the package as it is: its table of folders names every folder
and module of gpuspawner (and the culler's table every module of the culler), in the order of
the layers contract, and the callbacks it names are the seam's. A module added, moved or
removed without the map fails here, named."""

from __future__ import annotations

import inspect
import re
import typing

from gpuspawner.hub import seam
from tests.unit.test_layer_contracts import PACKAGE, layered, modules

DOC = PACKAGE.parent / "docs" / "architecture.md"


def table(after: str) -> list[list[str]]:
    """The rows of the first Markdown table after the line that starts with ``after``, as cells."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith(after))
    rows = []
    for line in lines[start + 1 :]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
        elif rows:
            break
    return rows[2:]  # (past the header and its rule)


def names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def folders() -> dict[str, list[str]]:
    """The folders table: ``tools`` (or ``spawner``) -> the modules it lists."""
    out = {}
    for row in table("From top to bottom"):
        (folder,) = names(row[0])
        out[folder.removesuffix("/").removesuffix(".py")] = names(row[-1])
    return out


def test_the_folders_table_names_every_folder_top_to_bottom() -> None:
    assert list(folders()) == layered("layers")


def test_the_folders_table_names_every_module_of_each_folder() -> None:
    for folder, listed in folders().items():
        if folder == "culler":
            continue  # (its own table, below)
        path = PACKAGE / folder
        real = modules(path) if path.is_dir() else {folder}
        assert sorted(listed) == listed, f"{folder}/: not in alphabetical order"
        assert set(listed) == real, f"{folder}/: the table lists {sorted(set(listed) - real)}, misses {sorted(real - set(listed))}"


def test_the_cullers_table_names_every_module_of_the_culler_in_its_layers() -> None:
    rows = [names(row[0]) for row in table("The culler (`gpuspawner/culler/`) is built the same way")]
    assert [m for row in rows for m in row] == [m for m in layered("culler-layers") if m != "__main__"]


def test_the_callbacks_the_doc_names_are_the_seams() -> None:
    callbacks = {
        name
        for name in typing._get_protocol_attrs(seam.Spawner)  # type: ignore[attr-defined]
        if inspect.isfunction(inspect.getattr_static(seam.Spawner, name, None))
    }
    text = DOC.read_text(encoding="utf-8")
    said = re.search(r"The hub calls back up for (\w+) things only", text)
    assert said is not None and said.group(1) == {1: "one", 2: "two", 3: "three"}[len(callbacks)]
    for name in callbacks:
        assert f"- `{name}(" in text


def test_every_module_over_450_lines_says_why_in_the_doc() -> None:
    listed = {name for row in table("A module stays under 450 lines") for name in names(row[0])}
    long = {str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py") if len(path.read_text(encoding="utf-8").splitlines()) > 450}
    assert long <= listed, f"over 450 lines without a word in docs/architecture.md: {sorted(long - listed)}"
    assert all((PACKAGE / name).exists() for name in listed)
