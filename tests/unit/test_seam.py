"""The seam between GPUSpawner and gpuspawner/hub (gpuspawner.hub.seam.Spawner) holds.

mypy checks that the hub uses nothing of the spawner the seam does not name; it cannot check
that GPUSpawner has what the seam names (KubeSpawner is untyped, and a class with an untyped
base passes any protocol). These tests do: every member is there, each setting is a trait of
the type the seam says, and no module of gpuspawner takes the spawner as ``Any``.
"""

from __future__ import annotations

import inspect
import pathlib
import re
import typing

from traitlets import Bool, Dict, Float, Integer, List, Unicode

from gpuspawner.hub import seam
from gpuspawner.spawner import GPUSpawner

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "gpuspawner"

#: The seam's instance attributes, set on each spawner (by JupyterHub, KubeSpawner or its __init__), not on the class.
ON_THE_INSTANCE = {"user", "name", "pod_name", "orm_spawner", "server", "api", "pod_reflector", "spawn_state", "refused_options"}

TRAIT_TYPES = {"str": Unicode, "bool": Bool, "int": Integer, "float": Float, "dict": Dict, "list": List}


def members() -> set[str]:
    return set(typing._get_protocol_attrs(seam.Spawner))  # type: ignore[attr-defined]  # (3.11: no public list)


def test_gpuspawner_has_every_member_the_seam_names() -> None:
    missing = {name for name in members() - ON_THE_INSTANCE if not hasattr(GPUSpawner, name)}
    assert not missing


def test_the_seams_settings_are_traits_of_the_type_it_says() -> None:
    checked = 0
    for name in sorted(members()):
        declared = inspect.getattr_static(seam.Spawner, name, None)
        trait = GPUSpawner.class_traits().get(name)
        if not isinstance(declared, property) or trait is None:
            continue
        returns = declared.fget.__annotations__["return"]  # (a string: the seam's annotations are postponed)
        origin = re.match(r"\w+", returns).group()
        if origin in TRAIT_TYPES:
            assert isinstance(trait, TRAIT_TYPES[origin]), f"{name}: a {type(trait).__name__}, the seam says {returns}"
            checked += 1
    assert checked >= 25  # (the settings the hub reads)


def test_the_two_callbacks_are_the_only_methods_the_seam_names() -> None:
    methods = {
        name for name in members() if inspect.isfunction(inspect.getattr_static(seam.Spawner, name, None)) and not name.startswith("_")
    }
    assert methods == {"now", "stop"}


def test_no_module_takes_the_spawner_as_any() -> None:
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{n}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"\bspawner: Any\b", line)
    ]
    assert not found
