"""A site's hooks and profile overrides reach the pod on GPUSpawner exactly as on KubeSpawner.

JupyterHub runs the authenticator's ``auth_state_hook``, the group overrides,
``apply_user_options`` and ``pre_spawn_hook`` before ``Spawner.start()``; KubeSpawner's
``_start`` then loads the profile (``load_user_options``), builds the pod and hands it to
``modify_pod_hook``. :func:`hub_spawn` drives a spawner in exactly that order (as
``jupyterhub/user.py``'s ``User.spawn`` and KubeSpawner's ``_start`` do), and every test
runs the same site through KubeSpawner and GPUSpawner side by side: with no GPU offering,
with one, and across two spawns of one spawner object with different offerings.
"""

from __future__ import annotations

from typing import Any

import pytest
from jupyterhub.utils import maybe_future
from kubespawner import KubeSpawner

from gpuspawner.hub.scheduling import SpawnRefused
from gpuspawner.spawner import GPUSpawner
from tests.compat.harness import (
    GPU_OFF,
    OTHER_IMAGE,
    REMOTE_GPU,
    STAMPS,
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

CONTAINER = "pod.spec.containers[notebook]"
LARGE = "data-science-large"

#: A second configured GPU offering, different from REMOTE_GPU in every field an offering sets.
REMOTE_FULL: dict[str, Any] = {
    "slug": "remote-full",
    "kind": "custom",
    "display_name": "A whole remote GPU",
    "command_prefix": ["bitfusion", "run", "-n", "1", "--"],
    "env": {"BITFUSION_FULL": "1"},
    "labels": {"example.org/gpu-size": "full"},
    "annotations": {"example.org/gpu-full": "yes"},
    "node_selector": {"bitfusion-full": "true"},
    "tolerations": [{"key": "bitfusion-full", "operator": "Exists", "effect": "NoSchedule"}],
}
GPU_ON: dict[str, Any] = {"discover_offerings": False, "offerings": [REMOTE_GPU, REMOTE_FULL]}
BY_SLUG = {"remote-half": REMOTE_GPU, "remote-full": REMOTE_FULL}

ZONE = {"topology.kubernetes.io/zone": "zone-b"}
LICENCE_TOLERATION = {"key": "example.org/licensed", "operator": "Exists", "effect": "NoSchedule"}
ZONE_AFFINITY = {"matchExpressions": [{"key": "example.org/rack", "operator": "In", "values": ["r1", "r2"]}]}


def auth_state_hook(spawner: Any, auth_state: dict[str, Any] | None) -> None:
    """What sites do with auth_state: per-user credentials and the team's data volume."""
    state = auth_state or {}
    spawner.environment["UPSTREAM_TOKEN"] = state.get("token", "none")
    spawner.volumes = [*spawner.volumes, {"name": "team-data", "persistentVolumeClaim": {"claimName": f"team-{state.get('team', 'x')}"}}]
    spawner.volume_mounts = [*spawner.volume_mounts, {"name": "team-data", "mountPath": "/team", "readOnly": True}]


def pre_spawn_hook(spawner: Any) -> None:
    """A zero-to-jupyterhub site's usual pre_spawn_hook: environment, zone, licence, billing."""
    spawner.environment.update({"HTTPS_PROXY": "http://proxy.example.org:3128", "LICENSE_SERVER": "27000@lic.example.org"})
    spawner.node_selector = {**spawner.node_selector, **ZONE}
    spawner.tolerations = [*spawner.tolerations, LICENCE_TOLERATION]
    spawner.node_affinity_required = [*spawner.node_affinity_required, ZONE_AFFINITY]
    spawner.extra_labels = {**spawner.extra_labels, "billing/cost-centre": "cc-42"}
    spawner.extra_annotations = {**spawner.extra_annotations, "example.org/ticket": "T-1"}
    spawner.extra_resource_limits = {**spawner.extra_resource_limits, "example.org/licence": "1"}
    spawner.extra_resource_guarantees = {**spawner.extra_resource_guarantees, "example.org/licence": "1"}
    spawner.volumes = [*spawner.volumes, {"name": "licence", "secret": {"secretName": "licence"}}]
    spawner.volume_mounts = [*spawner.volume_mounts, {"name": "licence", "mountPath": "/licence"}]


def modify_pod_hook(spawner: Any, pod: Any) -> Any:
    """Sees the finished pod (GPU changes included) and may still change it."""
    spawner.seen_by_modify_pod_hook = manifest_dict(spawner, pod)
    pod.metadata.labels["example.org/modified"] = "yes"
    return pod


HOOKS: dict[str, Any] = {
    "auth_state_hook": auth_state_hook,
    "pre_spawn_hook": pre_spawn_hook,
    "modify_pod_hook": modify_pod_hook,
    "group_overrides": {"vision": {"groups": ["vision"], "spawner_override": {"environment": {"TEAM": "vision"}}}},
}
AUTH_STATE = {"token": "secret-of-alice", "team": "vision"}

#: Paths in the pod that the hooks above set, with the value KubeSpawner gives them
#: (the site's own SITE config is there too: each hook adds to it).
HOOK_PATHS: dict[str, Any] = {
    f"{CONTAINER}.env[UPSTREAM_TOKEN].value": "secret-of-alice",
    f"{CONTAINER}.env[HTTPS_PROXY].value": "http://proxy.example.org:3128",
    f"{CONTAINER}.env[LICENSE_SERVER].value": "27000@lic.example.org",
    f"{CONTAINER}.env[TEAM].value": "vision",
    f"{CONTAINER}.env[SITE].value": "example",
    f"{CONTAINER}.volumeMounts[team-data].mountPath": "/team",
    f"{CONTAINER}.volumeMounts[licence].mountPath": "/licence",
    f"{CONTAINER}.volumeMounts[scratch].mountPath": "/scratch/alice",
    "pod.spec.volumes[team-data].persistentVolumeClaim.claimName": "team-vision",
    "pod.spec.volumes[licence].secret.secretName": "licence",
    "pod.spec.nodeSelector[topology.kubernetes.io/zone]": "zone-b",
    "pod.metadata.labels[billing/cost-centre]": "cc-42",
    "pod.metadata.labels[example.org/modified]": "yes",
    "pod.metadata.annotations[example.org/ticket]": "T-1",
    f"{CONTAINER}.resources.limits[example.org/licence]": "1",
    f"{CONTAINER}.resources.requests[example.org/licence]": "1",
}


#: The outcome's key for the pod as a whole (the flattened paths compare; this one is for lists).
POD = "pod as built"


def compared(kube: dict[str, Any], gpu: dict[str, Any]) -> list[str]:
    """The flattened paths at which the two spawns differ."""
    return differing({k: v for k, v in kube.items() if k != POD}, {k: v for k, v in gpu.items() if k != POD})


def alice() -> User:
    return User("alice", groups=[Group("vision")])


def config(gpu: dict[str, Any] | None = None, **kube: Any):
    from tests.compat.conftest import OFFLINE_HOST

    return site_config(gpu, k8s_api_host=OFFLINE_HOST, **{**HOOKS, **kube})


async def hub_spawn(spawner: Any, options: dict[str, Any], auth_state: dict[str, Any] | None = AUTH_STATE) -> dict[str, Any]:
    """One spawn in JupyterHub's order (User.spawn, then KubeSpawner's _start), flattened."""
    spawner.user_options = dict(options)
    await spawner.run_auth_state_hook(auth_state)
    await spawner.apply_group_overrides()
    await spawner._run_apply_user_options(spawner.user_options)
    await maybe_future(spawner.run_pre_spawn_hook())
    await spawner.load_user_options()
    pod = await spawner.get_pod_manifest()
    if spawner.modify_pod_hook:
        pod = await maybe_future(spawner.modify_pod_hook(spawner, pod))
    manifest = manifest_dict(spawner, pod)
    return {**flat("user_options", spawner.user_options), **flat("pod", manifest), **flat("state", spawner.get_state()), POD: manifest}


def hooks_arrived(outcome: dict[str, Any]) -> None:
    for path, value in HOOK_PATHS.items():
        assert outcome.get(path) == value, f"{path}: {outcome.get(path)!r}, the hooks set {value!r}"
    assert LICENCE_TOLERATION in _listed(outcome, "pod.spec.tolerations")
    terms = "pod.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
    assert any(e["key"] == "example.org/rack" for term in _listed(outcome, terms) for e in term["matchExpressions"])


def _listed(outcome: dict[str, Any], prefix: str) -> list[Any]:
    """The list at ``prefix`` in the pod the outcome was flattened from."""
    node: Any = outcome[POD]
    for part in prefix.split(".")[1:]:
        node = (node or {}).get(part)
    return list(node or [])


def gpu_free(outcome: dict[str, Any]) -> None:
    """Nothing of either GPU offering in the pod."""
    for offering in (REMOTE_GPU, REMOTE_FULL):
        for key in offering["env"]:
            assert f"{CONTAINER}.env[{key}].value" not in outcome
        for key in offering["node_selector"]:
            assert f"pod.spec.nodeSelector[{key}]" not in outcome
        for key in offering["labels"]:
            assert f"pod.metadata.labels[{key}]" not in outcome
        for key in offering["annotations"]:
            assert f"pod.metadata.annotations[{key}]" not in outcome
        assert offering["tolerations"][0] not in _listed(outcome, "pod.spec.tolerations")
    assert "bitfusion" not in [v for k, v in outcome.items() if k.startswith(f"{CONTAINER}.args[")]


# ------------------------------------------------------------------ one spawn


@pytest.mark.parametrize("profile", [{}, {"profile": "small"}, {"profile": LARGE, "image": "scipy"}], ids=["default", "small", "large"])
async def test_hooks_reach_the_pod_without_gpu_offerings(profile):
    kube = await hub_spawn(make_spawner(KubeSpawner, config(GPU_OFF), alice()), profile)
    hooks_arrived(kube)  # the oracle: what the hooks set is in KubeSpawner's pod
    gpu = await hub_spawn(make_spawner(GPUSpawner, config(GPU_OFF), alice()), profile)
    assert compared(kube, gpu) == STAMPS


@pytest.mark.parametrize("slug", [None, "remote-half", "remote-full"], ids=["default-cpu", "remote-half", "remote-full"])
async def test_hooks_reach_the_pod_with_a_gpu_offering(slug):
    options = {"profile": "small", **({"offering": slug} if slug else {})}
    kube = await hub_spawn(make_spawner(KubeSpawner, config(GPU_OFF), alice()), {"profile": "small"})
    gpu = await hub_spawn(make_spawner(GPUSpawner, config(GPU_ON), alice()), options)
    hooks_arrived(gpu)
    offering = BY_SLUG.get(slug or "", {})
    assert undocumented(compared(kube, gpu), offering) == []
    if offering:  # the offering is there too, on top of the hooks
        assert gpu[f"{CONTAINER}.args[0]"] == "bitfusion"
        assert all(gpu[f"pod.spec.nodeSelector[{k}]"] == v for k, v in offering["node_selector"].items())
        assert offering["tolerations"][0] in _listed(gpu, "pod.spec.tolerations")
    else:
        gpu_free(gpu)


async def test_the_hooks_own_settings_are_not_changed_by_a_gpu_spawn():
    """The offering goes into the pod, never into KubeSpawner's settings, which keep exactly
    what the config and the hooks made of them."""
    spawner = make_spawner(GPUSpawner, config(GPU_ON), alice())
    await hub_spawn(spawner, {"profile": "small", "offering": "remote-half"})
    assert spawner.node_selector == {"pool": "users", **ZONE}
    assert spawner.extra_resource_limits == {"example.org/licence": "1"}
    assert "BITFUSION_SITE" not in spawner.environment and spawner.environment["UPSTREAM_TOKEN"] == "secret-of-alice"
    assert [v["name"] for v in spawner.volumes] == ["scratch", "team-data", "licence"]
    assert spawner.cmd == make_spawner(KubeSpawner, config(GPU_OFF), alice()).cmd  # no command prefix left
    assert spawner.tolerations[-1] == LICENCE_TOLERATION
    assert "gpuspawner.io/offering" not in spawner.extra_labels


async def test_modify_pod_hook_sees_the_finished_pod():
    spawner = make_spawner(GPUSpawner, config(GPU_ON), alice())
    outcome = await hub_spawn(spawner, {"offering": "remote-half"})
    seen = flat("pod", spawner.seen_by_modify_pod_hook)
    assert seen[f"{CONTAINER}.args[0]"] == "bitfusion"
    assert seen["pod.spec.nodeSelector[bitfusion-client]"] == "true"
    assert seen["pod.metadata.labels[gpuspawner.io/offering]"] == "remote-half"
    assert seen["pod.spec.nodeSelector[topology.kubernetes.io/zone]"] == "zone-b"
    assert outcome["pod.metadata.labels[example.org/modified]"] == "yes"  # its change is kept


# ------------------------------------------------------------------ two spawns of one spawner


@pytest.mark.parametrize(
    "first, second",
    [("remote-half", "cpu"), ("cpu", "remote-half"), ("remote-half", "remote-full"), ("remote-full", "remote-half")],
)
async def test_two_spawns_of_one_spawner_keep_the_hooks_and_forget_the_first_offering(first, second):
    """JupyterHub makes a new spawner after a clean stop, but keeps the object after a failed
    start and in scripts; either way the second spawn is the hooks' and its own offering's."""
    kube_spawner = make_spawner(KubeSpawner, config(GPU_OFF), alice())
    gpu_spawner = make_spawner(GPUSpawner, config(GPU_ON), alice())
    for slug in (first, second):
        kube = await hub_spawn(kube_spawner, {})
        gpu = await hub_spawn(gpu_spawner, {"offering": slug})
        hooks_arrived(gpu)
        offering = BY_SLUG.get(slug, {})
        assert undocumented(compared(kube, gpu), offering) == [], slug
        assert gpu["user_options.offering"] == slug
    other = [o for o in (REMOTE_GPU, REMOTE_FULL) if o["slug"] != second]
    for offering in other:  # nothing of the first spawn's offering is left
        assert not [k for k in offering["env"] if f"{CONTAINER}.env[{k}].value" in gpu]
        assert not [k for k in offering["node_selector"] if f"pod.spec.nodeSelector[{k}]" in gpu]
        assert not [k for k in offering["labels"] if f"pod.metadata.labels[{k}]" in gpu]
        assert offering["tolerations"][0] not in _listed(gpu, "pod.spec.tolerations")
    args = [v for k, v in sorted(gpu.items()) if k.startswith(f"{CONTAINER}.args[")]
    assert args.count("bitfusion") == (0 if second == "cpu" else 1)
    if second == "cpu":
        gpu_free(gpu)


# ------------------------------------------------------------------ profile overrides


MERGING_PROFILES: list[dict[str, Any]] = [
    {
        "display_name": "Merging",
        "slug": "merging",
        "default": True,
        "kubespawner_override": {
            "environment": {"SITE": None, "ADDED": "1"},  # None removes the site's key
            "node_selector": {"pool": None, "disk": "ssd"},
            "extra_labels": {"size": "m"},
        },
    },
]


@pytest.mark.parametrize(
    "gpu_config, options", [(GPU_OFF, {}), (GPU_ON, {}), (GPU_ON, {"offering": "remote-half"})], ids=["off", "on-cpu", "on-gpu"]
)
async def test_profile_overrides_merge_and_remove_as_in_kubespawner(gpu_config, options):
    kube = await hub_spawn(make_spawner(KubeSpawner, config(GPU_OFF, profile_list=MERGING_PROFILES), alice()), {})
    gpu = await hub_spawn(make_spawner(GPUSpawner, config(gpu_config, profile_list=MERGING_PROFILES), alice()), options)
    for outcome in (kube, gpu):
        assert f"{CONTAINER}.env[SITE].value" not in outcome  # removed by the override's None
        assert outcome[f"{CONTAINER}.env[ADDED].value"] == "1"
        assert outcome[f"{CONTAINER}.env[WHO].value"] == "alice"  # the site's others merged, not replaced
        assert outcome[f"{CONTAINER}.env[HTTPS_PROXY].value"] == "http://proxy.example.org:3128"  # and the hook's
        assert "pod.spec.nodeSelector[pool]" not in outcome
        assert outcome["pod.spec.nodeSelector[disk]"] == "ssd"
        assert outcome["pod.metadata.labels[size]"] == "m"
    assert undocumented(compared(kube, gpu), BY_SLUG.get(options.get("offering", ""), {})) == []


async def test_the_profile_merges_into_what_the_hooks_set():
    """The hooks run before the profile is loaded: a profile's environment adds to theirs."""
    kube = await hub_spawn(make_spawner(KubeSpawner, config(GPU_OFF), alice()), {"profile": LARGE})
    gpu = await hub_spawn(make_spawner(GPUSpawner, config(GPU_ON), alice()), {"profile": LARGE, "offering": "remote-half"})
    for outcome in (kube, gpu):
        assert outcome[f"{CONTAINER}.env[SIZE].value"] == "large"
        assert outcome[f"{CONTAINER}.env[UPSTREAM_TOKEN].value"] == "secret-of-alice"
        assert outcome["pod.spec.nodeSelector[pool]"] == "large"
        assert outcome["pod.spec.nodeSelector[topology.kubernetes.io/zone]"] == "zone-b"


# ------------------------------------------------------------------ KubeSpawner's refusals, KubeSpawner's way


BAD_UNLISTED = {"profile": LARGE, "image--unlisted-choice": "docker.io/evil:latest"}
BAD_UNLISTED_FORM = {
    "profile": [LARGE],
    f"profile-option-{LARGE}--image": ["unlisted-choice"],
    f"profile-option-{LARGE}--image--unlisted-choice": ["docker.io/evil:latest"],
}


async def test_a_failed_unlisted_choice_is_refused_where_and_as_kubespawner_refuses_it():
    """No GPU offering in play: the form post is accepted by both, and the start refuses it
    in load_user_options with KubeSpawner's ValueError and words. GPUSpawner's is also a
    refusal the hub answers with 400 (KubeSpawner's plain ValueError gets a 500)."""
    errors = {}
    for cls in (KubeSpawner, GPUSpawner):
        spawner = make_spawner(cls, config(GPU_OFF), alice())
        posted = spawner.options_from_form(BAD_UNLISTED_FORM)  # nothing refused at the post
        assert posted["image--unlisted-choice"] == "docker.io/evil:latest"
        spawner.user_options = posted
        with pytest.raises(ValueError) as refused:
            await spawner.load_user_options()
        errors[cls] = refused.value
    assert str(errors[GPUSpawner]) == str(errors[KubeSpawner])
    assert "validation regex" in str(errors[KubeSpawner])
    assert isinstance(errors[GPUSpawner], SpawnRefused) and errors[GPUSpawner].status_code == 400


async def test_with_gpu_offerings_a_failed_unlisted_choice_is_refused_at_start_too():
    """GPU offerings in play: the regex is KubeSpawner's check, made at start as KubeSpawner
    makes it; the refusal is a ValueError and a 400 with KubeSpawner's words."""
    spawner = make_spawner(GPUSpawner, config(GPU_ON), alice())
    spawner.user_options = spawner.options_from_form({**BAD_UNLISTED_FORM, "offering": ["remote-half"]})
    with pytest.raises(ValueError) as refused:
        await spawner.load_user_options()
    assert isinstance(refused.value, SpawnRefused) and refused.value.status_code == 400
    assert "failed validation regex" in str(refused.value)
    assert spawner.choice is None  # refused before any offering was taken


async def test_a_good_unlisted_choice_with_hooks_is_kubespawners():
    options = {"profile": LARGE, "image--unlisted-choice": OTHER_IMAGE}
    kube = await hub_spawn(make_spawner(KubeSpawner, config(GPU_OFF), alice()), options)
    gpu = await hub_spawn(make_spawner(GPUSpawner, config(GPU_OFF), alice()), options)
    assert kube[f"{CONTAINER}.image"] == OTHER_IMAGE
    assert compared(kube, gpu) == STAMPS
