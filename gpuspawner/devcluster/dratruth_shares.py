"""DRA capacity truth for GPU-memory shares and device taints (``dratruth --kind capacity|taints``).

Two kinds of random state for :mod:`gpuspawner.devcluster.dratruth`'s harness, checked the
same way (each offering's free count from a live inventory against the pods the real
kube-scheduler binds with the ResourceClaimTemplate a spawn of that offering sends):

* **capacity**: L40S nodes of NVIDIA's driver with ``--consumable-shares`` in its three modes
  (``memory``, ``unlimited``, a number of shares), sometimes beside whole L40S GPUs, and other
  users' claims already holding random amounts of memory (also amounts off the 1Mi step,
  which the allocator rounds up) or a whole GPU. The offerings: the discovered shares by
  amount, the whole GPUs, and a share of a random amount in bytes.
* **taints**: H100, L4 and shared L40S nodes whose devices carry random taints (NoSchedule,
  NoExecute, None; keys and values from small sets), other users' claims that tolerate
  everything on some devices, and the discovered offerings plus variants whose claims tolerate
  some taints (by key with Exists, by key and value with Equal, all of them).

    python -m gpuspawner.devcluster.dratruth --kind capacity --states 100
    python -m gpuspawner.devcluster.dratruth --kind taints --states 100
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field, replace
from typing import Any

from gpuspawner.core.model import Offering
from gpuspawner.devcluster.dradriver import H100_80GB, L4, L40S, DraNode, node_devices
from gpuspawner.devcluster.dratruth import CLAIMS, Harness, claim_pod
from gpuspawner.names import dranames as dn
from gpuspawner.offerings.config import with_effects

MIB = 1024 * 1024
#: Seconds a probe pod bound to a NoExecute-tainted device is given to be evicted.
EVICTION_GRACE = 5.0
TAINT_KEYS = ("gpu.nvidia.com/maintenance", "example.com/health")
TAINT_VALUES = ("planned", "failed", "")
EFFECTS = ("NoSchedule", "NoExecute", "None")


@dataclass
class HeldClaim:
    """Another user's claim: on ``device`` of ``node``, asking ``memory`` (None: no capacity request)."""

    node: str
    device: str
    memory: str | None = None


@dataclass
class ShareState:
    seed: int
    kind: str
    nodes: list[DraNode]
    held: list[HeldClaim]
    #: Extra offerings' claim changes: (a discovered slug, capacity requests or None, tolerations or None).
    variants: list[tuple[str, dict[str, str] | None, tuple[dict[str, str], ...] | None]] = field(default_factory=list)
    layout: dict[str, tuple[int, int]] = field(default_factory=dict)


def _mib(device: dict[str, Any]) -> int:
    value = device["capacity"][dn.CAP_MEMORY]["value"]
    return int(value[:-2]) * (1024 if value.endswith("Gi") else 1)


def draw_capacity(seed: int) -> ShareState:
    """GPUs shared by memory in the driver's three modes (and maybe whole L40S GPUs), partly held."""
    rng = random.Random(seed)
    nodes = []
    modes = ["memory", "unlimited", str(rng.choice((2, 3, 4, 7)))]
    whole = rng.random() < 0.3
    if whole:
        modes.remove("unlimited")  # a claim for a whole GPU takes no memory of an unlimited one: no count
        nodes.append(DraNode(f"s{seed}-l40s-whole", L40S, rng.randint(1, 2)))
    for i in range(rng.randint(1, 2)):
        nodes.append(DraNode(f"s{seed}-l40s-{i}", L40S, rng.randint(1, 2), shares=rng.choice(modes)))
    held = []
    for spec in nodes:
        for device in node_devices(spec):
            if not spec.shares:
                if rng.random() < 0.3:
                    held.append(HeldClaim(spec.name, device["name"]))
                continue
            if spec.shares == "memory" and rng.random() < 0.15:
                held.append(HeldClaim(spec.name, device["name"]))  # a claim with no amount: all of it
                continue
            left, slots = _mib(device), int(spec.shares) if spec.shares.isdigit() else 99
            for _ in range(rng.choice((0, 1, 1, 2, 3))):
                if slots < 1 or left < 2:
                    break
                mib = rng.randint(1, min(left - 1, 24 * 1024))
                amount = f"{mib}Mi" if rng.random() < 0.5 else str(mib * MIB - rng.randint(0, MIB - 1))  # bytes: rounded up to mib
                held.append(HeldClaim(spec.name, device["name"], amount))
                left, slots = left - mib, slots - 1
    odd = rng.randint(1, 20 * 1024) * MIB - rng.randint(0, MIB - 1)
    return ShareState(seed, "capacity", nodes, held, variants=[("dra-share-l40s-4gb", {"memory": str(odd)}, None)])


def draw_taints(seed: int) -> ShareState:
    """H100, L4 and shared L40S nodes with random device taints; some devices held by claims that tolerate all."""
    rng = random.Random(seed)
    nodes = []
    for i in range(rng.randint(2, 3)):
        product, count, shares = rng.choice(((H100_80GB, (1, 2, 4), ""), (L4, (1, 2, 4), ""), (L40S, (1, 2), "memory")))
        name = f"s{seed}-{product.name.split()[-1].lower()}-{i}"
        spec = DraNode(name, product, rng.choice(count), shares=shares)
        taints = {}
        for device in node_devices(spec):
            if rng.random() < 0.45:
                taints[device["name"]] = tuple(
                    {"key": rng.choice(TAINT_KEYS), "value": rng.choice(TAINT_VALUES), "effect": rng.choice(EFFECTS)}
                    for _ in range(rng.choice((1, 1, 2)))
                )
        nodes.append(replace(spec, taints=taints))
    held = []
    for spec in nodes:
        for device in node_devices(spec):
            if rng.random() < 0.25:
                held.append(HeldClaim(spec.name, device["name"], "8Gi" if spec.shares else None))
    tolerations = (
        ({"key": TAINT_KEYS[0], "operator": "Exists"},),  # no effect: one per effect, as an admin's become
        (
            {"key": TAINT_KEYS[0], "operator": "Exists", "effect": "NoExecute"},
            {"key": TAINT_KEYS[0], "operator": "Exists", "effect": "NoSchedule"},
        ),
        ({"key": TAINT_KEYS[1], "operator": "Equal", "value": "failed", "effect": "NoExecute"},),
        ({"key": TAINT_KEYS[1], "operator": "Exists", "effect": "NoSchedule"}, {"key": TAINT_KEYS[0], "value": "planned"}),
        ({"operator": "Exists"},),
    )
    slugs = ["dra-gpu-h100-80gb", "dra-gpu-l4", "dra-share-l40s-8gb"]
    variants: list[tuple[str, dict[str, str] | None, tuple[dict[str, str], ...] | None]] = [
        (rng.choice(slugs), None, rng.choice(tolerations)) for _ in range(2)
    ]
    return ShareState(seed, "taints", nodes, held, variants=variants)


class SharesHarness(Harness):
    """:class:`~gpuspawner.devcluster.dratruth.Harness` for :class:`ShareState`: other users' claims
    ask amounts of memory (and tolerate every taint), and the offerings include the state's variants."""

    async def load(self, state: ShareState) -> None:  # type: ignore[override]
        await super().load(replace(state, held=[], layout={n.name: (1, 1) for n in state.nodes}))  # type: ignore[arg-type]
        for i, held in enumerate(state.held):
            spec_of = next(s for s in state.nodes if s.name == held.node)
            uuid = next(d["attributes"]["uuid"]["string"] for d in node_devices(spec_of) if d["name"] == held.device)
            exactly: dict[str, Any] = {
                "deviceClassName": dn.CLASS_GPU,
                "selectors": [{"cel": {"expression": f"device.attributes['{dn.DRIVER}'].uuid == '{uuid}'"}}],
                # Both effects by name: a toleration without an effect does not keep the pod from eviction.
                "tolerations": [{"operator": "Exists", "effect": "NoSchedule"}, {"operator": "Exists", "effect": "NoExecute"}],
            }
            if held.memory is not None:
                exactly["capacity"] = {"requests": {dn.CAP_MEMORY: held.memory}}
            spec = {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}
            body = {"apiVersion": dn.RESOURCE_API, "kind": "ResourceClaim", "metadata": {"name": f"held-{i}"}, "spec": spec}
            self.kube.request("POST", CLAIMS.format(ns="team-a"), body)
            self.kube.request("POST", "/api/v1/namespaces/team-a/pods", claim_pod(f"held-{i}", {"resourceClaimName": f"held-{i}"}))
            # One at a time: shares of one device allocated in the same scheduling cycles can be
            # refused as in-flight and wait for the scheduler's next flush of unschedulable pods.
            await self._until(lambda: all(p["spec"].get("nodeName") for p in self._pods("team-a")), f"other users' pod held-{i} bound", 120)

    async def placed(self) -> int:
        """Probe pods bound that stay: a pod bound to a NoExecute-tainted device is evicted by
        kube-controller-manager (device-taint-eviction-controller) unless its claim tolerates the
        taint with effect NoExecute. The pods bound now on such devices get :data:`EVICTION_GRACE`
        seconds to be evicted; those that are count as not placed (the device they free is taken
        by the next pending probe, evicted in turn: only pods bound now are counted)."""
        bound = {p["metadata"]["name"] for p in self._pods("probe") if p["spec"].get("nodeName")}
        evicting = self._noexecute_devices()
        suspects = {name for name in bound if evicting & self._devices_of(name)}
        deadline = time.monotonic() + EVICTION_GRACE
        while suspects and time.monotonic() < deadline:
            pods = {p["metadata"]["name"]: p for p in self._pods("probe")}
            suspects = {n for n in suspects if n in pods and not _leaving(pods[n])}
            await asyncio.sleep(0.1)
        pods = {p["metadata"]["name"]: p for p in self._pods("probe")}
        return sum(1 for name in bound if name in pods and not _leaving(pods[name]))

    def _noexecute_devices(self) -> set[tuple[str, str, str]]:
        out = set()
        for item in self.kube.request("GET", "/apis/resource.k8s.io/v1/resourceslices")["items"]:
            spec = item["spec"]
            for device in spec.get("devices") or []:
                if any(t.get("effect") == "NoExecute" for t in device.get("taints") or []):
                    out.add((spec["driver"], spec["pool"]["name"], device["name"]))
        return out

    def _devices_of(self, pod: str) -> set[tuple[str, str, str]]:
        out = set()
        for claim in self.kube.request("GET", CLAIMS.format(ns="probe"))["items"]:
            if any(r.get("name") == pod for r in (claim.get("status") or {}).get("reservedFor") or []):
                for r in ((claim["status"].get("allocation") or {}).get("devices") or {}).get("results") or []:
                    out.add((r["driver"], r["pool"], r["device"]))
        return out

    def offerings(self, state: ShareState) -> list[Offering]:
        found = list(self.inventory.index.dra.discovered())
        by_slug = {o.slug: o for o in found}
        for i, (slug, capacity, tolerations) in enumerate(state.variants):
            base = by_slug.get(slug)
            if base is None or base.claim is None:
                continue
            claim = base.claim
            if capacity is not None:
                claim = replace(claim, capacity=capacity)
            if tolerations is not None:  # as an admin's dra.tolerations become the claim's (one per effect)
                claim = replace(claim, tolerations=with_effects(tolerations))
            found.append(replace(base, slug=f"v{i}-{slug}"[:63], claim=claim))
        return found


def _leaving(pod: dict[str, Any]) -> bool:
    """Being deleted, or marked for deletion by the device taint eviction."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return bool(pod["metadata"].get("deletionTimestamp")) or any(
        c.get("type") == dn.DISRUPTION_TARGET and c.get("reason") == dn.DEVICE_TAINT_EVICTION for c in conditions
    )


HARNESSES = {"capacity": (SharesHarness, draw_capacity), "taints": (SharesHarness, draw_taints)}
