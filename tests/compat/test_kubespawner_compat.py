"""Drop-in compatibility, no cluster needed: a site's KubeSpawner config run through
KubeSpawner and through GPUSpawner must give the same user_options, pod manifest,
saved state and spawn page while no GPU offering is in play; with GPU offerings on,
they differ exactly as docs/kubespawner-compat.md says.

Each scenario is checked twice: against KubeSpawner's documented behaviour (for both
classes), and GPUSpawner against KubeSpawner field by field.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubespawner import KubeSpawner

from gpuspawner.hub.inventory import Inventory
from gpuspawner.hub.scheduling import SpawnRefused
from gpuspawner.spawner import GPUSpawner
from tests.compat.harness import (
    DOCUMENTED_DIFFERENCES,
    GPU_OFF,
    GPU_ON_OFFLINE,
    NO_DISRUPT,
    OTHER_IMAGE,
    PROFILE_LIST,
    REMOTE_GPU,
    SITE,
    STAMPS,
    WHOSE,
    Group,
    User,
    differing,
    flat,
    make_spawner,
    manifest_dict,
    site_config,
    undocumented,
)

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.usefixtures("offline")]

REPO = Path(__file__).resolve().parents[2]
CONTAINER = "pod.spec.containers[notebook]"
LARGE = "data-science-large"


def config(gpu: dict[str, Any] | None = None, **kube: Any):
    from tests.compat.conftest import OFFLINE_HOST

    return site_config(gpu, k8s_api_host=OFFLINE_HOST, **kube)


def user_options_from(spawner: Any, source: str, data: dict[str, Any]) -> dict[str, Any]:
    """What JupyterHub stores in user_options for a REST API body, a form POST or a query string."""
    if source == "api":
        return dict(data)
    method = spawner.options_from_form if source == "form" else spawner.options_from_query
    options = method(data)
    assert isinstance(options, dict), f"{type(spawner).__name__}.options_from_{source} returned {type(options).__name__}, not a dict"
    return options


async def spawn_outcome(spawner: Any, source: str, data: dict[str, Any]) -> dict[str, Any]:
    """Everything a spawn decides before the pod is created, flattened."""
    spawner.user_options = user_options_from(spawner, source, data)
    await spawner.load_user_options()
    pod = manifest_dict(spawner, await spawner.get_pod_manifest())
    return {**flat("user_options", spawner.user_options), **flat("pod", pod), **flat("state", spawner.get_state())}


def options_of(outcome: dict[str, Any]) -> dict[str, Any]:
    """The top-level user_options of a flattened outcome."""
    found = {k[len("user_options") :]: v for k, v in outcome.items() if k.startswith(("user_options.", "user_options["))}
    return {k[1:] if k.startswith(".") else k[1:-1]: v for k, v in found.items()}


def _expanded(o: dict[str, Any], user: str = "alice") -> None:
    """Variable expansion, as KubeSpawner documents it for environment, labels, annotations, mounts, names."""
    assert o[f"{CONTAINER}.env[WHO].value"] == user
    assert o[f"{CONTAINER}.env[RAW_WHO].value"] == user
    assert o[f"{CONTAINER}.env[SERVER].value"] == ""
    assert o[f"{CONTAINER}.env[USER_SERVER].value"] == user
    assert o["pod.metadata.labels[team-member]"] == user
    assert o["pod.metadata.annotations[example.org/owner]"] == user
    assert o[f"{CONTAINER}.volumeMounts[scratch].mountPath"] == f"/scratch/{user}"
    assert o["pod.metadata.name"] == o["state.pod_name"] == f"jupyter-{user}"


def _large(image: str, cpus: float) -> Callable[[dict[str, Any]], None]:
    def check(o: dict[str, Any]) -> None:
        assert o[f"{CONTAINER}.image"] == image
        assert o[f"{CONTAINER}.resources.limits[cpu]"] == cpus
        assert o[f"{CONTAINER}.env[SIZE].value"] == "large"  # merged into the site's environment
        assert o[f"{CONTAINER}.env[SITE].value"] == "example"
        assert o["pod.metadata.labels[size]"] == "large"
        assert o["pod.spec.nodeSelector[pool]"] == "large"

    return check


def _small(o: dict[str, Any]) -> None:
    assert o[f"{CONTAINER}.image"] == SITE["image"]
    assert o[f"{CONTAINER}.resources.limits[cpu]"] == 1.0
    assert o[f"{CONTAINER}.resources.limits[memory]"] == 1024**3  # KubeSpawner turns "1G" into bytes
    assert o["pod.spec.nodeSelector[pool]"] == "users"
    assert "pod.metadata.labels[size]" not in o


R_IMAGE = "quay.io/jupyter/r-notebook:2025-11-17"
SCIPY_IMAGE = "quay.io/jupyter/scipy-notebook:2025-11-17"

#: name -> (where user_options come from, the data, the user_options KubeSpawner documents, the pod it documents)
SCENARIOS: dict[str, tuple[str, dict[str, Any], dict[str, Any], Callable[[dict[str, Any]], None]]] = {
    "api-without-options": ("api", {}, {}, _large(R_IMAGE, 2.0)),
    "api-profile": ("api", {"profile": "small"}, {"profile": "small"}, _small),
    "api-profile-options": (
        "api",
        {"profile": LARGE, "image": "scipy", "cpus": "4"},
        {"profile": LARGE, "image": "scipy", "cpus": "4"},
        _large(SCIPY_IMAGE, 4.0),
    ),
    "api-unlisted-choice": (
        "api",
        {"profile": LARGE, "image--unlisted-choice": OTHER_IMAGE},
        {"profile": LARGE, "image--unlisted-choice": OTHER_IMAGE},
        _large(OTHER_IMAGE, 2.0),
    ),
    "form-profile-defaults": ("form", {"profile": [LARGE]}, {"profile": LARGE}, _large(R_IMAGE, 2.0)),
    "form-profile-options": (
        "form",
        {"profile": [LARGE], f"profile-option-{LARGE}--image": ["scipy"], f"profile-option-{LARGE}--cpus": ["4"]},
        {"profile": LARGE, "image": "scipy", "cpus": "4"},
        _large(SCIPY_IMAGE, 4.0),
    ),
    "form-unlisted-choice": (
        "form",
        {
            "profile": [LARGE],
            f"profile-option-{LARGE}--image": ["unlisted-choice"],
            f"profile-option-{LARGE}--image--unlisted-choice": [OTHER_IMAGE],
            f"profile-option-{LARGE}--cpus": ["2"],
        },
        {"profile": LARGE, "image": "unlisted-choice", "image--unlisted-choice": OTHER_IMAGE, "cpus": "2"},
        _large(OTHER_IMAGE, 2.0),
    ),
    "form-other-profile-fields-ignored": (
        "form",
        {"profile": ["small"], f"profile-option-{LARGE}--image": ["scipy"], "colour": ["blue"]},
        {"profile": "small"},
        _small,
    ),
    "form-callable-override": (
        "form",
        {"profile": ["per-user"]},
        {"profile": "per-user"},
        lambda o: o[f"{CONTAINER}.env[HOME_OF].value"] == "alice" or pytest.fail("callable override not applied"),
    ),
    "query-profile": ("query", {"profile": ["small"]}, {"profile": "small"}, _small),
}


# ------------------------------------------------------------------ KubeSpawner's documented behaviour


@pytest.mark.parametrize("cls", [KubeSpawner, GPUSpawner])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_documented_behaviour(cls, scenario):
    source, data, want_options, check_pod = SCENARIOS[scenario]
    outcome = await spawn_outcome(make_spawner(cls, config(GPU_OFF)), source, data)
    assert options_of(outcome) == want_options
    check_pod(outcome)
    _expanded(outcome)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_gpuspawner_without_gpu_offerings_is_kubespawner(scenario):
    source, data, _, _ = SCENARIOS[scenario]
    kube = await spawn_outcome(make_spawner(KubeSpawner, config(GPU_OFF)), source, data)
    gpu = await spawn_outcome(make_spawner(GPUSpawner, config(GPU_OFF)), source, data)
    # Only whose pod it is (docs/kubespawner-compat.md: every pod carries it, so that two hubs in
    # one namespace never delete each other's); this hub (no database here) has no identity label.
    assert differing(kube, gpu) == STAMPS
    assert gpu[WHOSE] == str(User("alice").id)  # (the harness user; no creation time)


async def test_karpenters_do_not_disrupt_is_on_by_default_off_by_the_trait_and_the_admins_value_wins():
    """``block_node_disruption``: every pod carries ``karpenter.sh/do-not-disrupt: "true"``; off,
    the pod is KubeSpawner's but for whose it is; a value the admin set (a duration) is kept."""
    source, data, _, _ = SCENARIOS[next(iter(SCENARIOS))]
    kube = await spawn_outcome(make_spawner(KubeSpawner, config(GPU_OFF)), source, data)
    on = await spawn_outcome(make_spawner(GPUSpawner, config(GPU_OFF)), source, data)
    assert on[NO_DISRUPT] == "true"
    off = await spawn_outcome(make_spawner(GPUSpawner, config({**GPU_OFF, "block_node_disruption": False})), source, data)
    assert differing(kube, off) == sorted(set(STAMPS) - {NO_DISRUPT})
    admin = config(GPU_OFF)
    admin.KubeSpawner.extra_annotations = {"karpenter.sh/do-not-disrupt": "4h"}
    assert (await spawn_outcome(make_spawner(GPUSpawner, admin), source, data))[NO_DISRUPT] == "4h"


@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_gpu_offerings_on_differ_only_as_documented(scenario):
    """The same spawns with a GPU offering configured (and the user taking the default,
    No GPU): only documented additions; and with the GPU offering chosen, the same."""
    source, data, _, check_pod = SCENARIOS[scenario]
    kube = await spawn_outcome(make_spawner(KubeSpawner, config(GPU_OFF)), source, data)
    for choice in ({}, {"offering": "remote-half"} if source == "api" else {"offering": ["remote-half"]}):
        gpu = await spawn_outcome(make_spawner(GPUSpawner, config(GPU_ON_OFFLINE)), source, {**data, **choice})
        diff = differing(kube, gpu)
        assert undocumented(diff, REMOTE_GPU) == [], f"undocumented differences with {choice or 'the default'}"
        check_pod(gpu)  # KubeSpawner's own behaviour still holds
        _expanded(gpu)
        assert gpu["user_options.offering"] == (choice and "remote-half" or "cpu")
        assert gpu["pod.metadata.labels[gpuspawner.io/offering]"] == gpu["user_options.offering"]
        if choice:
            assert gpu[f"{CONTAINER}.args[0]"] == "bitfusion"
            assert gpu["pod.spec.nodeSelector[bitfusion-client]"] == "true"


async def test_docs_list_the_differences():  # (async: the module runs its tests on one loop)
    """docs/kubespawner-compat.md and this suite name the same differences."""
    text = (REPO / "docs" / "kubespawner-compat.md").read_text()
    documented = set(re.findall(r"^\| `([^`]+)` \|", text, flags=re.M))
    assert documented == set(DOCUMENTED_DIFFERENCES)


# ------------------------------------------------------------------ refused input


@pytest.mark.parametrize(
    "options, named",
    [
        ({"profile": "no-such-profile"}, "no-such-profile"),
        ({"profile": LARGE, "image--unlisted-choice": "docker.io/evil:latest"}, "image"),
        ({"profile": "small", "image--unlisted-choice": OTHER_IMAGE}, None),  # small has no options: ignored
    ],
)
@pytest.mark.parametrize("cls", [KubeSpawner, GPUSpawner])
async def test_wrong_profile_choices_are_refused_alike(cls, options, named):
    spawner = make_spawner(cls, config(GPU_OFF))
    spawner.user_options = dict(options)
    if named is None:
        await spawner.load_user_options()
        return
    with pytest.raises(Exception) as refused:
        await spawner.load_user_options()
    assert named in str(refused.value)


@pytest.mark.parametrize("gpu", [GPU_OFF, GPU_ON_OFFLINE], ids=["gpu-off", "gpu-on"])
async def test_user_options_keys_nothing_reads_are_not_kept(gpu):
    """A deliberate difference in both modes (docs/kubespawner-compat.md): KubeSpawner keeps
    any key a REST API spawn sends; GPUSpawner keeps the keys something reads, and a site
    hook's own keys once named in ``extra_user_options``."""
    sent = {"profile": "small", "site-key": "x"}
    kube = make_spawner(KubeSpawner, config(GPU_OFF))
    kube.user_options = dict(sent)
    assert kube.user_options == sent
    spawner = make_spawner(GPUSpawner, config(gpu))
    spawner.user_options = dict(sent)
    assert spawner.user_options == {"profile": "small"}
    declared = make_spawner(GPUSpawner, config({**gpu, "extra_user_options": ["site-key"]}))
    declared.user_options = dict(sent)
    assert declared.user_options == sent


# ------------------------------------------------------------------ signatures, names, state, form


@pytest.mark.parametrize("gpu", [GPU_OFF, GPU_ON_OFFLINE], ids=["gpu-off", "gpu-on"])
async def test_options_from_form_keeps_kubespawners_signature(gpu):
    """A synchronous ``options_from_form(formdata) -> dict``, like KubeSpawner's
    ``_options_from_form``: subclasses, wrappers and options_from_query call it that way."""
    spawner = make_spawner(GPUSpawner, config(gpu))
    kube = make_spawner(KubeSpawner, config(GPU_OFF))
    assert not inspect.iscoroutinefunction(spawner.options_from_form)
    assert not inspect.iscoroutinefunction(type(spawner)._options_from_form)
    assert list(inspect.signature(spawner.options_from_form).parameters) == list(inspect.signature(kube.options_from_form).parameters)
    form = {"profile": ["small"]}
    assert spawner.options_from_form(form) == kube.options_from_form(form) == {"profile": "small"}
    assert spawner.options_from_query(form) == {"profile": "small"}


async def test_a_refused_form_is_refused_at_once_and_again_at_start():
    """The form's choice is checked in options_from_form (so the form comes back with the
    reason whatever the hub's load) and again at start, with the same answer."""
    staff_only = {**REMOTE_GPU, "groups": ["staff"]}
    spawner = make_spawner(GPUSpawner, config({"discover_offerings": False, "offerings": [staff_only]}), User("dan", groups=[]))
    with pytest.raises(SpawnRefused) as refused:
        spawner.options_from_form({"offering": ["remote-half"], "profile": ["small"]})
    assert refused.value.status_code == 403 and "not offered to you" in str(refused.value)
    spawner.user_options = {"offering": "remote-half", "profile": "small"}  # the same, through the REST API
    with pytest.raises(SpawnRefused) as again:
        await spawner.load_user_options()
    assert str(again.value) == str(refused.value)


async def test_the_form_shown_again_keeps_the_refused_choice():
    gpu = {"discover_offerings": False, "offerings": [REMOTE_GPU], "default_offering": "cpu"}
    spawner = make_spawner(GPUSpawner, config(gpu))
    assert re.search(r'value="cpu"[^>]*checked', await spawner.get_options_form())  # the admin's default
    with pytest.raises(SpawnRefused, match="not 3"):  # refused by the form at once
        spawner.options_from_form({"offering": ["remote-half"], "count-remote-half": ["3"]})
    assert re.search(r'value="remote-half"[^>]*checked', await spawner.get_options_form())
    spawner.user_options = {"offering": "remote-half", "count": "3"}  # refused at start: 1 at a time
    with pytest.raises(SpawnRefused, match="not 3"):
        await spawner.load_user_options()
    spawner.clear_state()  # as JupyterHub does after a failed start
    assert re.search(r'value="remote-half"[^>]*checked', await spawner.get_options_form())


USERS = [
    ("alice", ""),
    ("Élodie.Dupont@example.org", ""),
    ("alice", "My Lab!"),
    ("x" * 70, "gpu"),
    ("_under_score_", "a.b"),
]


@pytest.mark.parametrize("gpu", [GPU_OFF, GPU_ON_OFFLINE], ids=["gpu-off", "gpu-on"])
@pytest.mark.parametrize("name, server", USERS)
async def test_names_and_slugs_are_kubespawners(name, server, gpu):
    """Pod, label and server names are KubeSpawner's safe slugs, whatever the user and server are called."""
    kube = make_spawner(KubeSpawner, config(GPU_OFF), name, server)
    spawner = make_spawner(GPUSpawner, config(gpu), name, server)
    for attr in ("pod_name", "dns_name", "namespace", "pvc_name", "secret_name"):
        assert getattr(spawner, attr) == getattr(kube, attr), attr
    kube_out = await spawn_outcome(kube, "api", {})
    gpu_out = await spawn_outcome(spawner, "api", {})
    assert undocumented(differing(kube_out, gpu_out), REMOTE_GPU) == []
    for key in ("pod.metadata.name", "pod.metadata.labels[hub.jupyter.org/username]", "pod.metadata.labels[hub.jupyter.org/servername]"):
        assert gpu_out[key] == kube_out[key]
        assert re.fullmatch(r"[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?|", gpu_out[key]), key
    assert gpu_out[f"{CONTAINER}.env[RAW_WHO].value"] == name


@pytest.mark.parametrize("gpu", [GPU_OFF, GPU_ON_OFFLINE], ids=["gpu-off", "gpu-on"])
async def test_state_round_trip(gpu):
    """A restarted hub's spawner takes its names from the saved state, even after the
    templates changed (KubeSpawner's load_state), and saves the same state again."""
    first = make_spawner(GPUSpawner, config(gpu), "bob")
    first.user_options = {"offering": "remote-half"} if gpu is GPU_ON_OFFLINE else {}
    await first.load_user_options()
    state = first.get_state()
    changed = config(gpu, pod_name_template="renamed-{username}")
    again = make_spawner(GPUSpawner, changed, "bob")
    kube = make_spawner(KubeSpawner, changed, "bob")
    again.load_state(state)
    kube.load_state(state)
    assert again.pod_name == kube.pod_name == "jupyter-bob"
    assert again.get_state() == state
    kube_state = kube.get_state()
    assert undocumented(differing(flat("state", kube_state), flat("state", state)), REMOTE_GPU) == []
    if gpu is GPU_OFF:
        assert state == kube_state
    again.clear_state()
    kube.clear_state()
    assert again.get_state() == kube.get_state()
    assert again.pod_name == "renamed-bob"


def small_only(spawner: Any) -> list[dict[str, Any]]:
    """A callable profile_list (KubeSpawner evaluates it per user, when the page is shown)."""
    return [PROFILE_LIST[0]]


@pytest.mark.parametrize("profiles", [[], small_only], ids=["none", "callable"])
async def test_spawn_page_is_kubespawners_without_gpu_offerings(profiles):
    """No GPU offering in play: the page is KubeSpawner's own (no form at all without a
    profile_list, so JupyterHub spawns at once)."""
    kube = make_spawner(KubeSpawner, config(GPU_OFF, profile_list=profiles))
    spawner = make_spawner(GPUSpawner, config(GPU_OFF, profile_list=profiles))
    assert await spawner.get_options_form() == await kube.get_options_form()
    if not profiles:
        assert await spawner.get_options_form() == ""


async def test_spawn_page_with_a_profile_list_is_kubespawners_without_gpu_offerings():
    kube = make_spawner(KubeSpawner, config(GPU_OFF))
    spawner = make_spawner(GPUSpawner, config(GPU_OFF))
    page = await spawner.get_options_form()
    assert page == await kube.get_options_form()
    assert 'name="profile"' in page and "gpuspawner" not in page


async def test_spawn_page_with_gpu_offerings_holds_kubespawners_profile_form():
    spawner = make_spawner(GPUSpawner, config(GPU_ON_OFFLINE))
    page = await spawner.get_options_form()
    assert 'name="offering"' in page and 'value="remote-half"' in page
    assert 'name="profile"' in page and f'name="profile-option-{LARGE}--image"' in page


# ------------------------------------------------------------------ no inventory unless needed


@pytest.mark.parametrize("gpu", [GPU_OFF, GPU_ON_OFFLINE], ids=["gpu-off", "gpu-on-uncounted"])
async def test_no_cluster_watch_when_nothing_needs_counts(gpu, offline):
    """Neither discovery nor an offering with a GPU resource: nothing to count, so no
    cluster-wide watch is started (a stock zero-to-jupyterhub hub may not have one)."""
    spawner = make_spawner(GPUSpawner, config(gpu))
    earlier = Inventory.running(spawner.api)
    if earlier is not None:  # another test's: this one checks what it starts itself
        await earlier.stop()
    await spawner.get_options_form()
    await spawn_outcome(spawner, "api", {})
    assert Inventory.running(spawner.api) is None, "an inventory watch was started"


# ------------------------------------------------------------------ the user's groups


@pytest.mark.parametrize(
    "groups, may_use",
    [
        (User._MISSING, False),
        (None, False),
        ([], False),
        ([Group("students")], True),
        (["students"], True),
        ("students", True),
        (("students", "staff"), True),
        (42, False),
        ({"students": object()}, True),
    ],
    ids=["missing", "none", "empty", "group-objects", "names", "one-name", "tuple", "not-a-collection", "dict"],
)
async def test_the_users_groups_in_any_shape_never_crash_a_spawn(groups, may_use):
    restricted = {**REMOTE_GPU, "groups": ["students"]}
    gpu = {"discover_offerings": False, "offerings": [restricted], "group_quotas": {"students": {"total": 4}}}
    spawner = make_spawner(GPUSpawner, config(gpu), User("carol", groups=groups))
    page = await spawner.get_options_form()
    assert 'value="remote-half"' in page
    spawner.user_options = {"offering": "remote-half"}
    if may_use:
        await spawner.load_user_options()
        assert spawner.user_options["offering"] == "remote-half"
    else:
        with pytest.raises(Exception, match="not offered to you"):
            await spawner.load_user_options()
