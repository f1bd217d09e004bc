"""The inventory's incremental index counts what a full recount of the same snapshot counts.

Events arrive one at a time (pods bound and deleted, nodes relabelled, cordoned and removed);
after each, every tracked offering's availability must equal :func:`capacity.availability`
over the cluster as it is then, with the notebook's cpu/memory guarantees.
"""

from __future__ import annotations

import copy
import random

import pytest

from gpuspawner.capacity.counts import availability
from gpuspawner.capacity.index import ClusterIndex
from gpuspawner.core.fit import PODS
from gpuspawner.devcluster.generate import random_cluster
from gpuspawner.devcluster.generate_pods import random_pods
from gpuspawner.offerings.config import offering_from_config
from gpuspawner.offerings.discovery import discover
from gpuspawner.pod.notebook import Notebook

NOTEBOOKS = [
    Notebook(),
    Notebook.from_settings({"mem_guarantee": "1G"}),
    Notebook.from_settings({"cpu_guarantee": 2, "mem_guarantee": "8G"}),
]


def assert_same(index: ClusterIndex, offerings, nodes: dict, pods: dict, where: str) -> None:
    for offering in offerings:
        want = availability(offering, list(nodes.values()), list(pods.values()), index.notebook)
        assert index.availability(offering) == want, f"{where}: {offering.slug}"


@pytest.mark.parametrize("seed", range(25))
def test_index_follows_events_like_a_recount(seed):
    rng = random.Random(seed)
    nodes = {g.name: g.manifest for g in random_cluster(rng)}
    pods = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in random_pods(rng, list(nodes.values()))}
    offerings = [o for o in discover(nodes.values()) if o.resources]
    offerings.append(offering_from_config({"slug": "any-whole", "kind": "full", "tolerations": [{"operator": "Exists"}]}, 0))
    index = ClusterIndex()
    index.set_notebook(rng.choice(NOTEBOOKS))
    index.replace(nodes=list(nodes.values()), pods=[])
    assert_same(index, offerings, nodes, {}, f"seed {seed} start")
    live: dict = {}
    for key, pod in pods.items():
        live[key] = pod
        index.pod_event("ADDED", pod)
    assert_same(index, offerings, nodes, live, f"seed {seed} pods added")
    for step in range(12):
        action = rng.choice(["delete-pod", "cordon", "relabel", "remove-node", "notebook", "finish-pod"])
        if action in ("delete-pod", "finish-pod") and live:
            key = rng.choice(sorted(live))
            if action == "finish-pod":
                done = copy.deepcopy(live.pop(key))
                done["status"]["phase"] = "Succeeded"
                index.pod_event("MODIFIED", done)
            else:
                index.pod_event("DELETED", live.pop(key))
        elif action == "cordon":
            name = rng.choice(sorted(nodes))
            nodes[name] = copy.deepcopy(nodes[name])
            nodes[name]["spec"]["unschedulable"] = not nodes[name]["spec"].get("unschedulable")
            index.node_event("MODIFIED", nodes[name])
        elif action == "relabel":
            name = rng.choice(sorted(nodes))
            nodes[name] = copy.deepcopy(nodes[name])
            nodes[name]["metadata"]["labels"]["nvidia.com/gpu.sharing-strategy"] = rng.choice(["none", "time-slicing"])
            index.node_event("MODIFIED", nodes[name])
        elif action == "remove-node" and len(nodes) > 1:
            name = rng.choice(sorted(nodes))
            index.node_event("DELETED", nodes.pop(name))
            for key in [k for k, p in live.items() if p["spec"]["nodeName"] == name]:
                index.pod_event("DELETED", live.pop(key))
        elif action == "notebook":
            index.set_notebook(rng.choice(NOTEBOOKS))
        assert_same(index, offerings, nodes, live, f"seed {seed} step {step} ({action})")


def test_cpu_only_pods_take_pod_slots_cpu_and_memory_in_the_index():
    node = {
        "metadata": {"name": "n", "labels": {}},
        "spec": {},
        "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "3", "nvidia.com/gpu.shared": "8"}},
    }
    share = offering_from_config({"slug": "s", "kind": "shared"}, 0)
    index = ClusterIndex()
    index.replace(nodes=[node], pods=[])
    assert index.availability(share).free == 3
    hog = {
        "metadata": {"name": "hog", "namespace": "batch"},
        "status": {"phase": "Running"},
        "spec": {"nodeName": "n", "containers": [{"name": "c", "resources": {"requests": {"cpu": "3", "memory": "7Gi"}}}]},
    }
    index.pod_event("ADDED", hog)
    assert index.availability(share).free == 2  # a pod slot gone
    assert index.used["n"] == {"cpu": 3000, "memory": 7 * 2**30, PODS: 1}
    index.set_notebook(Notebook.from_settings({"mem_guarantee": "1G"}))
    assert index.availability(share).free == 1  # 1 GiB of memory left
    index.set_notebook(Notebook.from_settings({"mem_guarantee": "2G"}))
    assert index.availability(share).free == 0


def test_a_reservation_holds_the_notebooks_cpu_memory_and_slot_too():
    node = {
        "metadata": {"name": "n", "labels": {}},
        "spec": {},
        "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110", "nvidia.com/gpu.shared": "8"}},
    }
    share = offering_from_config({"slug": "s", "kind": "shared"}, 0)
    index = ClusterIndex()
    index.set_notebook(Notebook.from_settings({"mem_guarantee": "3G"}))
    index.replace(nodes=[node], pods=[])
    assert index.availability(share).free == 2
    assert index.reserve("ns/a", share, 1) == "n"
    assert index.availability(share).free == 1
    assert index.reserve("ns/b", share, 1) == "n"
    assert index.reserve("ns/c", share, 1) is None  # no memory left for a third notebook
    index.replace(pods=[])  # a relist keeps what is reserved
    assert index.availability(share).free == 0
    index.release("ns/a")
    index.release("ns/b")
    assert index.availability(share).free == 2
