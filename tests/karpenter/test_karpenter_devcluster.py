"""The real Karpenter on the devcluster (gpuspawner/devcluster/karpenter.py), with every GPU pool at
zero nodes: `gpuspawner offerings` has each pool's offering, its limit, and the pools it cannot
use with the reason (gpuspawner/offerings/nodepools.py, gpuspawner/tools/pools.py); a pending GPU
pod makes Karpenter create a NodeClaim in the pool that fits, its kwok provider a Node with the
pool's GPU labels, taint and the instance type's allocatable, and the pod binds there; the
offerings' counts are then exact for that node and the pool says it has one."""

from __future__ import annotations

import json
from typing import Any

from gpuspawner.devcluster.karpenter import POOLS
from gpuspawner.tools import cli
from tests.conftest import wait_for
from tests.nodepools import unusable_pools

NODECLAIMS = "/apis/karpenter.sh/v1/nodeclaims"
H100 = "gpu-nvidia-h100-80gb-hbm3"


def gpu_pod(name: str, resource: str, selector: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {"name": "notebook", "image": "jupyter", "resources": {"requests": {resource: "1", "cpu": "1"}, "limits": {resource: "1"}}}
            ],
            "nodeSelector": selector,
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
    }


def true_conditions(obj: dict[str, Any]) -> set[str]:
    return {c["type"] for c in (obj.get("status") or {}).get("conditions") or [] if c.get("status") == "True"}


def registered_claim(kube, node_name: str) -> dict[str, Any] | None:
    """The NodeClaim whose node is ``node_name``, once Karpenter has launched, registered and initialized it."""
    claims = [c for c in kube.request("GET", NODECLAIMS)["items"] if (c.get("status") or {}).get("nodeName") == node_name]
    assert len(claims) <= 1
    return claims[0] if claims and {"Launched", "Registered", "Initialized"} <= true_conditions(claims[0]) else None


def offerings(cluster, capsys) -> tuple[str, dict[str, dict[str, Any]]]:
    """`gpuspawner offerings`' table and its --json rows by slug, from the live cluster."""
    assert cli.main(["offerings", "--kubeconfig", str(cluster.kubeconfig)]) == 0
    table = capsys.readouterr().out
    assert cli.main(["offerings", "--kubeconfig", str(cluster.kubeconfig), "--json"]) == 0
    return table, {row["slug"]: row for row in json.loads(capsys.readouterr().out)}


def test_pools_at_zero_nodes_offer_then_pending_gpu_pods_bring_up_their_nodes(cluster, kube, ns, capsys):
    assert kube.request("GET", "/api/v1/nodes?labelSelector=nvidia.com/gpu.present")["items"] == []  # every pool at zero
    unusable = unusable_pools()
    for extra in unusable:
        cluster.karpenter().apply(extra)
    try:
        table, rows = offerings(cluster, capsys)
    finally:
        for extra in unusable:
            kube.request("DELETE", f"/apis/karpenter.sh/v1/nodepools/{extra['metadata']['name']}")
    assert "Autoscaled pools (Karpenter NodePools):" in table
    for pool in POOLS:
        assert f"  {pool.name}: " in table
    assert rows[H100]["pools"] == [{"name": "gpu-h100", "limit": 4, "nodes": 0, "room": 4}]
    assert (rows[H100]["capacity"], rows[H100]["free"]) == (0, 0)  # no node yet: nothing free now, exactly
    assert f"gpu-h100: {H100}; up to 4 nodes, 0 now: can grow by 4" in table
    mig = [row for row in rows.values() if row["pools"] and row["pools"][0]["name"] == "gpu-a100-mig"]
    assert sorted(next(iter(r["limits"])) for r in mig) == ["nvidia.com/mig-1g.5gb", "nvidia.com/mig-2g.10gb", "nvidia.com/mig-3g.20gb"]
    assert "  elsewhere: ignored: its node class KWOKNodeClass no-such-class (karpenter.kwok.sh) does not exist" in table
    assert "  cpu-only: ignored: no GPU: its template's labels say none" in table

    pods = {
        "h100": (gpu_pod("h100", "nvidia.com/gpu", {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}), "gpu-h100"),
        "mig": (gpu_pod("mig", "nvidia.com/mig-1g.5gb", {"nvidia.com/mig.strategy": "mixed"}), "gpu-a100-mig"),
    }
    for pod, _pool in pods.values():
        kube.request("POST", f"/api/v1/namespaces/{ns}/pods", pod)

    def running(name: str) -> dict[str, Any] | None:
        pod = kube.request("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
        return pod if pod["spec"].get("nodeName") and pod["status"].get("phase") == "Running" else None

    for name, (_pod, pool_name) in pods.items():
        pod = wait_for(lambda name=name: running(name), f"pod {name} Running on a node Karpenter made", timeout=180)
        node = kube.request("GET", f"/api/v1/nodes/{pod['spec']['nodeName']}")
        labels = node["metadata"]["labels"]
        assert labels["karpenter.sh/nodepool"] == pool_name
        pool = next(p for p in POOLS if p.name == pool_name)
        assert labels["node.kubernetes.io/instance-type"] == pool.instance_type
        assert labels["nvidia.com/gpu.present"] == "true"
        assert {"key": "nvidia.com/gpu", "effect": "NoSchedule"}.items() <= next(
            t for t in node["spec"]["taints"] if t["key"] == "nvidia.com/gpu"
        ).items()
        # (the pod may bind as soon as Karpenter lifts its unregistered taint, before it records the claim's progress)
        claim = wait_for(lambda node=node: registered_claim(kube, node["metadata"]["name"]), f"the NodeClaim of {name}'s node initialized")
        assert claim["metadata"]["labels"]["karpenter.sh/nodepool"] == pool_name
        assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"  # the devcluster's kwok runs it
        if name == "h100":
            assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
            assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        else:
            assert labels["nvidia.com/mig.strategy"] == "mixed"
            assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
            assert node["status"]["allocatable"]["nvidia.com/mig-1g.5gb"] == "2"
    table, rows = offerings(cluster, capsys)  # the node that exists now is counted exactly
    assert (rows[H100]["capacity"], rows[H100]["free"]) == (8, 7)
    assert rows[H100]["pools"] == [{"name": "gpu-h100", "limit": 4, "nodes": 1, "room": 3}]
    assert f"gpu-h100: {H100}; up to 4 nodes, 1 now: can grow by 3" in table
