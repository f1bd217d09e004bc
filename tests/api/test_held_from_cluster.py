"""Held = what the cluster says is running (issue 38), on a real hub and the devcluster: a pod
deleted behind the hub's back gives its quota back at once, and its user is told why.

The hub is the API tests' hub (a user may hold 2 GPU units at once) with one more offering,
"Test GPU", whose pods land on a kwok node of this test's own (so deleting that node touches
no other test). Its servers are really served (gpuspawner.devcluster.podrunner), so they run.
JupyterHub polls each server every few seconds here (``Spawner.poll_interval``; the hub's
normal poll, more often than its default 30 s): the poll, not the hub's own stop, is what marks
a server stopped whose pod is gone.

1. researcher7 holds 2 servers; a third is refused (429, "already hold 2"), not 3: another hub's
   GPU pod for a user of the same name is not counted, nor listed in the hub's
   ``gpuspawner_server_gpus``, whose series carry this hub's identity.
2. One pod is evicted through the Kubernetes eviction API (as a node drain does): the spawn
   page stops saying "over your quota" as soon as the watch's event comes, a third server
   starts, and a fourth is refused again (2 held, counted right). The home page says the
   server was evicted, and its saved state carries the notice.
3. The node under the two running servers is deleted: the pod garbage collector deletes their
   pods (as on any cluster), both units come back, a new server starts on another node, and the
   home page says their node is gone.
"""

from __future__ import annotations

import secrets

import pytest

from gpuspawner.devcluster.nodes import KWOK_ANNOTATION
from gpuspawner.devcluster.podrunner import PodRunner
from tests.api.gpuhub import GPUHub
from tests.conftest import wait_for

pytestmark = pytest.mark.cluster
USER = "researcher7"
RESOURCE = "example.org/held-gpu"


def add_node(kube, name: str, tag: str) -> None:
    """A kwok node with 4 units of the test's own resource, selected by ``example.org/held-test=<tag>``."""
    allocatable = {"cpu": "16", "memory": "64Gi", "pods": "110", RESOURCE: "4"}
    kube.create_node(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok", "example.org/held-test": tag},
                "annotations": {KWOK_ANNOTATION: "fake"},
            },
            "spec": {},
            "status": {"allocatable": allocatable, "capacity": dict(allocatable)},
        }
    )


def config(tag: str) -> str:
    offering = {
        "slug": "held-gpu",
        "kind": "custom",
        "display_name": "Test GPU",
        "resources": {RESOURCE: 1},
        "node_selector": {"example.org/held-test": tag},
        "groups": ["researchers"],
    }
    return f"""
from gpuspawner.hub.culleractions import hub_templates_dir
c.KubeSpawner.cmd = ["jupyterhub-singleuser"]
c.GPUSpawner.offerings = c.GPUSpawner.offerings + [{offering!r}]
c.GPUSpawner.hub_id = "held-{tag}"
c.Spawner.poll_interval = 5
c.JupyterHub.template_paths = [hub_templates_dir()]
c.JupyterHub.authenticate_prometheus = False
"""


def foreign_pod(kube, namespace: str, node: str, tag: str) -> None:
    """A GPU pod of another hub ("other-<tag>") for a user of the same name, bound to ``node``."""
    labels = {
        "hub.jupyter.org/username": USER,
        "gpuspawner.io/hub": f"other-{tag}",
        "gpuspawner.io/offering": "held-gpu",
        "app": "other-hub",
    }
    container = {"name": "notebook", "image": "x", "resources": {"limits": {RESOURCE: "1"}, "requests": {RESOURCE: "1"}}}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "jupyter-other", "labels": labels},
        "spec": {"nodeName": node, "containers": [container]},
    }
    kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod)


def hub_metric(hub: GPUHub, name: str) -> list[str]:
    text = hub.api_session.get(f"{hub.url}/hub/metrics", timeout=30).text
    return [line for line in text.splitlines() if line.startswith(name + "{")]


def free_units(hub: GPUHub) -> float | None:
    found = [line for line in hub_metric(hub, "gpuspawner_offering_free") if 'offering="held-gpu"' in line]
    return float(found[0].rsplit(" ", 1)[1]) if found else None


def servers(hub: GPUHub) -> dict:
    return hub.user_model(USER).get("servers") or {}


def ready(hub: GPUHub, server: str) -> bool:
    return bool(servers(hub).get(server, {}).get("ready"))


def stopped(hub: GPUHub, server: str) -> bool:
    model = servers(hub).get(server)
    return model is None or (not model["ready"] and not model["pending"])


def spawn(hub: GPUHub, server: str) -> None:
    answer = hub.api("POST", hub.server_path(USER, server), {"offering": "held-gpu"})
    assert answer.status in (201, 202), answer
    wait_for(lambda: ready(hub, server), f"server {server!r} to be ready", timeout=180, interval=0.5)


def pod_of(hub: GPUHub, server: str) -> dict:
    [pod] = hub.pods(USER, server)
    return pod


def over_quota_on_the_page(hub: GPUHub, server: str) -> bool:
    """Whether the spawn page of ``server`` says "over your quota" on the Test GPU's row."""
    page = hub.spawn_page(USER, server, timeout=120).text
    start = page.index('data-slug="held-gpu"')
    end = page.find('<div class="gs-option', start)
    return "over your quota" in page[start : end if end > 0 else None]


def home_with(hub: GPUHub, words: str, times: int = 1) -> str:
    """The user's home page once it says ``words`` ``times`` times ("" before)."""
    page = hub.form_session(USER).get(f"{hub.url}/hub/home", timeout=60).text
    return page if page.count(words) >= times else ""


def server_state(hub: GPUHub, server: str) -> dict:
    model = hub.api_session.get(f"{hub.url}/hub/api/users/{USER}?include_stopped_servers=1", timeout=30).json()
    return (model["servers"].get(server) or {}).get("state") or {}


def test_a_pod_deleted_behind_the_hubs_back_gives_its_quota_back_and_the_user_is_told(devcluster, kube, namespace, tmp_path):
    tag = secrets.token_hex(3)
    first, second = f"held-{tag}-a", f"held-{tag}-b"
    add_node(kube, first, tag)
    hub = GPUHub(tmp_path / "hub", devcluster, namespace, http_timeout=120, extra_config=config(tag))
    runner = PodRunner(kube, root=tmp_path / "pods")
    runner.start()
    try:
        hub.start()
        # 1. two held: a third is refused. Another hub's pod of a user of the same name is not theirs.
        spawn(hub, "")
        spawn(hub, "two")
        foreign_pod(kube, namespace, first, tag)
        wait_for(lambda: free_units(hub) == 1, "the hub's counts to see the other hub's pod take a unit", timeout=60, interval=0.5)
        full = hub.api("POST", hub.server_path(USER, "three"), {"offering": "held-gpu"})
        assert full.status == 429 and "already hold 2" in full.message, full
        assert over_quota_on_the_page(hub, "three")
        held = hub_metric(hub, "gpuspawner_server_gpus")  # this hub's pods only, with its identity
        ours = sorted(pod_of(hub, server)["metadata"]["name"] for server in ("", "two"))
        assert sorted(line.split('pod="')[1].split('"')[0] for line in held) == ours, held
        assert all(f'hub="held-{tag}"' in line and line.endswith(" 1.0") for line in held), held

        # 2. one pod evicted through the eviction API, as a drain would: no stop by the hub
        evicted = pod_of(hub, "two")["metadata"]["name"]
        eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": evicted, "namespace": namespace}}
        kube.request("POST", f"/api/v1/namespaces/{namespace}/pods/{evicted}/eviction", eviction)
        wait_for(lambda: not over_quota_on_the_page(hub, "three"), "the evicted server's unit to come back", timeout=180, interval=1)
        spawn(hub, "three")
        again = hub.api("POST", hub.server_path(USER, "four"), {"offering": "held-gpu"})
        assert again.status == 429 and "already hold 2" in again.message, again  # "" and "three": counted right
        wait_for(lambda: stopped(hub, "two"), "the hub's poll to find server 'two' stopped", timeout=180, interval=1)
        words = "Your server &#39;two&#39; was stopped at "
        home = wait_for(lambda: home_with(hub, words), "the home page's notice", timeout=60, interval=1)
        assert "because its pod was evicted through the Kubernetes eviction API" in home, home[-3000:]
        notice = server_state(hub, "two").get("gpuspawner_stop_notice") or {}
        assert "because its pod was evicted through the Kubernetes eviction API" in notice.get("text", ""), notice
        assert ready(hub, "") and ready(hub, "three")

        # 3. the node under both running servers is deleted: the cluster deletes their pods
        add_node(kube, second, tag)
        kube.request("DELETE", f"/api/v1/nodes/{first}")
        wait_for(lambda: not hub.pods(USER), "the pod garbage collector to delete the pods of the gone node", timeout=300, interval=1)
        wait_for(lambda: not over_quota_on_the_page(hub, "four"), "both units to come back", timeout=120, interval=1)
        spawn(hub, "four")
        assert pod_of(hub, "four")["spec"]["nodeName"] == second
        wait_for(lambda: stopped(hub, "") and stopped(hub, "three"), "the hub's poll to find both stopped", timeout=180, interval=1)
        gone = f"because its node {first} is gone from the cluster"
        home = wait_for(lambda: home_with(hub, gone, 2), "the home page's notices of the gone node", timeout=60, interval=1)
        assert "Your server &#39;three&#39; was stopped at " in home
        five = hub.api("POST", hub.server_path(USER, "five"), {"offering": "held-gpu"})
        assert five.status in (201, 202), five  # one held ("four"): one more allowed
        wait_for(lambda: ready(hub, "five"), "server 'five' to be ready", timeout=180, interval=0.5)
        six = hub.api("POST", hub.server_path(USER, "six"), {"offering": "held-gpu"})
        assert six.status == 429 and "already hold 2" in six.message, six
    finally:
        for server in ("six", "five", "four", "three", "two", ""):
            if hub.proc is not None and hub.proc.poll() is None:
                hub.stop_server(USER, server)
        hub.stop()
        runner.stop()
        for node in (first, second):
            try:
                kube.request("DELETE", f"/api/v1/nodes/{node}")
            except Exception:  # (already gone)
                pass
