"""DRA capacity truth: free counts of DRA offerings against the real kube-scheduler's allocator.

For each state (a seed) the simulated NVIDIA DRA driver (:mod:`.dradriver`) publishes a random
set of nodes (H100s, L4s, A100s in MIG layouts; some pools split over several slices, some
republished at a newer generation), and other users' pods already hold random devices through
their own claims. A live :class:`gpuspawner.hub.inventory.Inventory` (list and watch of nodes,
pods, ResourceSlices, DeviceClasses and ResourceClaims) gives each discovered offering's free
count; then, offering by offering, that many pods plus ``MORE`` are created, each with its own
claim from the ResourceClaimTemplate a real spawn of the offering sends (the spawner's own
:func:`gpuspawner.dra.claimspec.claim_template`, referenced as its pods reference it), and the
real scheduler decides: the offering agrees when the pods it binds equal the free count.

    python -m gpuspawner.devcluster.dratruth --states 100          # make dra-truth
    python -m gpuspawner.devcluster.dratruth --seeds 0-3 --json F  # what the test runs
    python -m gpuspawner.devcluster.dratruth --kind dynamic-mig     # dynamic MIG (dratruth_counters)
    python -m gpuspawner.devcluster.dratruth --kind extres          # plain nvidia.com/gpu on DRA nodes (dratruth_extres)
    python -m gpuspawner.devcluster.dratruth --kind capacity       # GPU-memory shares (dratruth_shares)
    python -m gpuspawner.devcluster.dratruth --kind taints         # device taints and tolerations
    python -m gpuspawner.devcluster.dratruth --kind mixed          # the node's filters too (dratruth_mixed)

prints ``K of M offerings agree over N states`` and exits 1 if any disagrees.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpuspawner.core.model import Offering
from gpuspawner.devcluster.cluster import DevCluster
from gpuspawner.devcluster.clusterstate import KubeHTTP
from gpuspawner.devcluster.dradriver import A100_40GB, H100_80GB, L4, DraNode, SimulatedDriver, node_counter_sets, node_devices
from gpuspawner.devcluster.truth import Result, _seeds, on_devcluster
from gpuspawner.dra.claimspec import claim_template, container_claim, pod_claim
from gpuspawner.names import dranames as dn
from gpuspawner.names.vocabulary import CLAIM_NAME

MORE = 2
NAMESPACES = ("team-a", "probe")
#: Static MIG layouts of an A100-40GB, as (profile, placement start).
MIG_LAYOUTS = (
    (("2g.10gb", 0), ("1g.5gb", 2), ("1g.5gb", 3), ("3g.20gb", 4)),
    tuple(("1g.5gb", i) for i in range(7)),
    (("3g.20gb", 0), ("3g.20gb", 4)),
    (("7g.40gb", 0),),
)
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"


@dataclass
class State:
    seed: int
    nodes: list[DraNode]
    layout: dict[str, tuple[int, int]]  # node -> (generation, slice count)
    held: list[tuple[str, str]]  # other users' claims: (node, device)


def draw_state(seed: int) -> State:
    rng = random.Random(seed)
    nodes = []
    for i in range(rng.randint(2, 4)):
        pick = rng.random()
        if pick < 0.35:
            nodes.append(DraNode(f"s{seed}-h100-{i}", H100_80GB, rng.choice((1, 2, 4, 8))))
        elif pick < 0.65:
            nodes.append(DraNode(f"s{seed}-l4-{i}", L4, rng.choice((1, 2, 4))))
        else:
            nodes.append(DraNode(f"s{seed}-a100-{i}", A100_40GB, rng.choice((1, 2)), mig=rng.choice(MIG_LAYOUTS)))
    layout = {n.name: (rng.randint(1, 3), rng.choice((1, 1, 2, 3))) for n in nodes}
    held = []
    for n in nodes:
        for dev in published(n, layout[n.name][0]):
            if rng.random() < 0.3:
                held.append((n.name, dev["name"]))
    return State(seed, nodes, layout, held)


def published(spec: DraNode, generation: int) -> list[dict[str, Any]]:
    """The devices of ``spec``'s current generation: a newer generation has lost its last device
    (a GPU gone bad, say), so counting the old generation's slices shows as a disagreement."""
    devices = node_devices(spec)
    return devices[: max(1, len(devices) - 1)] if generation > 1 else devices


class Harness:
    """Loads states into one devcluster and checks each DRA offering against the scheduler."""

    def __init__(self, cluster: DevCluster, log: Callable[[str], object]):
        from kubespawner.clients import load_config, shared_client

        from gpuspawner.hub.inventory import Inventory

        load_config()
        self.kube: KubeHTTP = cluster.client()
        self.inventory = Inventory(shared_client("CoreV1Api"))
        self.log = log
        self.driver: SimulatedDriver | None = None

    async def setup(self) -> None:
        for ns in NAMESPACES:
            self.kube.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        await self._until(lambda: all(self._has_sa(ns) for ns in NAMESPACES), "default service accounts")
        self.inventory.start()
        if not await self.inventory.wait_ready(60):
            raise RuntimeError(f"the inventory did not sync: {self.inventory.last_error}")

    def _has_sa(self, ns: str) -> bool:
        try:
            self.kube.request("GET", f"/api/v1/namespaces/{ns}/serviceaccounts/default")
            return True
        except Exception:  # noqa: BLE001 - not there yet
            return False

    async def _until(self, check: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
            await asyncio.sleep(0.05)

    def _pods(self, ns: str) -> list[dict[str, Any]]:
        pods: list[dict[str, Any]] = self.kube.request("GET", f"/api/v1/namespaces/{ns}/pods")["items"]
        return pods

    def _claims(self) -> list[dict[str, Any]]:
        claims: list[dict[str, Any]] = self.kube.request("GET", "/apis/resource.k8s.io/v1/resourceclaims")["items"]
        return claims

    async def _clear(self, ns: str) -> None:
        self.kube.request("DELETE", f"/api/v1/namespaces/{ns}/pods?gracePeriodSeconds=0")
        self.kube.request("DELETE", CLAIMS.format(ns=ns))
        await self._until(lambda: not self._pods(ns) and not [c for c in self._claims() if c["metadata"]["namespace"] == ns], f"{ns} empty")

    async def load(self, state: State) -> None:
        await self._clear("probe")
        await self._clear("team-a")
        if self.driver is not None:
            self.driver.uninstall()
        self.driver = SimulatedDriver(self.kube, state.nodes)
        self.driver.install()
        for spec in state.nodes:
            generation, slices = state.layout[spec.name]
            counters = node_counter_sets(spec)  # partitionable devices' counter sets (dynamic MIG), if any
            if generation > 1:  # a driver restart mid-way: the old generation is still there, only the new one counts
                self.driver.publish(
                    spec.name, published(spec, generation), generation=generation, slice_count=slices, keep_old=True, counter_sets=counters
                )
            elif slices > 1:
                self.driver.publish(spec.name, node_devices(spec), generation=1, slice_count=slices, counter_sets=counters)
        # Other users hold some devices: one pod per device, pinned by a claim whose selector names its uuid.
        for i, (node, device) in enumerate(state.held):
            hold(self.kube, state.nodes, i, node, device)
        await self._until(lambda: all(p["spec"].get("nodeName") for p in self._pods("team-a")), "other users' pods bound", 180)

    def _inventory_sees(self) -> bool:
        dra = self.inventory.index.dra
        api = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in self._claims()}
        allocated = {f"{ns}/{n}" for (ns, n), c in api.items() if (c.get("status") or {}).get("allocation")}
        seen = {k for k, facts in dra.claims.items() if facts.devices}
        slices = {s["metadata"]["name"] for s in self.kube.request("GET", "/apis/resource.k8s.io/v1/resourceslices")["items"]}
        return dra.synced and allocated == seen and slices == {k.split("/", 1)[1] for k in dra.slices}

    async def check(self, state: State) -> list[Result]:
        await self._until(self._inventory_sees, "the inventory to see the state")
        results = []
        for offering in self.offerings(state):
            predicted = self.inventory.index.availability(offering).free or 0
            assert offering.claim is not None
            # The template a real spawn of one unit sends: the spawner's own builder (claimspec.claim_template).
            template = claim_template(offering.claim, 1, offering.slug, {}, {})
            self.kube.request("POST", "/apis/resource.k8s.io/v1/namespaces/probe/resourceclaimtemplates", template)
            for i in range(predicted + MORE):
                self.kube.request(
                    "POST",
                    "/api/v1/namespaces/probe/pods",
                    claim_pod(f"{offering.slug[:40]}-{i}", pod_claim(offering.slug)),
                )
            await self._until(self._probes_settled, "every probe pod bound or refused", 180)
            placed = await self.placed()
            results.append(Result(state.seed, offering.slug, predicted, placed))
            await self._clear("probe")
            self.kube.request("DELETE", f"/apis/resource.k8s.io/v1/namespaces/probe/resourceclaimtemplates/{offering.slug}")
            await self._until(self._inventory_sees, "the inventory to see the probes gone")
        return results

    async def placed(self) -> int:
        """How many probe pods the scheduler bound."""
        return sum(1 for p in self._pods("probe") if p["spec"].get("nodeName"))

    def offerings(self, state: Any) -> list[Offering]:
        """The offerings :meth:`check` tries: those the inventory discovers."""
        return self.inventory.index.dra.discovered()

    def _probes_settled(self, ns: str = "probe") -> bool:
        from gpuspawner.hub.scheduling import unschedulable_reason

        return all(p["spec"].get("nodeName") or unschedulable_reason(p) for p in self._pods(ns))


def pinned(uuid: str) -> str:
    """A selector for the device of ``uuid``; it asks whether a device has a uuid first, since a CEL error on a
    device without one (a dynamic MIG placement, not made yet) fails the pod's scheduling, not just that device."""
    attributes = f"device.attributes['{dn.DRIVER}']"
    return f"'{dn.ATTR_UUID}' in {attributes} && {attributes}.{dn.ATTR_UUID} == '{uuid}'"


def hold(kube: KubeHTTP, nodes: list[DraNode], i: int, node: str, device: str) -> None:
    """Another user's pod ``held-<i>`` in team-a, holding ``device`` of ``node`` through a claim of
    its own whose selector names the device's uuid."""
    spec_of = next(s for s in nodes if s.name == node)
    uuid = next(d["attributes"]["uuid"]["string"] for d in node_devices(spec_of) if d["name"] == device)
    kind = "mig.nvidia.com" if "-mig-" in device else "gpu.nvidia.com"
    selector = {"cel": {"expression": pinned(uuid)}}
    spec = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": kind, "selectors": [selector]}}]}}
    body = {"apiVersion": dn.RESOURCE_API, "kind": "ResourceClaim", "metadata": {"name": f"held-{i}"}, "spec": spec}
    kube.request("POST", CLAIMS.format(ns="team-a"), body)
    kube.request("POST", "/api/v1/namespaces/team-a/pods", claim_pod(f"held-{i}", {"resourceClaimName": f"held-{i}"}))


def claim_pod(name: str, claim_ref: dict[str, str]) -> dict[str, Any]:
    """A notebook-like pod whose one container uses the claim ``claim_ref`` names (resourceClaimName or
    resourceClaimTemplateName; :func:`~gpuspawner.dra.claimspec.pod_claim` as a spawned pod has it), under
    the claim name a spawned pod uses."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "resourceClaims": [{"name": CLAIM_NAME, **claim_ref}],
            "containers": [{"name": "notebook", "image": "quay.io/jupyter/base-notebook", "resources": {"claims": [container_claim()]}}],
        },
    }


#: ``--kind`` -> the module that checks it: its ``HARNESSES[kind]`` (harness class, states), or else
#: its ``Harness`` and ``draw_state``. This module for whole and static MIG devices; a kind's module
#: builds on this one, so it is found by name (an import here would be a cycle).
KINDS = {
    "devices": __name__,
    "dynamic-mig": "gpuspawner.devcluster.dratruth_counters",
    "extres": "gpuspawner.devcluster.dratruth_extres",
    "capacity": "gpuspawner.devcluster.dratruth_shares",
    "taints": "gpuspawner.devcluster.dratruth_shares",
    "mixed": "gpuspawner.devcluster.dratruth_mixed",
}


def kind(name: str) -> tuple[Callable[[int], State], type[Harness]]:
    """The states and the harness of the kind ``name`` (:data:`KINDS`)."""
    module = importlib.import_module(KINDS[name])
    harnesses = getattr(module, "HARNESSES", {})
    if name in harnesses:
        harness_class, draw = harnesses[name]
        return draw, harness_class
    return module.draw_state, module.Harness


async def run_states(cluster: DevCluster, seeds: list[int], log: Callable[[str], object], kind_name: str = "devices") -> list[Result]:
    draw, harness_class = kind(kind_name)
    harness = harness_class(cluster, log)
    await harness.setup()
    results: list[Result] = []
    try:
        for n, seed in enumerate(seeds, 1):
            started = time.monotonic()
            state = draw(seed)
            await harness.load(state)
            found = await harness.check(state)
            results.extend(found)
            bad = [r for r in found if not r.agrees]
            log(
                f"state {seed} ({n}/{len(seeds)}): {len(state.nodes)} nodes, {len(state.held)} devices held, "
                f"{len(found)} offerings, {len(bad)} disagree, {time.monotonic() - started:.1f}s"
            )
            for r in bad:
                log(f"  DISAGREE seed {seed} {r.slug}: inventory free {r.predicted}, scheduler bound {r.placed}")
    finally:
        await harness.inventory.stop()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuspawner.devcluster.dratruth", description=__doc__.split("\n\n")[0])
    parser.add_argument("--states", type=int, default=100, help="states to check, seeds 0..N-1 (default 100)")
    parser.add_argument("--seeds", help="exactly these seeds, e.g. 0-3 or 3,17")
    parser.add_argument("--json", metavar="FILE", help="also write every offering's result here")
    parser.add_argument("--quiet", action="store_true", help="print only disagreements and the summary")
    parser.add_argument(
        "--kind",
        choices=tuple(KINDS),
        default="devices",
        help="devices: whole GPUs and static MIG (default); dynamic-mig: partitionable GPUs (counter sets); "
        "extres: plain nvidia.com/gpu served by DRA nodes; capacity: GPU-memory shares of devices that allow "
        "multiple allocations; taints: tainted devices and claims that tolerate them; mixed: cordoned and tainted "
        "nodes, little cpu for the notebook, device taints and DeviceTaintRules, and the mapping, in one state",
    )
    args = parser.parse_args(argv)
    seeds = _seeds(args.seeds) if args.seeds else list(range(args.states))
    started = time.monotonic()

    def log(line: str) -> None:
        if not args.quiet or "DISAGREE" in line:
            print(line, flush=True)

    results = on_devcluster("gpuspawner-dratruth-", lambda cluster: run_states(cluster, seeds, log, args.kind))
    agree = sum(r.agrees for r in results)
    if args.json:
        Path(args.json).write_text(json.dumps([{**asdict(r), "agrees": r.agrees} for r in results], indent=1))
    retried = sum(r.retried for r in results)
    print(f"{agree} of {len(results)} offerings agree over {len(seeds)} states ({retried} placed twice, {time.monotonic() - started:.0f}s)")
    return 0 if agree == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
