"""A site's hooks on a real JupyterHub: the hub itself runs ``auth_state_hook`` and
``pre_spawn_hook`` before the spawner starts, and what they set is in the pod the real
API server stores, on KubeSpawner and on GPUSpawner alike, for a GPU offering and for a
later spawn with none. (tests/compat/test_site_hooks.py checks every field side by side
without a cluster; this checks that JupyterHub's own order is the one those tests assume.)
"""

from __future__ import annotations

import secrets

import pytest

from tests.api.gpuhub import MIG1, GPUHub
from tests.conftest import fresh_namespace, wait_for

pytestmark = pytest.mark.cluster

HOOKS = """
def _auth_state_hook(spawner, auth_state):
    spawner.environment["AUTH_STATE_SEEN"] = "none" if auth_state is None else "some"

def _pre_spawn_hook(spawner):
    spawner.environment.update({"SITE_TOKEN": "t-" + spawner.user.name})
    spawner.node_selector = {**spawner.node_selector, "type": "kwok"}
    spawner.tolerations = [*spawner.tolerations, {"key": "example.org/site", "operator": "Exists", "effect": "NoSchedule"}]
    spawner.extra_labels = {**spawner.extra_labels, "billing/cost-centre": "cc-42"}
    spawner.extra_annotations = {**spawner.extra_annotations, "example.org/ticket": "T-1"}
    spawner.volumes = [*spawner.volumes, {"name": "site-data", "emptyDir": {}}]
    spawner.volume_mounts = [*spawner.volume_mounts, {"name": "site-data", "mountPath": "/site"}]

c.Spawner.auth_state_hook = _auth_state_hook
c.Spawner.pre_spawn_hook = _pre_spawn_hook
"""


def hooks_in(pod: dict) -> dict:
    """What of the hooks' settings the stored pod holds."""
    spec = pod["spec"]
    container = spec["containers"][0]
    env = {e["name"]: e.get("value") for e in container.get("env") or []}
    return {
        "env": {k: env.get(k) for k in ("AUTH_STATE_SEEN", "SITE_TOKEN")},
        "selector": (spec.get("nodeSelector") or {}).get("type"),
        "toleration": any(t.get("key") == "example.org/site" for t in spec.get("tolerations") or []),
        "label": pod["metadata"]["labels"].get("billing/cost-centre"),
        "annotation": (pod["metadata"].get("annotations") or {}).get("example.org/ticket"),
        "volume": any(v["name"] == "site-data" for v in spec.get("volumes") or []),
        "mount": any(m["name"] == "site-data" and m["mountPath"] == "/site" for m in container.get("volumeMounts") or []),
    }


def expected(user: str) -> dict:
    return {
        "env": {"AUTH_STATE_SEEN": "none", "SITE_TOKEN": f"t-{user}"},
        "selector": "kwok",
        "toleration": True,
        "label": "cc-42",
        "annotation": "T-1",
        "volume": True,
        "mount": True,
    }


def spawned_pod(hub: GPUHub, user: str, options: dict) -> dict:
    answer = hub.api("POST", f"/users/{user}/server", options)
    assert answer.status in (201, 202), f"{answer.status} {answer.message}\n{hub.log_tail()}"
    pods = wait_for(lambda: hub.pods(user, ""), f"{user}'s pod", timeout=60)
    return pods[0]


@pytest.fixture(scope="module")
def hooks_namespace(kube):
    yield from fresh_namespace(kube, f"hooks-{secrets.token_hex(3)}")


@pytest.fixture(scope="module")
def hubs(devcluster, hooks_namespace, tmp_path_factory):
    """A GPUSpawner hub and a KubeSpawner hub with the same site config and hooks."""
    started = []
    try:
        for name, extra in (("gpu", HOOKS), ("kube", HOOKS + '\nc.JupyterHub.spawner_class = "kubespawner.KubeSpawner"\n')):
            hub = GPUHub(tmp_path_factory.mktemp(f"hooks-{name}"), devcluster, hooks_namespace, http_timeout=4.0, extra_config=extra)
            started.append(hub)
            hub.start()
        yield dict(zip(("gpu", "kube"), started, strict=True))
    finally:
        for hub in started:
            hub.stop()


def test_the_hooks_reach_the_pod_on_a_real_hub_with_and_without_a_gpu(hubs):
    kube_pod = spawned_pod(hubs["kube"], "student7", {})
    assert hooks_in(kube_pod) == expected("student7")  # the oracle: KubeSpawner keeps them
    hubs["kube"].stop_server("student7")

    gpu_pod = spawned_pod(hubs["gpu"], "student8", {"offering": MIG1})
    assert hooks_in(gpu_pod) == expected("student8")
    limits = gpu_pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits.get("nvidia.com/mig-1g.5gb") == "1"  # the offering is there too
    hubs["gpu"].stop_server("student8")

    cpu_pod = spawned_pod(hubs["gpu"], "student8", {"offering": "cpu"})  # the same user's next spawn
    assert hooks_in(cpu_pod) == expected("student8")
    limits = cpu_pod["spec"]["containers"][0]["resources"].get("limits") or {}
    assert not [k for k in limits if k.startswith("nvidia.com/")], limits
    hubs["gpu"].stop_server("student8")
