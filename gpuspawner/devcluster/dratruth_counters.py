"""DRA capacity truth for dynamic MIG: free counts per MIG profile against the real scheduler's counter sets.

A state (a seed) is one or two nodes of A100-40GBs that NVIDIA's driver partitions on demand
(:data:`~gpuspawner.devcluster.dradriver.DraNode.dynamic_mig`: every placement of every profile,
each taking from its GPU's counter set), sometimes beside an A100 in a static MIG layout (its
devices join the same per-profile offerings, counted one by one), some pools republished at a
newer generation. Other users then ask for random profiles on random GPUs (the scheduler places
them where it will; what it cannot place is withdrawn), and some of them stop again, leaving
holes between the placements still held. Each discovered offering is then checked as in
:mod:`gpuspawner.devcluster.dratruth`: the inventory's free count against the pods the real
scheduler binds with the spawner's own claim template.

    python -m gpuspawner.devcluster.dratruth --kind dynamic-mig --states 100
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from gpuspawner.devcluster import dratruth
from gpuspawner.devcluster.dradriver import A100_40GB, A100_40GB_DYNAMIC_MIG, DraNode, node_devices
from gpuspawner.names import dranames as dn

#: The profiles other users ask for.
PROFILES = tuple(A100_40GB_DYNAMIC_MIG)


@dataclass
class State(dratruth.State):
    #: Other users' dynamic MIG requests: (node, GPU minor, profile), in the order they are made.
    asks: list[tuple[str, int, str]] = field(default_factory=list)
    #: Which of the placed requests stop again (indices into ``asks``).
    stops: set[int] = field(default_factory=set)


def draw_state(seed: int) -> State:
    rng = random.Random(seed)
    nodes = [DraNode(f"s{seed}-dynmig-{i}", A100_40GB, rng.choice((1, 1, 2)), dynamic_mig=True) for i in range(rng.choice((1, 1, 2)))]
    if rng.random() < 0.25:
        nodes.append(DraNode(f"s{seed}-a100-static", A100_40GB, 1, mig=rng.choice(dratruth.MIG_LAYOUTS)))
    layout = {n.name: (rng.choice((1, 1, 1, 2)), n.gpus if n.dynamic_mig else 1) for n in nodes}
    held = [(n.name, d["name"]) for n in nodes if not n.dynamic_mig for d in dratruth.published(n, layout[n.name][0]) if rng.random() < 0.3]
    asks = [
        (n.name, minor, rng.choice(PROFILES)) for n in nodes if n.dynamic_mig for minor in range(n.gpus) for _ in range(rng.randint(0, 6))
    ]
    rng.shuffle(asks)
    stops = {i for i in range(len(asks)) if rng.random() < 0.3}
    return State(seed, nodes, layout, held, asks, stops)


class Harness(dratruth.Harness):
    """:class:`gpuspawner.devcluster.dratruth.Harness` with dynamic MIG nodes and other users' MIG requests."""

    async def load(self, state: dratruth.State) -> None:
        assert isinstance(state, State)
        await super().load(state)
        await self._ask(state)

    async def _ask(self, state: State) -> None:
        """Other users' requests for a profile on one GPU (by its UUID, as the devices name it); the scheduler
        picks the placement. What it cannot place is withdrawn; then some of the placed stop again."""
        names = []
        for i, (node, minor, profile) in enumerate(state.asks):
            spec = next(s for s in state.nodes if s.name == node)
            parent = next(
                d["attributes"][dn.ATTR_PARENT_UUID]["string"]
                for d in node_devices(spec)
                if d["name"].startswith(f"{dn.gpu_device_name(minor)}-")
            )
            selectors = [
                f"device.attributes['{dn.DRIVER}'].{dn.ATTR_PARENT_UUID} == '{parent}'",
                f"device.attributes['{dn.DRIVER}'].{dn.ATTR_PROFILE} == '{profile}'",
            ]
            exactly = {"deviceClassName": dn.CLASS_MIG, "selectors": [{"cel": {"expression": e}} for e in selectors]}
            spec_ = {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}
            name = f"ask-{i}"
            body = {"apiVersion": dn.RESOURCE_API, "kind": "ResourceClaim", "metadata": {"name": name}, "spec": spec_}
            self.kube.request("POST", dratruth.CLAIMS.format(ns="team-a"), body)
            self.kube.request("POST", "/api/v1/namespaces/team-a/pods", dratruth.claim_pod(name, {"resourceClaimName": name}))
            names.append(name)
        if not names:
            return
        await self._until(lambda: self._probes_settled("team-a"), "other users' MIG requests placed or refused", 180)
        placed = {p["metadata"]["name"] for p in self._pods("team-a") if p["spec"].get("nodeName")}
        for i, name in enumerate(names):
            if name.startswith("ask-") and (name not in placed or i in state.stops):
                self.kube.request("DELETE", f"/api/v1/namespaces/team-a/pods/{name}?gracePeriodSeconds=0")
                self.kube.request("DELETE", dratruth.CLAIMS.format(ns="team-a") + f"/{name}")
        gone = {n for i, n in enumerate(names) if n not in placed or i in state.stops}
        await self._until(
            lambda: not gone & {c["metadata"]["name"] for c in self._claims() if c["metadata"]["namespace"] == "team-a"},
            "withdrawn requests gone",
        )
