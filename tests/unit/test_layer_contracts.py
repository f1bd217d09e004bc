"""The import-linter contracts of pyproject.toml are exhaustive: every package and module of
gpuspawner is placed in the layers (docs/architecture.md, "Layers"), and every module of the
hub and of the culler in their own. A new one that is in no layer is checked by no contract
(import-linter passes what it is not told about), so it fails here, named, until it is placed.
"""

from __future__ import annotations

import pathlib
import tomllib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "gpuspawner"
PYPROJECT = PACKAGE.parent / "pyproject.toml"


def contract(contract_id: str) -> dict:
    contracts = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["tool"]["importlinter"]["contracts"]
    return next(c for c in contracts if c["id"] == contract_id)


def layered(contract_id: str) -> list[str]:
    """The names in a layers contract, layer by layer (``a | b`` are two)."""
    return [name.strip() for layer in contract(contract_id)["layers"] for name in layer.split("|")]


def modules(folder: pathlib.Path) -> set[str]:
    """The importable packages and modules right inside ``folder`` (not ``__init__``)."""
    found = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    return found | {p.name for p in folder.iterdir() if p.is_dir() and (p / "__init__.py").exists()}


def test_every_package_and_module_of_gpuspawner_is_in_a_layer() -> None:
    """(import-linter checks it too: the contracts are ``exhaustive``; this says it without a lint run.)"""
    assert contract("layers")["containers"] == ["gpuspawner"] and contract("layers")["exhaustive"]
    names = layered("layers")
    assert len(names) == len(set(names))
    assert set(names) == modules(PACKAGE)


def test_every_module_of_the_hub_is_in_one_of_its_layers() -> None:
    assert contract("hub-layers")["containers"] == ["gpuspawner.hub"] and contract("hub-layers")["exhaustive"]
    names = layered("hub-layers")
    assert len(names) == len(set(names))
    assert set(names) == modules(PACKAGE / "hub")


def test_every_module_of_the_culler_is_in_one_of_its_layers() -> None:
    assert contract("culler-layers")["containers"] == ["gpuspawner.culler"] and contract("culler-layers")["exhaustive"]
    names = layered("culler-layers")
    assert len(names) == len(set(names))
    assert set(names) == modules(PACKAGE / "culler")


def test_every_package_but_the_culler_notebook_extension_and_probe_is_kept_out_of_them() -> None:
    """The culler, the notebook's GPU view and the probe read only ``names`` (culler-apart, ...):
    their forbidden lists name every other package of gpuspawner."""
    others = {f"gpuspawner.{name}" for name in modules(PACKAGE)}
    for contract_id, own, allowed in (
        ("culler-apart", "gpuspawner.culler", {"gpuspawner.names", "gpuspawner.devcluster", "gpuspawner.notebook_ext", "gpuspawner.probe"}),
        (
            "notebook-ext-apart",
            "gpuspawner.notebook_ext",
            {"gpuspawner.names", "gpuspawner.devcluster", "gpuspawner.culler", "gpuspawner.probe"},
        ),
        ("probe-apart", "gpuspawner.probe", {"gpuspawner.names", "gpuspawner.devcluster", "gpuspawner.culler", "gpuspawner.notebook_ext"}),
    ):
        forbidden = {m for m in contract(contract_id)["forbidden_modules"] if m.startswith("gpuspawner.")}
        missing = others - forbidden - allowed - {own}
        assert not missing, f"{contract_id}: {sorted(missing)} not forbidden"
