"""Capacity truth: in random cluster states, every offering's free count equals the
number of its pods the real scheduler places when they are created one at a time
until it refuses.

Each state is a fresh devcluster with a random mix of the simulated node classes
and random GPU pods of other users in several namespaces. The number of states is
GPUSPAWNER_CAPACITY_STATES (default 5).
"""

from __future__ import annotations

import os
import random
import secrets

import pytest

from gpuspawner.catalog import CatalogConfig, build_catalog
from gpuspawner.devcluster.cluster import DevCluster, KubeHTTP
from gpuspawner.devcluster.nodes import node_classes, node_manifest
from gpuspawner.inventory import POD_FIELD_SELECTOR, ClusterIndex
from gpuspawner.podspec import merge_affinity_terms, pod_changes
from tests.conftest import ARTIFACTS, wait_for
from tests.integration.test_spawner import SITE_OFFERINGS

pytestmark = pytest.mark.cluster

STATES = int(os.environ.get("GPUSPAWNER_CAPACITY_STATES", "5"))


def random_nodes(rng: random.Random) -> list[dict]:
    classes = node_classes()
    chosen = rng.sample(classes, k=rng.randint(4, len(classes)))
    nodes = []
    for entry in chosen:
        for _ in range(rng.randint(1, 2)):
            nodes.append(node_manifest(entry, len(nodes), name=f"{entry['name']}-{len(nodes)}"))
    if rng.random() < 0.5:  # sometimes a cordoned copy, which must not count
        cordoned = node_manifest(rng.choice(chosen), len(nodes), name=f"cordoned-{len(nodes)}")
        cordoned["spec"]["unschedulable"] = True
        nodes.append(cordoned)
    return nodes


def namespace(kube: KubeHTTP, name: str) -> str:
    kube.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return name


def pod_for(offering, name: str) -> dict:
    changes = pod_changes(offering, 1)
    spec = {
        "containers": [{"name": "notebook", "image": "jupyter", "resources": {"limits": dict(changes.limits)}}],
        "tolerations": [dict(t) for t in changes.tolerations],
        "nodeSelector": dict(changes.node_selector),
    }
    if changes.node_affinity:  # as GPUSpawner sets it (node_affinity_required)
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": merge_affinity_terms([], changes.node_affinity)}}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": dict(changes.labels)}, "spec": spec}


def settled(kube: KubeHTTP, ns: str, name: str) -> str | None:
    pod = kube.request("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
    if pod["status"].get("phase") == "Running":
        return "Running"
    for cond in pod["status"].get("conditions") or []:
        if cond["type"] == "PodScheduled" and cond.get("reason") == "Unschedulable":
            return "Unschedulable"
    return None


def place_until_refused(kube: KubeHTTP, ns: str, offering, limit: int = 64) -> int:
    placed = 0
    for i in range(limit):
        name = f"p{i}"
        kube.request("POST", f"/api/v1/namespaces/{ns}/pods", pod_for(offering, name))
        if wait_for(lambda: settled(kube, ns, name), f"{offering.slug} pod {i} settled", timeout=30) != "Running":
            return placed
        placed += 1
    pytest.fail(f"{offering.slug}: more than {limit} pods placed")


def clear(kube: KubeHTTP, ns: str) -> None:
    kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods?gracePeriodSeconds=0")
    wait_for(lambda: not kube.request("GET", f"/api/v1/namespaces/{ns}/pods")["items"], f"pods of {ns} gone", timeout=60)


@pytest.mark.parametrize("seed", range(STATES))
def test_free_count_equals_what_the_scheduler_places(tmp_path, seed, request):
    rng = random.Random(seed)
    cluster = DevCluster(tmp_path / "cluster")
    cluster.up(nodes=random_nodes(rng), log=lambda msg: None)
    try:
        kube = cluster.client()
        wait_for(lambda: kube.ok("/api/v1/namespaces/default/serviceaccounts/default"), "default service account")
        nodes = kube.request("GET", "/api/v1/nodes")["items"]
        index = ClusterIndex()
        index.replace(nodes=nodes, pods=[])
        catalog = [o for o in build_catalog(CatalogConfig(offerings=SITE_OFFERINGS), discovered=index.discovered()) if o.resources]

        # Other users' GPU pods, in several namespaces, placed by the real scheduler.
        teams = [namespace(kube, f"team-{t}") for t in "abc"]
        for i in range(rng.randint(2, 8)):
            offering = rng.choice(catalog)
            team = rng.choice(teams)
            kube.request("POST", f"/api/v1/namespaces/{team}/pods", pod_for(offering, f"job-{i}"))
            wait_for(lambda: settled(kube, team, f"job-{i}"), "pre-existing pod settled")
        for team in teams:  # the ones that did not fit would confuse the count: drop them
            for pod in kube.request("GET", f"/api/v1/namespaces/{team}/pods")["items"]:
                if pod["status"].get("phase") != "Running":
                    kube.request("DELETE", f"/api/v1/namespaces/{team}/pods/{pod['metadata']['name']}?gracePeriodSeconds=0")
        bound = kube.request("GET", f"/api/v1/pods?fieldSelector={POD_FIELD_SELECTOR}")["items"]
        index.replace(pods=bound)

        checked = []
        probe = namespace(kube, f"probe-{secrets.token_hex(3)}")
        for offering in catalog:
            expected = index.availability(offering).free
            placed = place_until_refused(kube, probe, offering)
            checked.append((offering.slug, expected, placed))
            clear(kube, probe)
        mismatches = [row for row in checked if row[1] != row[2]]
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        with open(ARTIFACTS / "capacity_truth.txt", "a") as report:
            report.write(f"state {seed}: {len(nodes)} nodes, {len(bound)} foreign GPU pods, {len(checked)} offerings checked, "
                         f"{len(mismatches)} mismatches\n")
        assert not mismatches, f"(slug, inventory free, scheduler placed): {mismatches}"
        assert len(checked) >= 3
    finally:
        cluster.down(quiet=True)
