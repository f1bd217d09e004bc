"""DRA capacity truth where the node decides too (``dratruth --kind mixed``; issue 41).

Each state mixes what the scheduler applies to a DRA offering's pod besides its devices: DRA
nodes (H100s labelled as GPU Feature Discovery labels them, so the ``gpu.nvidia.com`` class's
``nvidia.com/gpu`` mapping serves a plain offering there; L4s) that are sometimes cordoned,
sometimes carry a node taint the offerings' pods do not tolerate, and sometimes have little cpu
left for a notebook (other users' pods requesting most of it); device taints in the driver's
slices (NoSchedule, or the informational None) and admins' ``DeviceTaintRule`` objects
(``resource.k8s.io/v1``) on a device or a whole pool; other users' claims holding some devices.
The hub's notebook asks for 1.5 cpu and 1 GiB beside its GPU, and every probe pod is the pod a
spawn makes (the notebook's requests, the offering's tolerations; a DRA offering's claim from
the spawner's own template). The offerings: the discovered DRA offerings, one variant of each
that tolerates the node taint, and the plain ``nvidia.com/gpu`` offering (the mapping).

    python -m gpuspawner.devcluster.dratruth --kind mixed --states 200
"""

from __future__ import annotations

import random
import urllib.error
from dataclasses import dataclass, field, replace
from typing import Any

from gpuspawner.capacity.counts import offering_pod
from gpuspawner.core.model import Offering
from gpuspawner.devcluster import dratruth
from gpuspawner.devcluster.dradriver import H100_80GB, L4, DraNode, node_devices
from gpuspawner.devcluster.dratruth import CLAIMS, MORE, Harness, claim_pod
from gpuspawner.devcluster.dratruth_extres import H100_LABEL, OFFERINGS, plain_pod
from gpuspawner.devcluster.truth import Result
from gpuspawner.dra.claimspec import claim_template, pod_claim
from gpuspawner.names.nvidia import PRODUCT_LABEL
from gpuspawner.pod.notebook import Notebook

RULES = "/apis/resource.k8s.io/v1/devicetaintrules"
#: The notebook beside the GPU: 1.5 cpu and 1 GiB (a node with 32 cpu, 31 of them requested, takes none).
NOTEBOOK = Notebook.from_settings({"cpu_guarantee": 1.5, "mem_guarantee": "1G"})
NODE_TAINT = {"key": "example.com/reserved", "value": "batch", "effect": "NoSchedule"}
TOLERATE_NODE_TAINT = {"key": "example.com/reserved", "operator": "Exists", "effect": "NoSchedule"}
DEVICE_TAINT_KEYS = ("gpu.nvidia.com/maintenance", "example.com/health")
#: Cores other users' pods request on a node (of its 32): room for 2, 1 or 0 notebooks, or plenty.
CPU_HOGS = (0.0, 0.0, 0.0, 29.0, 30.5, 31.0)


@dataclass
class MixedState(dratruth.State):
    cordoned: set[str] = field(default_factory=set)
    node_tainted: set[str] = field(default_factory=set)
    cpu_hog: dict[str, float] = field(default_factory=dict)
    #: DeviceTaintRules: (name, selector, taint).
    rules: list[tuple[str, dict[str, str], dict[str, str]]] = field(default_factory=list)


def draw_state(seed: int) -> MixedState:
    rng = random.Random(seed)
    nodes = []
    for i in range(rng.randint(2, 4)):
        if rng.random() < 0.55:
            spec = DraNode(f"m{seed}-h100-{i}", H100_80GB, rng.choice((1, 2, 4, 8)), labels={PRODUCT_LABEL: H100_LABEL})
        else:
            spec = DraNode(f"m{seed}-l4-{i}", L4, rng.choice((1, 2, 4)))
        taints = {}
        for device in node_devices(spec):
            if rng.random() < 0.2:
                taints[device["name"]] = (
                    {"key": rng.choice(DEVICE_TAINT_KEYS), "value": "x", "effect": rng.choice(("NoSchedule", "None"))},
                )
        nodes.append(replace(spec, taints=taints))
    state = MixedState(seed, nodes, {n.name: (1, 1) for n in nodes}, [])
    for spec in nodes:
        for device in node_devices(spec):
            if not spec.taints.get(device["name"]) and rng.random() < 0.25:
                state.held.append((spec.name, device["name"]))
        if rng.random() < 0.15:
            state.cordoned.add(spec.name)
        if rng.random() < 0.25:
            state.node_tainted.add(spec.name)
        state.cpu_hog[spec.name] = rng.choice(CPU_HOGS)
    for i in range(rng.choice((0, 1, 1, 2))):
        spec = rng.choice(nodes)
        selector = {"driver": "gpu.nvidia.com", "pool": spec.name}
        if rng.random() < 0.7:
            selector["device"] = rng.choice(node_devices(spec))["name"]
        taint = {"key": "example.com/drain", "value": f"r{i}", "effect": rng.choice(("NoSchedule", "NoSchedule", "None"))}
        state.rules.append((f"m{seed}-rule-{i}", selector, taint))
    return state


def _hog(name: str, node: str, cores: float) -> dict[str, Any]:
    pod = plain_pod(name, 1, {"kubernetes.io/hostname": node})
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": f"{int(cores * 1000)}m"}}
    pod["spec"]["tolerations"] = [{"operator": "Exists"}]
    return pod


def probe_pod(offering: Offering, name: str) -> dict[str, Any]:
    """The pod a spawn of one unit of ``offering`` makes, as the scheduler reads it: the notebook's requests
    beside its GPU (a DRA offering's claim from its template, else its extended resource), its tolerations."""
    spec = offering_pod(offering, NOTEBOOK)
    if offering.claim is not None:
        pod = claim_pod(name, pod_claim(offering.slug))
    else:
        pod = plain_pod(name, 1, dict(offering.node_selector))
    requests = {"cpu": f"{spec.requests['cpu']}m", "memory": str(spec.requests["memory"])}
    pod["spec"]["containers"][0].setdefault("resources", {})["requests"] = requests
    if offering.resources:
        pod["spec"]["containers"][0]["resources"]["requests"].update({k: str(v) for k, v in offering.resources.items()})
    pod["spec"]["tolerations"] = [dict(t) for t in spec.tolerations]
    return pod


class MixedHarness(Harness):
    """:class:`~gpuspawner.devcluster.dratruth.Harness` with cordons, node taints, cpu, device taints and DeviceTaintRules."""

    async def setup(self) -> None:
        await super().setup()
        self.inventory.index.set_notebook(NOTEBOOK)

    async def load(self, state: MixedState) -> None:  # type: ignore[override]
        self._delete_rules()
        await super().load(state)  # the nodes, the slices (with their device taints) and the held devices
        for spec in state.nodes:
            cores = state.cpu_hog[spec.name]
            if cores:
                self.kube.request("POST", "/api/v1/namespaces/team-a/pods", _hog(f"hog-{spec.name}", spec.name, cores))
        await self._until(lambda: all(p["spec"].get("nodeName") for p in self._pods("team-a")), "other users' pods bound", 180)
        for spec in state.nodes:  # after the other users' pods are bound: cordons and taints keep only new pods off
            patch: dict[str, Any] = {}
            if spec.name in state.cordoned:
                patch["unschedulable"] = True
            if spec.name in state.node_tainted:
                patch["taints"] = [NODE_TAINT]
            if patch:
                self.kube.request("PATCH", f"/api/v1/nodes/{spec.name}", {"spec": patch})
        for name, selector, taint in state.rules:
            rule = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule", "metadata": {"name": name}}
            self.kube.request("POST", RULES, {**rule, "spec": {"deviceSelector": selector, "taint": taint}})

    def _delete_rules(self) -> None:
        try:
            self.kube.request("DELETE", RULES)
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise

    def _inventory_sees(self) -> bool:
        index = self.inventory.index
        nodes = {n["metadata"]["name"]: n for n in self.kube.request("GET", "/api/v1/nodes")["items"]}
        if set(index.nodes) != set(nodes):
            return False
        for name, raw in nodes.items():
            facts = index.nodes[name]
            if facts.unschedulable != bool(raw["spec"].get("unschedulable")) or len(facts.taints) != len(raw["spec"].get("taints") or []):
                return False
        rules = {r["metadata"]["name"] for r in self.kube.request("GET", RULES)["items"]}
        bound = {
            f"{p['metadata']['namespace']}/{p['metadata']['name']}"
            for ns in ("team-a", "probe")
            for p in self._pods(ns)
            if p["spec"].get("nodeName")
        }
        return super()._inventory_sees() and {k.split("/", 1)[1] for k in index.dra.rules} == rules and bound == set(index.pods)

    def offerings(self, state: Any) -> list[Offering]:
        found = list(self.inventory.index.dra.discovered())
        tolerant = [replace(o, slug=f"t-{o.slug}"[:63], tolerations=(*o.tolerations, TOLERATE_NODE_TAINT)) for o in found]
        return found + tolerant + [OFFERINGS[1]]

    async def check(self, state: MixedState) -> list[Result]:  # type: ignore[override]
        await self._until(self._inventory_sees, "the inventory to see the state")
        results = []
        for offering in self.offerings(state):
            predicted = self.inventory.index.availability(offering).free or 0
            if offering.claim is not None:
                template = claim_template(offering.claim, 1, offering.slug, {}, {})
                self.kube.request("POST", "/apis/resource.k8s.io/v1/namespaces/probe/resourceclaimtemplates", template)
            # The fitting probes first, then the ones that must be refused (see dratruth_extres' kube-scheduler leak).
            for batch in (range(predicted), range(predicted, predicted + MORE)):
                for i in batch:
                    self.kube.request("POST", "/api/v1/namespaces/probe/pods", probe_pod(offering, f"{offering.slug[:40]}-{i}"))
                await self._until(self._probes_settled, "every probe pod bound or refused", 180)
            results.append(Result(state.seed, offering.slug, predicted, await self.placed()))
            await self._clear("probe")
            if offering.claim is not None:
                self.kube.request("DELETE", f"/apis/resource.k8s.io/v1/namespaces/probe/resourceclaimtemplates/{offering.slug}")
            await self._until(self._inventory_sees, "the inventory to see the probes gone")
        return results


#: What ``dratruth --kind mixed`` runs (``dratruth.KINDS``).
HARNESSES = {"mixed": (MixedHarness, draw_state)}
__all__ = ["CLAIMS", "HARNESSES", "MixedHarness", "MixedState", "draw_state", "probe_pod"]
