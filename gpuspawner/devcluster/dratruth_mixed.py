"""DRA capacity truth where the node decides too (``dratruth --kind mixed``; issue 41).

Each state mixes what the scheduler applies to a DRA offering's pod besides its devices: DRA
nodes (H100s labelled as GPU Feature Discovery labels them, so the ``gpu.nvidia.com`` class's
``nvidia.com/gpu`` mapping serves a plain offering there; L4s) that are sometimes cordoned,
sometimes carry a node taint the offerings' pods do not tolerate, and sometimes have little cpu
left for a notebook (other users' pods requesting most of it); device taints in the driver's
slices (NoSchedule, or the informational None) and admins' ``DeviceTaintRule`` objects
(``resource.k8s.io/v1``) on a device or a whole pool; other users' claims holding some devices.
Some states add an A100 node partitioned on demand (dynamic MIG: other users' requests for
random profiles, some stopped again) with a "this, or else that" offering over two of its
profiles (``firstAvailable``, counted in the allocator's order); an L40S node shared by memory
(NVIDIA's ``--consumable-shares=memory``); and a second driver (``gpu.example.com``) publishing
devices of the same names in the same pool on an existing node, with a DeviceClass that maps
``example.com/gpu`` (a second extended-resource class). A DeviceTaintRule without a driver
then taints both drivers' devices of its pool, as the scheduler's slice tracker applies it.
The hub's notebook asks for 1.5 cpu and 1 GiB beside its GPU, and every probe pod is the pod a
spawn makes (the notebook's requests, the offering's tolerations; a DRA offering's claim from
the spawner's own template). The offerings: the discovered DRA offerings (three of the dynamic
MIG profiles), a variant of two of them that tolerates the node taint, the alternatives, the
second driver's class, and the plain ``nvidia.com/gpu`` (and ``example.com/gpu``) offerings.

    python -m gpuspawner.devcluster.dratruth --kind mixed --states 200
"""

from __future__ import annotations

import random
import urllib.error
from dataclasses import dataclass, field, replace
from typing import Any

from gpuspawner.capacity.counts import offering_pod
from gpuspawner.capacity.snapshot import snapshot_index
from gpuspawner.core.model import DeviceClaim, Offering
from gpuspawner.devcluster import dratruth, dratruth_counters
from gpuspawner.devcluster.dradriver import A100_40GB, H100_80GB, L4, L40S, DraNode, node_devices, resource_slices
from gpuspawner.devcluster.dratruth import CLAIMS, MORE, Harness, claim_pod
from gpuspawner.devcluster.dratruth_extres import H100_LABEL, OFFERINGS, plain_pod
from gpuspawner.devcluster.truth import Result
from gpuspawner.dra.claimspec import claim_template, pod_claim
from gpuspawner.names.nvidia import PRODUCT_LABEL
from gpuspawner.names.vocabulary import Kind
from gpuspawner.offerings.config import offering_from_config
from gpuspawner.pod.notebook import Notebook

RULES = "/apis/resource.k8s.io/v1/devicetaintrules"
#: The DRA objects the CLI lists, by the name the index gives them.
DRA_LISTS = {"slices": "resourceslices", "classes": "deviceclasses", "claims": "resourceclaims", "rules": "devicetaintrules"}
#: The notebook beside the GPU: 1.5 cpu and 1 GiB (a node with 32 cpu, 31 of them requested, takes none).
NOTEBOOK = Notebook.from_settings({"cpu_guarantee": 1.5, "mem_guarantee": "1G"})
NODE_TAINT = {"key": "example.com/reserved", "value": "batch", "effect": "NoSchedule"}
TOLERATE_NODE_TAINT = {"key": "example.com/reserved", "operator": "Exists", "effect": "NoSchedule"}
DEVICE_TAINT_KEYS = ("gpu.nvidia.com/maintenance", "example.com/health")
#: The second driver, its DeviceClass and the extended resource that class maps.
OTHER_DRIVER = "gpu.example.com"
OTHER_CLASS = "example.gpu"
OTHER_RESOURCE = "example.com/gpu"
OTHER_OFFERINGS = (
    Offering(slug="example-dra", kind=Kind.FULL, display_name="Example GPU (DRA)", claim=DeviceClaim(OTHER_CLASS)),
    Offering(slug="example-plain", kind=Kind.FULL, display_name="Example GPU", resources={OTHER_RESOURCE: 1}),
)
#: Pairs of dynamic MIG profiles for the "this, or else that" offering.
ALTERNATIVES = (("3g.20gb", "1g.5gb"), ("2g.10gb", "1g.5gb"), ("3g.20gb", "2g.10gb"), ("4g.20gb", "1g.10gb"), ("7g.40gb", "3g.20gb"))
#: Cores other users' pods request on a node (of its 32): room for 2, 1 or 0 notebooks, or plenty.
CPU_HOGS = (0.0, 0.0, 0.0, 29.0, 30.5, 31.0)


@dataclass
class MixedState(dratruth.State):
    cordoned: set[str] = field(default_factory=set)
    node_tainted: set[str] = field(default_factory=set)
    cpu_hog: dict[str, float] = field(default_factory=dict)
    #: DeviceTaintRules: (name, selector, taint).
    rules: list[tuple[str, dict[str, str], dict[str, str]]] = field(default_factory=list)
    #: Other users' dynamic MIG requests and which of them stop again (as dratruth_counters.State).
    asks: list[tuple[str, int, str]] = field(default_factory=list)
    stops: set[int] = field(default_factory=set)
    #: The node on which the second driver publishes devices of the same names ("": none).
    other_driver: str = ""
    #: The alternatives offering's (first, second) profile, where there is a dynamic MIG node.
    alternatives: tuple[str, str] | None = None
    #: The discovered offerings probed (dynamic MIG has many) and those probed with the node taint tolerated too.
    picks: int = 0


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
    if rng.random() < 0.35:
        nodes.append(DraNode(f"m{seed}-dynmig", A100_40GB, rng.choice((1, 2)), dynamic_mig=True))
    if rng.random() < 0.3:
        nodes.append(DraNode(f"m{seed}-l40s", L40S, rng.choice((1, 2)), shares="memory"))
    state = MixedState(seed, nodes, {n.name: (1, n.gpus if n.dynamic_mig else 1) for n in nodes}, [])
    state.picks = rng.randrange(1 << 30)
    for spec in nodes:
        if spec.dynamic_mig:
            profiles = tuple(dratruth_counters.PROFILES)
            state.asks += [(spec.name, m, rng.choice(profiles)) for m in range(spec.gpus) for _ in range(rng.randint(0, 4))]
            state.alternatives = rng.choice(ALTERNATIVES)
    rng.shuffle(state.asks)
    state.stops = {i for i in range(len(state.asks)) if rng.random() < 0.3}
    whole = [n for n in nodes if not n.dynamic_mig and not n.shares]
    if whole and rng.random() < 0.4:
        state.other_driver = rng.choice(whole).name
    for spec in nodes:
        for device in node_devices(spec):
            if not spec.dynamic_mig and not spec.taints.get(device["name"]) and rng.random() < 0.25:
                state.held.append((spec.name, device["name"]))
        if rng.random() < 0.15:
            state.cordoned.add(spec.name)
        if rng.random() < 0.25:
            state.node_tainted.add(spec.name)
        state.cpu_hog[spec.name] = rng.choice(CPU_HOGS)
    for i in range(rng.choice((0, 1, 1, 2))):
        spec = next(n for n in nodes if n.name == state.other_driver) if state.other_driver and rng.random() < 0.5 else rng.choice(nodes)
        selector = (
            {"pool": spec.name}
            if spec.name == state.other_driver and rng.random() < 0.5
            else {"driver": "gpu.nvidia.com", "pool": spec.name}
        )
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
    if offering.resources:  # the offering's extended resources, as limits (requests equal them)
        pod["spec"]["containers"][0]["resources"]["limits"] = {k: str(v) for k, v in offering.resources.items()}
    pod["spec"]["tolerations"] = [dict(t) for t in spec.tolerations]
    return pod


class MixedHarness(Harness):
    """:class:`~gpuspawner.devcluster.dratruth.Harness` with cordons, node taints, cpu, device taints and DeviceTaintRules."""

    async def setup(self) -> None:
        await super().setup()
        self.inventory.index.set_notebook(NOTEBOOK)
        expression = f"device.driver == '{OTHER_DRIVER}'"
        other = {
            "metadata": {"name": OTHER_CLASS},
            "spec": {"selectors": [{"cel": {"expression": expression}}], "extendedResourceName": OTHER_RESOURCE},
        }
        self.kube.request(
            "POST", "/apis/resource.k8s.io/v1/deviceclasses", {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", **other}
        )

    async def load(self, state: MixedState) -> None:  # type: ignore[override]
        self._delete_rules()
        await super().load(state)  # the nodes, the slices (with their device taints) and the held devices
        await dratruth_counters.Harness._ask(self, state)  # type: ignore[arg-type]  # other users' dynamic MIG requests
        if state.other_driver:  # a second driver's pool of the same name and device names on that node
            spec = next(n for n in state.nodes if n.name == state.other_driver)
            for raw in resource_slices(spec.name, [{k: v for k, v in d.items() if k != "taints"} for d in node_devices(spec)]):
                raw["metadata"]["name"] = raw["metadata"]["name"].replace("gpu.nvidia.com", OTHER_DRIVER)
                raw["spec"]["driver"] = OTHER_DRIVER
                self.kube.request("POST", "/apis/resource.k8s.io/v1/resourceslices", raw)
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

    def _snapshot(self) -> Any:
        """The counts ``gpuspawner offerings`` gives now: the hub's index fed one list of every object."""
        base = "/apis/resource.k8s.io/v1"
        lists = {kind: self.kube.request("GET", f"{base}/{path}")["items"] for kind, path in DRA_LISTS.items()}
        nodes = self.kube.request("GET", "/api/v1/nodes")["items"]
        return snapshot_index(nodes, self.kube.request("GET", "/api/v1/pods")["items"], lists, NOTEBOOK)

    def offerings(self, state: Any) -> list[Offering]:
        found = list(self.inventory.index.dra.discovered())
        rng = random.Random(state.picks)
        dynamic = [o for o in found if o.claim is not None and "MIG" in o.display_name and any(n.dynamic_mig for n in state.nodes)]
        found = [o for o in found if o not in dynamic] + rng.sample(dynamic, min(3, len(dynamic)))
        tolerant = [
            replace(o, slug=f"t-{o.slug}"[:63], tolerations=(*o.tolerations, TOLERATE_NODE_TAINT))
            for o in rng.sample(found, min(2, len(found)))
        ]
        extra = []
        if state.alternatives:
            first, second = state.alternatives
            entry = {
                "slug": f"mig-{first}-or-{second}".replace(".", "-"),
                "kind": "mig",
                "display_name": f"A100 · MIG {first}, else {second}",
                "product": A100_40GB.name,
                "profile": first,
                "dra": {"alternatives": [{"profile": second}]},
            }
            extra.append(offering_from_config(entry, 0))
        if state.other_driver:
            extra += list(OTHER_OFFERINGS)
        return found + tolerant + extra + [OFFERINGS[1]]

    async def check(self, state: MixedState) -> list[Result]:  # type: ignore[override]
        await self._until(self._inventory_sees, "the inventory to see the state")
        cli = self._snapshot()  # what `gpuspawner offerings` counts from one list of the cluster
        results = []
        for offering in self.offerings(state):
            predicted = self.inventory.index.availability(offering).free or 0
            from_cli = cli.availability(offering).free or 0
            if offering.claim is not None:
                template = claim_template(offering.claim, 1, offering.slug, {}, {})
                self.kube.request("POST", "/apis/resource.k8s.io/v1/namespaces/probe/resourceclaimtemplates", template)
            # The fitting probes first, then the ones that must be refused (see dratruth_extres' kube-scheduler leak).
            for batch in (range(predicted), range(predicted, predicted + MORE)):
                for i in batch:
                    self.kube.request("POST", "/api/v1/namespaces/probe/pods", probe_pod(offering, f"{offering.slug[:40]}-{i}"))
                await self._until(self._probes_settled, "every probe pod bound or refused", 180)
            placed = await self.placed()
            results.append(Result(state.seed, offering.slug, predicted, placed))
            results.append(Result(state.seed, f"cli:{offering.slug}"[:63], from_cli, placed))
            await self._clear("probe")
            if offering.claim is not None:
                self.kube.request("DELETE", f"/apis/resource.k8s.io/v1/namespaces/probe/resourceclaimtemplates/{offering.slug}")
            await self._until(self._inventory_sees, "the inventory to see the probes gone")
        return results


#: What ``dratruth --kind mixed`` runs (``dratruth.KINDS``).
HARNESSES = {"mixed": (MixedHarness, draw_state)}
__all__ = ["CLAIMS", "HARNESSES", "MixedHarness", "MixedState", "draw_state", "probe_pod"]
