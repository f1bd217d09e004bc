"""The real Karpenter on the devcluster: a pending GPU pod makes it create a NodeClaim in the pool
that fits, its kwok provider a Node with the pool's GPU labels, taint and the instance type's
allocatable, and the pod binds there (gpuspawner/devcluster/karpenter.py)."""

from __future__ import annotations

from typing import Any

from gpuspawner.devcluster.karpenter import POOLS
from tests.conftest import wait_for

NODECLAIMS = "/apis/karpenter.sh/v1/nodeclaims"


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


def test_pending_gpu_pods_bring_up_nodes_of_their_pools(kube, ns):
    assert kube.request("GET", "/api/v1/nodes?labelSelector=nvidia.com/gpu.present")["items"] == []  # every pool at zero
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
