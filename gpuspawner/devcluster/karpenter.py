"""Karpenter on the devcluster: the real autoscaler with its kwok cloud provider, built from its Go
module (``sigs.k8s.io/karpenter``, its ``kwok`` command) and run against the devcluster's
kube-apiserver, with GPU pools that start at zero nodes.

``gpuspawner devcluster up --karpenter`` (or ``DevCluster.up(karpenter=True)``) starts it after
the control plane:

1. Its CRDs, copied out of its module by ``build_karpenter`` (NodePool, NodeClaim, NodeOverlay,
   CapacityBuffer and the kwok provider's KWOKNodeClass), are applied server-side.
2. The instance types of :data:`POOLS` are written as the kwok provider reads them
   (``--instance-types-file-path``: a JSON list of ``name``, ``offerings`` with ``Price``,
   ``Available`` and ``Requirements``, ``architecture``, ``operatingSystems`` and ``resources``,
   the shape of kwok/cloudprovider/helpers.go's InstanceTypeOptions in its module).
3. The controller starts with the cluster's admin kubeconfig (``KUBECONFIG``: it has no flag for
   one), leader election off and its metrics and health ports free ones; ``up`` waits for its
   ``/readyz``.
4. One KWOKNodeClass and a NodePool per pool are applied: the nodes a pool makes carry the
   labels and taints of its class in ``nodes.yaml`` (GPU Feature Discovery's labels, the GPU
   taint), the pool's limit is a node count (``limits: {nodes: N}``).

A pending pod that fits a pool then makes Karpenter create a NodeClaim; the kwok provider
creates its Node (annotated ``kwok.x-k8s.io/node: fake``, so the devcluster's kwok runs it and
the pods bound to it), and Karpenter registers and initializes it. What its kwok provider gives
such a Node, as its source has it (kwok/cloudprovider/cloudprovider.go, ``toNode``): ``capacity``
is the NodeClaim's requests (what the pods that made it asked for), ``allocatable`` the instance
type's; readers of these nodes count ``allocatable``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gpuspawner.devcluster import build
from gpuspawner.devcluster.clusterstate import Controller, KubeHTTP, apply_crds, start_controller
from gpuspawner.devcluster.nodes import CLASS_LABEL, node_classes
from gpuspawner.devcluster.ports import free_ports

#: the process's key in the cluster's recorded pids, and its ports' keys
NAME = "karpenter"
PORTS = ("karpenter-metrics", "karpenter-health")
FIELD_MANAGER = "gpuspawner-devcluster"
#: the KWOKNodeClass every pool's nodes use
NODE_CLASS = "devcluster"
NODE_CLASS_GROUP = "karpenter.kwok.sh"
#: the one zone and capacity type of the instance types' offerings
ZONE = "devcluster-a"
CAPACITY_TYPE = "on-demand"


@dataclass(frozen=True)
class Pool:
    """One autoscaled GPU pool: a NodePool whose nodes are of ``node_class`` (``nodes.yaml``),
    one instance type ``instance_type`` priced ``price`` per hour (the demo's figure, not a
    quote), at most ``max_nodes`` nodes."""

    name: str
    node_class: str
    instance_type: str
    price: float
    max_nodes: int


#: The devcluster's GPU pools, each starting at zero nodes: eight H100s a node, an A100 in MIG
#: mixed mode (the balanced layout), a T4 time-sliced four ways.
POOLS = (
    Pool("gpu-h100", "h100-8x", "gpu-h100-8x", 40.0, 4),
    Pool("gpu-a100-mig", "a100-mig-balanced", "gpu-a100-mig", 4.1, 2),
    Pool("gpu-t4-ts", "t4-timeslice-shared", "gpu-t4-ts", 0.53, 3),
)


def _class(name: str) -> dict[str, Any]:
    for entry in node_classes():
        if entry["x-gpuspawner-class"] == name:
            return entry
    raise KeyError(f"no node class {name!r} in nodes.yaml")


def instance_types(pools: tuple[Pool, ...] = POOLS) -> list[dict[str, Any]]:
    """The kwok provider's instance types of ``pools``: each one's resources are its class's
    allocatable in ``nodes.yaml``, its one offering on demand in :data:`ZONE` at its price."""
    out = []
    for pool in pools:
        entry = _class(pool.node_class)
        requirements = [
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": [CAPACITY_TYPE]},
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [ZONE]},
        ]
        out.append(
            {
                "name": pool.instance_type,
                "offerings": [{"Price": pool.price, "Available": True, "Requirements": requirements}],
                "architecture": "amd64",
                "operatingSystems": ["linux"],
                "resources": {k: str(v) for k, v in entry["allocatable"].items()},
            }
        )
    return out


def node_class(registration_delay: str = "0s") -> dict[str, Any]:
    """The KWOKNodeClass of every pool; ``registration_delay`` models a cloud's boot time (the
    kwok provider waits that long before it creates the Node)."""
    return {
        "apiVersion": f"{NODE_CLASS_GROUP}/v1alpha1",
        "kind": "KWOKNodeClass",
        "metadata": {"name": NODE_CLASS},
        "spec": {"nodeRegistrationDelay": registration_delay},
    }


#: the startup taint of the demo's pools (``network=True``): a node takes no pod until
#: :func:`give_pod_networks` has given it a pod network and lifted it, as a CNI agent does
NETWORK_TAINT = {"key": "gpuspawner.dev/pod-network-unavailable", "value": "true", "effect": "NoSchedule"}


def node_pool(pool: Pool, consolidate_after: str = "30s", network: bool = False) -> dict[str, Any]:
    """The NodePool of ``pool``: its class's labels and taints on every node it makes, its one
    instance type, at most ``max_nodes`` nodes, emptied nodes removed after ``consolidate_after``;
    with ``network``, :data:`NETWORK_TAINT` as a startup taint (Karpenter leaves those to others)."""
    entry = _class(pool.node_class)
    labels = {k: str(v) for k, v in (entry.get("labels") or {}).items()}
    labels[CLASS_LABEL] = pool.node_class
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": pool.name},
        "spec": {
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeClassRef": {"group": NODE_CLASS_GROUP, "kind": "KWOKNodeClass", "name": NODE_CLASS},
                    "requirements": [
                        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": [pool.instance_type]},
                        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": [CAPACITY_TYPE]},
                    ],
                    "taints": [dict(t) for t in entry.get("taints") or []],
                    **({"startupTaints": [dict(NETWORK_TAINT)]} if network else {}),
                    "expireAfter": "Never",
                },
            },
            "limits": {"nodes": str(pool.max_nodes)},
            "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": consolidate_after},
        },
    }


class Karpenter(Controller):
    """The Karpenter controller of one devcluster (its state folder's ``karpenter/``)."""

    name = NAME

    def up(self, timeout: float = 120.0, registration_delay: str = "0s", pools: tuple[Pool, ...] = POOLS) -> None:
        """Build (if needed), install the CRDs, start the controller, apply the node class and
        the NodePools of ``pools``."""
        bins = build.build_karpenter()
        self.directory.mkdir(parents=True, exist_ok=True)
        for key, port in free_ports(PORTS).items():
            self.state.ports.setdefault(key, port)
        self.state.save()
        (self.directory / "instance-types.json").write_text(json.dumps(instance_types(pools), indent=1))
        apply_crds(self.client, (bins / "crds.yaml").read_text(), FIELD_MANAGER, timeout, "Karpenter")
        self.start(timeout)
        self.apply(node_class(registration_delay))
        for pool in pools:
            self.apply(node_pool(pool))

    def start(self, timeout: float = 120.0) -> None:
        """Start the controller (again, after :meth:`stop`) and wait until it is ready."""
        if self.running:
            return
        args = [
            str(build.karpenter_dir() / build.KARPENTER_FILES[0]),
            "--disable-leader-election=true",
            f"--metrics-port={self.state.ports['karpenter-metrics']}",
            f"--health-probe-port={self.state.ports['karpenter-health']}",
            f"--instance-types-file-path={self.directory / 'instance-types.json'}",
        ]
        ready = f"http://127.0.0.1:{self.state.ports['karpenter-health']}/readyz"
        start_controller(self.state, NAME, args, self.directory, ready, timeout, KUBECONFIG=str(self.kubeconfig))

    def apply(self, body: dict[str, Any]) -> Any:
        """Server-side apply of one of Karpenter's cluster-scoped objects (NodePool, KWOKNodeClass)."""
        group, version = body["apiVersion"].split("/")
        plural = body["kind"].lower() + "es" if body["kind"].endswith("Class") else body["kind"].lower() + "s"
        path = f"/apis/{group}/{version}/{plural}/{body['metadata']['name']}"
        return self.client.apply(f"{path}?fieldManager={FIELD_MANAGER}&force=true", json.dumps(body))


def give_pod_networks(client: KubeHTTP) -> list[str]:
    """Give each node Karpenter has registered that still has :data:`NETWORK_TAINT` one of the
    cluster's pod networks, then lift the taint (what a cloud's IPAM and CNI agent do; neither
    runs here): kwok then gives its pods loopback IPs a notebook server can bind to, never one of
    its default range. Returns the nodes' names."""
    named = []
    for node in client.request("GET", "/api/v1/nodes?labelSelector=karpenter.sh/registered%3Dtrue")["items"]:
        taints = node["spec"].get("taints") or []
        if not any(t.get("key") == NETWORK_TAINT["key"] for t in taints):
            continue
        spec: dict[str, Any] = {"taints": [t for t in taints if t.get("key") != NETWORK_TAINT["key"]]}
        if not node["spec"].get("podCIDR"):
            cidr = client.free_pod_cidr()
            spec.update(podCIDR=cidr, podCIDRs=[cidr])
        client.request("PATCH", f"/api/v1/nodes/{node['metadata']['name']}", {"spec": spec})
        named.append(node["metadata"]["name"])
    return named
