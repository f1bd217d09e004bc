"""Names that cross a module boundary are defined once, in gpuspawner/names/vocabulary.py.

A label, annotation or environment name spelled a second time drifts (the offering label
once had two names); this test finds any string literal in the package that repeats one
of them. Tests may spell them out: they check the wire format.
"""

from __future__ import annotations

import ast
from pathlib import Path

from gpuspawner.hub.scheduling import REFUSAL_STATUS, SpawnRefused
from gpuspawner.names import vocabulary
from gpuspawner.names.vocabulary import AdmissionPolicy, Kind, Refusal

PACKAGE = Path(vocabulary.__file__).resolve().parents[1]  # gpuspawner/, every folder of it
#: The names whose literal value means nothing else anywhere in the package.
DISTINCT = (
    "LABEL_OFFERING",
    "LABEL_KIND",
    "ENV_OFFERING",
    "ENV_KIND",
    "ENV_COUNT",
    "ENV_DISPLAY_NAME",
    "ENV_WORDS",
    "KUBESPAWNER_USER_LABEL",
    "KUBESPAWNER_SERVER_ANNOTATION",
    "COUNT_FIELD_PREFIX",
)


def string_literals(path: Path) -> set[str]:
    """Every string constant of a module that is not a docstring."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    }


def test_each_boundary_name_is_spelled_only_in_the_vocabulary():
    values = {getattr(vocabulary, name): name for name in DISTINCT}
    repeated = [
        f"{path.relative_to(PACKAGE.parent)} spells {values[text]} ({text!r}): import it from gpuspawner.names.vocabulary"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != Path(vocabulary.__file__).resolve()
        for text in sorted(string_literals(path) & set(values))
    ]
    assert repeated == []


def test_the_wire_format_of_the_names():
    # What pods, the hub's database and the culler already carry: renaming any is a migration.
    assert [k.value for k in Kind] == ["cpu", "shared", "mig", "full", "vgpu", "custom"]
    assert [p.value for p in AdmissionPolicy] == ["block", "warn", "queue"]
    assert (vocabulary.OFFERING_KEY, vocabulary.COUNT_KEY, vocabulary.RECORD_KEY) == ("offering", "count", "gpuspawner")
    assert (vocabulary.LABEL_OFFERING, vocabulary.LABEL_KIND) == ("gpuspawner.io/offering", "gpuspawner.io/kind")
    assert (vocabulary.ENV_OFFERING, vocabulary.ENV_KIND, vocabulary.ENV_COUNT) == (
        "GPUSPAWNER_OFFERING",
        "GPUSPAWNER_KIND",
        "GPUSPAWNER_GPU_COUNT",
    )
    assert (vocabulary.ENV_DISPLAY_NAME, vocabulary.ENV_WORDS) == ("GPUSPAWNER_DISPLAY_NAME", "GPUSPAWNER_OFFERING_WORDS")
    assert f"{Kind.MIG}" == "mig"  # written into labels, JSON and metrics as its plain value


def test_every_refusal_reason_has_its_status():
    # The REST API's answer for each reason (docs/api.md): the statuses are the wire format.
    assert {str(r): REFUSAL_STATUS[r] for r in Refusal} == {
        "malformed": 400,
        "not_offered": 403,
        "window": 403,
        "no_capacity": 409,
        "queue_timeout": 409,
        "unschedulable": 409,
        "image": 409,
        "pod_name_taken": 409,
        "quota": 429,
        "budget": 429,
        "unreachable": 503,
        "misconfigured": 503,
        "start_timeout": 503,
    }
    assert SpawnRefused("x", Refusal.QUOTA).status_code == 429
    assert SpawnRefused("x").reason == Refusal.NO_CAPACITY  # nothing free now, unless said otherwise


def test_no_refusal_reason_is_a_string_literal_at_a_call_site():
    # SpawnRefused(message, reason) and ChoiceError(reason, ...) take a vocabulary.Refusal.
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "SpawnRefused":
                reasons = node.args[1:2] + [k.value for k in node.keywords if k.arg == "reason"]
                found += [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}" for r in reasons if isinstance(r, ast.Constant)]
    assert found == []


# ---------------------------------------------------------------- NVIDIA's names, the quantity parser, pods per GPU
# (issue #26, "One fact, one place").

from gpuspawner.names import dranames, nvidia  # noqa: E402 - this block's own imports

GPUSPAWNER = PACKAGE
NVIDIA_NAMES = ("PLUGIN_PREFIX", "GPU", "GPU_SHARED", "MIG_PREFIX", "PRODUCT_LABEL", "REPLICAS_LABEL", "SHARING_LABEL", "MEMORY_LABEL")


def test_nvidias_resource_names_and_labels_are_spelled_only_in_names_nvidia():
    values = {getattr(nvidia, name): name for name in NVIDIA_NAMES}
    home = Path(nvidia.__file__).resolve()
    repeated = [
        f"{path.relative_to(GPUSPAWNER.parent)} spells {values[text]} ({text!r}): import it from gpuspawner.names.nvidia"
        for path in sorted(GPUSPAWNER.rglob("*.py"))
        if path != home
        for text in sorted(string_literals(path) & set(values))
    ]
    assert repeated == []


def test_nvidias_names_are_the_device_plugins_and_the_dra_drivers_own():
    assert (nvidia.GPU, nvidia.GPU_SHARED, nvidia.MIG_PREFIX) == ("nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-")
    assert nvidia.REPLICAS_LABEL == "nvidia.com/gpu.replicas" and nvidia.PRODUCT_LABEL == "nvidia.com/gpu.product"
    assert dranames.EXTENDED_RESOURCE == nvidia.GPU  # the DRA gpu class maps to the device plugin's name
    assert all(n.startswith(nvidia.PLUGIN_PREFIX) for n in (nvidia.GPU, nvidia.GPU_SHARED, nvidia.MIG_PREFIX))
    assert [
        nvidia.is_device_resource(n) for n in ("nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb", "nvidia.com/vgpu")
    ] == [
        True,
        True,
        True,
        False,
    ]


def test_pods_per_gpu_have_one_name_replicas_as_nvidias_sharing_config_and_the_offering_key():
    from dataclasses import fields

    from gpuspawner.core.model import DeviceClaim, Offering

    for cls in (Offering, DeviceClaim):
        names = {f.name for f in fields(cls)}
        assert "replicas" in names and not names & {"share_count", "shares"}, cls.__name__
