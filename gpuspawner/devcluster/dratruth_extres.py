"""DRA capacity truth for the extended-resource mapping (``make dra-truth``, kind ``extres``).

Each state mixes device-plugin nodes (``nvidia.com/gpu`` in allocatable) with nodes the
simulated NVIDIA DRA driver serves (none in allocatable; the ``gpu.nvidia.com`` class maps
``nvidia.com/gpu``), some labelled by GPU Feature Discovery as H100 nodes, some not, some in
MIG (not mapped: the class selects whole GPUs). Other users already hold GPUs three ways:
plain ``nvidia.com/gpu`` pods on device-plugin nodes, plain ``nvidia.com/gpu`` pods on DRA
nodes (served through a claim the scheduler makes for each), and pods with claims of their
own. The inventory's free count of each plain ``nvidia.com/gpu`` offering (H100s by the
node label, and any GPU) and of each discovered DRA offering is then checked against the
real scheduler: that many one-GPU pods plus ``MORE`` are created and the bound ones counted.
A device that a scheduler-made claim holds must count once (taken), in both kinds of offering.

    python -m gpuspawner.devcluster.dratruth --kind extres --states 100
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any

from gpuspawner.core.model import Offering
from gpuspawner.devcluster.dradriver import A100_40GB, H100_80GB, L4, DraNode, SimulatedDriver, node_devices
from gpuspawner.devcluster.dratruth import MORE, Harness, claim_pod
from gpuspawner.devcluster.nodes import node_manifest
from gpuspawner.devcluster.truth import Result
from gpuspawner.names import dranames as dn
from gpuspawner.names.vocabulary import Kind

GPU = "nvidia.com/gpu"
PRODUCT_LABEL = "nvidia.com/gpu.product"
H100_LABEL = "NVIDIA-H100-80GB-HBM3"
HOST = {"cpu": "32", "memory": "256Gi", "pods": "110", "ephemeral-storage": "500Gi"}
#: Seconds the scheduler is given after plain pods on DRA nodes bind, before they are deleted.
SETTLE_S = 3.0
MIG_LAYOUT = (("3g.20gb", 0), ("3g.20gb", 4))

#: The plain offerings checked in every state: H100s by GPU Feature Discovery's label, and any GPU.
OFFERINGS = (
    Offering(slug="h100-plain", kind=Kind.FULL, display_name="H100", resources={GPU: 1}, node_selector={PRODUCT_LABEL: H100_LABEL}),
    Offering(slug="any-gpu-plain", kind=Kind.FULL, display_name="Any GPU", resources={GPU: 1}),
)


@dataclass
class PluginNode:
    name: str
    gpus: int
    product: str


@dataclass
class ExtresState:
    seed: int
    nodes: list[DraNode]
    plugin: list[PluginNode]
    #: plain nvidia.com/gpu pods of other users: (node, GPUs)
    plain: list[tuple[str, int]] = field(default_factory=list)
    #: other users' own claims: (node, device)
    held: list[tuple[str, str]] = field(default_factory=list)
    layout: dict[str, tuple[int, int]] = field(default_factory=dict)


def draw_state(seed: int) -> ExtresState:
    rng = random.Random(seed)
    nodes: list[DraNode] = []
    for i in range(rng.randint(1, 3)):
        pick = rng.random()
        if pick < 0.45:
            labels = {PRODUCT_LABEL: H100_LABEL} if rng.random() < 0.7 else {}
            nodes.append(DraNode(f"x{seed}-h100-{i}", H100_80GB, rng.choice((1, 2, 4)), labels=labels))
        elif pick < 0.85:
            nodes.append(DraNode(f"x{seed}-l4-{i}", L4, rng.choice((1, 2)), labels={PRODUCT_LABEL: "NVIDIA-L4"}))
        else:
            nodes.append(DraNode(f"x{seed}-a100-{i}", A100_40GB, 1, mig=MIG_LAYOUT, labels={PRODUCT_LABEL: "NVIDIA-A100-SXM4-40GB"}))
    plugin = [PluginNode(f"x{seed}-dp-{i}", rng.choice((1, 2, 4)), rng.choice((H100_LABEL, "Tesla-T4"))) for i in range(rng.randint(0, 2))]
    state = ExtresState(seed, nodes, plugin)
    whole: list[tuple[str, int]] = [(n.name, n.gpus) for n in nodes if not n.mig] + [(p.name, p.gpus) for p in plugin]
    for name, gpus in whole:
        if rng.random() < 0.5:
            state.plain.append((name, rng.randint(1, gpus)))
    for n in nodes:
        state.layout[n.name] = (1, rng.choice((1, 1, 2)))
        used = sum(c for name, c in state.plain if name == n.name)
        for dev in node_devices(n)[used:]:
            if rng.random() < 0.25:
                state.held.append((n.name, dev["name"]))
    return state


def plain_pod(name: str, gpus: int, node_selector: dict[str, str]) -> dict[str, Any]:
    """A pod asking for ``gpus`` of ``nvidia.com/gpu`` (as KubeSpawner makes a device-plugin offering's)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": node_selector,
            "containers": [{"name": "notebook", "image": "quay.io/jupyter/base-notebook", "resources": {"limits": {GPU: str(gpus)}}}],
        },
    }


class ExtresHarness(Harness):
    """:class:`~gpuspawner.devcluster.dratruth.Harness` with device-plugin nodes and plain GPU pods beside the DRA nodes."""

    plugin_nodes: list[str]

    async def load(self, state: ExtresState) -> None:  # type: ignore[override]
        await self._clear("probe")
        await self._clear("team-a")
        for name in getattr(self, "plugin_nodes", []):
            self._ignore_missing(f"/api/v1/nodes/{name}")
        if self.driver is not None:
            self.driver.uninstall()
        self.driver = SimulatedDriver(self.kube, state.nodes)
        self.driver.install()
        for spec in state.nodes:
            _generation, slices = state.layout[spec.name]
            if slices > 1:
                self.driver.publish(spec.name, node_devices(spec), generation=1, slice_count=slices)
        self.plugin_nodes = []
        for i, plugin_node in enumerate(state.plugin):
            entry = {
                "name": plugin_node.name,
                "x-gpuspawner-class": "dp",
                "allocatable": {**HOST, GPU: str(plugin_node.gpus)},
                "labels": {PRODUCT_LABEL: plugin_node.product},
            }
            self.kube.create_node(node_manifest(entry, 251 * 256 + i))
            self.plugin_nodes.append(plugin_node.name)
        await self._until(lambda: all(self._node_ready(n) for n in self.plugin_nodes), "device-plugin nodes Ready")
        for i, (node, gpus) in enumerate(state.plain):
            self.kube.request("POST", "/api/v1/namespaces/team-a/pods", plain_pod(f"plain-{i}", gpus, {"kubernetes.io/hostname": node}))
        for i, (node, device) in enumerate(state.held):
            spec_of = next(s for s in state.nodes if s.name == node)
            uuid = next(d["attributes"]["uuid"]["string"] for d in node_devices(spec_of) if d["name"] == device)
            kind = "mig.nvidia.com" if "-mig-" in device else "gpu.nvidia.com"
            selector = {"cel": {"expression": f"device.attributes['{dn.DRIVER}'].uuid == '{uuid}'"}}
            spec: dict[str, Any] = {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": kind, "selectors": [selector]}}]}
            }
            body = {"apiVersion": dn.RESOURCE_API, "kind": "ResourceClaim", "metadata": {"name": f"held-{i}"}, "spec": spec}
            self.kube.request("POST", "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims", body)
            self.kube.request("POST", "/api/v1/namespaces/team-a/pods", claim_pod(f"held-{i}", {"resourceClaimName": f"held-{i}"}))
        await self._until(lambda: all(p["spec"].get("nodeName") for p in self._pods("team-a")), "other users' pods bound", 180)
        await self._until(self._plain_claims_made, "the scheduler's claims of the plain pods on DRA nodes")

    def _plain_claims_made(self) -> bool:
        """Every plain pod on a DRA node names the claim the scheduler made for it (PreBind wrote it before binding)."""
        plugin = set(self.plugin_nodes)
        return all(
            (p.get("status") or {}).get("extendedResourceClaimStatus")
            for p in self._pods("team-a")
            if p["metadata"]["name"].startswith("plain-") and p["spec"].get("nodeName") not in plugin
        )

    def _node_ready(self, name: str) -> bool:
        conditions = (self.kube.request("GET", f"/api/v1/nodes/{name}").get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    def _ignore_missing(self, path: str) -> None:
        import urllib.error

        try:
            self.kube.request("DELETE", path)
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise

    def _inventory_sees(self) -> bool:
        nodes = {n["metadata"]["name"] for n in self.kube.request("GET", "/api/v1/nodes")["items"]}
        bound = {
            f"{p['metadata']['namespace']}/{p['metadata']['name']}"
            for ns in ("team-a", "probe")
            for p in self._pods(ns)
            if p["spec"].get("nodeName")
        }
        index = self.inventory.index
        return super()._inventory_sees() and set(index.nodes) == nodes and bound <= set(index.pods)

    async def check(self, state: ExtresState) -> list[Result]:  # type: ignore[override]
        results = await super().check(state)  # type: ignore[arg-type]  # the discovered DRA offerings
        for offering in OFFERINGS:
            predicted = self.inventory.index.availability(offering).free or 0
            result = Result(state.seed, offering.slug, predicted, await self._place(offering, predicted + MORE))
            if not result.agrees:  # a scheduler cache a moment behind the last deletions (as truth.py): once more
                result = Result(state.seed, offering.slug, predicted, await self._place(offering, predicted + MORE), retried=True)
            results.append(result)
        return results

    async def _place(self, offering: Offering, count: int) -> int:
        """Create ``count`` one-GPU pods of ``offering``; how many does the scheduler bind? (The probes are gone after.)"""
        for i in range(count):
            self.kube.request("POST", "/api/v1/namespaces/probe/pods", plain_pod(f"{offering.slug}-{i}", 1, dict(offering.node_selector)))
        await self._until(self._probes_settled, "every probe pod bound or refused", 180)
        pods = self._pods("probe")
        placed = sum(1 for p in pods if p["spec"].get("nodeName"))
        if any((p.get("status") or {}).get("extendedResourceClaimStatus") for p in pods):
            # Deleting pods the scheduler made claims for straight after they bound left the next
            # batch's plain pods refused on free devices in ~5% of states (kube-scheduler 1.36.3),
            # and not retried before the unschedulable flush: give it a moment first.
            await asyncio.sleep(SETTLE_S)
        await self._clear("probe")
        await self._until(self._inventory_sees, "the inventory to see the probes gone")
        return placed


HARNESS = ExtresHarness
