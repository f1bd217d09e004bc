"""A running notebook's node is never consolidated by the real Karpenter (issue 42): GPUSpawner's pod
carries ``karpenter.sh/do-not-disrupt`` (the trait ``block_node_disruption``, on by default), so
on a pool that consolidates underused nodes (``WhenEmptyOrUnderutilized``) Karpenter says the
node is blocked and leaves it; once the server stops (its pod deleted, as KubeSpawner's stop
does) the emptied node goes. The same notebook with the trait off is evicted and its node
removed: the setup is one Karpenter does consolidate. Waits on Karpenter's events and objects,
never on a fixed time."""

from __future__ import annotations

import os
import urllib.error
from typing import Any

from jupyterhub.objects import Hub
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.config import kube_config
from traitlets.config import Config

from gpuspawner.devcluster.karpenter import POOLS, node_pool
from gpuspawner.spawner import GPUSpawner
from tests.conftest import wait_for
from tests.integration.test_spawner import User

POOL = "consolidating-h100"
NODECLAIMS = "/apis/karpenter.sh/v1/nodeclaims"
SELECTOR = {"karpenter.sh/nodepool": POOL}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def consolidating_pool() -> dict[str, Any]:
    """The devcluster's H100 pool under another name, consolidating underused nodes at once."""
    body = node_pool(next(p for p in POOLS if p.name == "gpu-h100"), consolidate_after="0s")
    body["metadata"]["name"] = POOL
    body["spec"]["disruption"] = {
        "consolidationPolicy": "WhenEmptyOrUnderutilized",
        "consolidateAfter": "0s",
        "budgets": [{"nodes": "100%"}],
    }
    return body


def plain_pod(name: str, gpus: int, do_not_disrupt: bool = False) -> dict[str, Any]:
    notes = {"karpenter.sh/do-not-disrupt": "true"} if do_not_disrupt else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": notes},
        "spec": {
            "containers": [{"name": "c", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
            "nodeSelector": SELECTOR,
            "tolerations": [GPU_TOLERATION],
        },
    }


async def notebook_pod(cluster, ns: str, block: bool) -> dict[str, Any]:
    """GPUSpawner's own pod manifest for a notebook of one H100 on the pool (``block``: the trait)."""
    os.environ.update(cluster.env())  # KubeSpawner loads the default kubeconfig (it only builds the manifest here)
    kube_config.KUBE_CONFIG_DEFAULT_LOCATION = str(cluster.kubeconfig)
    config = Config()
    config.KubeSpawner.namespace = ns
    config.KubeSpawner.image = "quay.io/jupyter/base-notebook:latest"
    config.KubeSpawner.node_selector = SELECTOR
    config.KubeSpawner.tolerations = [GPU_TOLERATION]
    config.KubeSpawner.extra_resource_limits = {"nvidia.com/gpu": "1"}
    config.KubeSpawner.extra_resource_guarantees = {"nvidia.com/gpu": "1"}
    config.GPUSpawner.block_node_disruption = block
    spawner = GPUSpawner(hub=Hub(), user=User(f"nb{int(block)}"), config=config)
    spawner.server = spawner.user.server
    pod = await spawner.get_pod_manifest()
    async with ApiClient() as client:
        body: dict[str, Any] = client.sanitize_for_serialization(pod)
    return body


def running_node(kube, ns: str, name: str) -> str:
    pod = kube.request("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
    return pod["spec"].get("nodeName", "") if pod["status"].get("phase") == "Running" else ""


def claim_of(kube, node: str) -> dict[str, Any] | None:
    return next((c for c in kube.request("GET", NODECLAIMS)["items"] if (c.get("status") or {}).get("nodeName") == node), None)


def gone(kube, path: str) -> bool:
    try:
        kube.request("GET", path)
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return True
        raise
    return False


def blocked_by(kube, node: str, pod: str) -> list[str]:
    """Karpenter's DisruptionBlocked events on ``node`` that name ``pod``'s do-not-disrupt annotation."""
    events = kube.request("GET", f"/api/v1/events?fieldSelector=involvedObject.kind%3DNode,involvedObject.name%3D{node}")["items"]
    return [
        e["message"] for e in events if e.get("reason") == "DisruptionBlocked" and "do-not-disrupt" in e["message"] and pod in e["message"]
    ]


def notebook_on_its_own_node(kube, ns: str, body: dict[str, Any]) -> str:
    """With the anchor's node filled by a 7-GPU pod, the notebook gets a node of its own; the
    filler then goes, so the notebook's one GPU would fit beside the anchor: consolidation's case."""
    kube.request("POST", f"/api/v1/namespaces/{ns}/pods", plain_pod("filler", 7))
    wait_for(lambda: running_node(kube, ns, "filler"), "the filler running beside the anchor", timeout=120)
    name = body["metadata"]["name"]
    kube.request("POST", f"/api/v1/namespaces/{ns}/pods", body)
    node = wait_for(lambda: running_node(kube, ns, name), f"notebook {name} running on a new node", timeout=180)
    kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods/filler?gracePeriodSeconds=0")
    wait_for(lambda: gone(kube, f"/api/v1/namespaces/{ns}/pods/filler"), "the filler gone", timeout=60)
    return str(node)


async def test_a_running_notebooks_node_is_not_consolidated_and_goes_once_it_stops(cluster, kube, ns):
    cluster.karpenter().apply(consolidating_pool())
    try:
        # the anchor: a pod Karpenter may not move, on the pool's first node (where a notebook would fit)
        kube.request("POST", f"/api/v1/namespaces/{ns}/pods", plain_pod("anchor", 1, do_not_disrupt=True))
        anchor_node = wait_for(lambda: running_node(kube, ns, "anchor"), "the anchor on a node Karpenter made", timeout=180)

        # trait off: Karpenter consolidates, evicting the notebook and removing its node
        loose = await notebook_pod(cluster, ns, block=False)
        assert "karpenter.sh/do-not-disrupt" not in loose["metadata"].get("annotations", {})
        node = notebook_on_its_own_node(kube, ns, loose)
        assert node != anchor_node
        wait_for(lambda: claim_of(kube, node) is None, "Karpenter consolidating the node of a notebook without the annotation", timeout=240)
        wait_for(lambda: gone(kube, f"/api/v1/namespaces/{ns}/pods/{loose['metadata']['name']}"), "the evicted notebook gone", timeout=60)

        # trait on (the default): blocked while it runs, and the node still serves it
        kept = await notebook_pod(cluster, ns, block=True)
        assert kept["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
        name = kept["metadata"]["name"]
        node = notebook_on_its_own_node(kube, ns, kept)
        wait_for(lambda: blocked_by(kube, node, name), "Karpenter's DisruptionBlocked event naming the notebook", timeout=240)
        assert claim_of(kube, node) is not None and running_node(kube, ns, name) == node

        # the server stops (KubeSpawner's stop deletes the pod): the emptied node goes
        kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}")
        wait_for(lambda: claim_of(kube, node) is None, "Karpenter removing the emptied node", timeout=240)
        assert claim_of(kube, anchor_node) is not None  # the anchor's node, blocked, stays
    finally:
        kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods/anchor?gracePeriodSeconds=0")
        kube.request("DELETE", f"/apis/karpenter.sh/v1/nodepools/{POOL}")
