"""ResourceSlices, DeviceClasses and ResourceClaims -> DRA offerings and their free devices. Pure.

Dynamic Resource Allocation (``resource.k8s.io/v1``) publishes devices in ResourceSlices, not
as extended resources on nodes. :class:`DraState` keeps the slim facts of the three kinds
(fed per watch event by :class:`gpuspawner.hub.inventory.Inventory`, or from files by the CLI):

* **Pools.** Only the current generation of a complete pool counts
  (:mod:`gpuspawner.dra.slices`): an offering with a device in an incomplete pool has no
  free count (unknown, never zero or full) until the rest arrive.
* **Discovery.** NVIDIA's devices become offerings grouped the way users choose
  (:mod:`gpuspawner.dra.discover`).
* **Free devices.** A device is taken when any ResourceClaim in the cluster has it in
  ``status.allocation.devices.results``, as the scheduler's allocator counts it, or when a
  spawn holds it as a reservation between admission and allocation. A shared offering (the
  admin's time-sliced or MPS share, ``DeviceClaim.replicas`` > 1) serves ``replicas`` consumers
  per device: pods share one claim, and a claim with its sharing config has
  ``len(status.reservedFor)`` of them.
* **Device plugin beside DRA.** A node whose ``status.allocatable`` advertises an
  ``nvidia.com/`` extended resource is a device-plugin node: its GPUs are counted by
  :mod:`gpuspawner.capacity.counts` from allocatable, and any DRA devices published for it are left
  out here (NVIDIA's driver and its device plugin must not manage the same GPUs). So no GPU
  is counted twice.
* **Partitionable devices** (``consumesCounters``: NVIDIA's dynamic MIG publishes every
  placement, and placements overlap) are counted as the allocator spends their pools'
  counter sets (:mod:`gpuspawner.dra.counters`).
* **Not counted.** Devices that allow several allocations (``allowMultipleAllocations``)
  are discovered but left uncounted: one device taken does not mean one unit gone.
* **The extended-resource mapping.** With ``extendedResourceName: nvidia.com/gpu`` on the
  gpu class, the scheduler may serve a plain ``nvidia.com/gpu`` pod with a DRA GPU on a node
  without that allocatable. It then writes a claim for the pod, so the device shows as taken
  in the DRA offerings' counts; device-plugin offerings (counted from allocatable) never
  count DRA devices: the inventory does not offer DRA GPUs under an extended-resource offering.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any

from gpuspawner.core.cel import Selector, SelectorError, compile_selector
from gpuspawner.core.model import UNCOUNTED, Availability, Offering
from gpuspawner.dra import counters
from gpuspawner.dra.alternatives import choices
from gpuspawner.dra.capacity import add as add_consumed
from gpuspawner.dra.capacity import blocked as device_blocked
from gpuspawner.dra.capacity import capacity_free, placed, share_pick, shared_free, trap
from gpuspawner.dra.discover import discover
from gpuspawner.dra.extres import class_resource
from gpuspawner.dra.slices import ClaimFacts, Device, DeviceKey, Pool, TaintRule, build_pools


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


class DraState:
    """The DRA part of the cluster index: slices, classes and claims, kept per event."""

    def __init__(self) -> None:
        self.slices: dict[str, Mapping[str, Any]] = {}
        self.classes: dict[str, tuple[Selector, ...]] = {}
        self.class_errors: dict[str, str] = {}
        #: DeviceClass name -> (the extended resource its devices serve, creation time): see :mod:`gpuspawner.dra.extres`.
        self.class_resources: dict[str, tuple[str, str]] = {}
        self.claims: dict[str, ClaimFacts] = {}
        #: DeviceTaintRules by name (their taints join the matching devices' own: :class:`~gpuspawner.dra.slices.TaintRule`).
        self.rules: dict[str, TaintRule | None] = {}
        #: Nodes whose GPUs the device plugin serves (their DRA devices are not counted).
        self.plugin_nodes: frozenset[str] = frozenset()
        #: Reservations: pod key -> (devices held, shared units held per offering slug).
        self.reservations: dict[str, tuple[tuple[DeviceKey, ...], str | None]] = {}
        #: Whether slices, classes and claims are all listed (False: DRA counts are unknown).
        self.synced = False
        self._pools: dict[tuple[str, str], Pool] | None = None
        self._taken: Counter[DeviceKey] | None = None
        #: Reservations of a share of a multi-allocatable device: pod key -> (device, amounts).
        self.share_reservations: dict[str, tuple[DeviceKey, Mapping[str, Any]]] = {}
        self._consumed: dict[DeviceKey, dict[str, Fraction]] | None = None
        self._matches: dict[tuple[Any, ...], tuple[Device, ...]] = {}
        self._discovered: list[Offering] | None = None
        self._counters: dict[tuple[str, str], counters.PoolCounters] | None = None
        self._device_nodes: frozenset[str] | None = None
        self._availability: tuple[tuple[int, bool], dict[tuple[Any, ...], Availability]] = ((-1, False), {})
        #: Bumped on every write (slices, classes, claims, plugin nodes, reservations): what reads
        #: the state through a cache of its own (the index's extended-resource rows) compares it.
        self.generation = 0

    # ------------------------------------------------------------------ writes

    def replace(
        self,
        slices: Iterable[Mapping[str, Any]] | None = None,
        classes: Iterable[Mapping[str, Any]] | None = None,
        claims: Iterable[Mapping[str, Any]] | None = None,
        rules: Iterable[Mapping[str, Any]] | None = None,
    ) -> None:
        """A (re)list of any of the four kinds."""
        self.generation += 1
        if rules is not None:
            self.rules = {_key(r): TaintRule.from_rule(r) for r in rules}
            self._changed_devices()
        if slices is not None:
            self.slices = {_key(s): s for s in slices}
            self._changed_devices()
        if classes is not None:
            self.classes, self.class_errors, self.class_resources = {}, {}, {}
            for raw in classes:
                self.class_event("ADDED", raw)
        if claims is not None:
            self.claims = {_key(c): ClaimFacts.from_claim(c) for c in claims}
            self._taken = self._consumed = None
            for raw in claims:
                self._release_for(raw)

    def slice_event(self, kind: str, raw: Mapping[str, Any]) -> None:
        self.generation += 1
        if kind == "DELETED":
            self.slices.pop(_key(raw), None)
        else:
            self.slices[_key(raw)] = raw
        self._changed_devices()

    def rule_event(self, kind: str, raw: Mapping[str, Any]) -> None:
        """A DeviceTaintRule added, changed or deleted: the taints of the devices it selects change."""
        self.generation += 1
        if kind == "DELETED":
            self.rules.pop(_key(raw), None)
        else:
            self.rules[_key(raw)] = TaintRule.from_rule(raw)
        self._changed_devices()

    def class_event(self, kind: str, raw: Mapping[str, Any]) -> None:
        name = (raw.get("metadata") or {}).get("name", "")
        self.generation += 1
        self.classes.pop(name, None)
        self.class_errors.pop(name, None)
        self.class_resources.pop(name, None)
        self._matches = {}
        if kind == "DELETED":
            return
        self.class_resources[name] = class_resource(raw)
        expressions = [((s.get("cel") or {}).get("expression") or "") for s in (raw.get("spec") or {}).get("selectors") or []]
        try:
            self.classes[name] = tuple(compile_selector(e) for e in expressions if e)
        except SelectorError as exc:
            self.class_errors[name] = str(exc)

    def claim_event(self, kind: str, raw: Mapping[str, Any]) -> None:
        key = _key(raw)
        self.generation += 1
        if kind == "DELETED":
            self.claims.pop(key, None)
        else:
            self.claims[key] = ClaimFacts.from_claim(raw)
            self._release_for(raw)
        self._taken = self._consumed = None

    def set_plugin_nodes(self, nodes: Iterable[str]) -> None:
        nodes = frozenset(nodes)
        if nodes != self.plugin_nodes:
            self.generation += 1
            self.plugin_nodes = nodes
            self._matches = {}
            self._discovered = None

    def reserve(self, key: str, offering: Offering, count: int, room: Mapping[str, int] | None = None) -> str | None:
        """Hold ``count`` free devices of ``offering`` on one node for the pod ``key`` until its claim is allocated.

        A shared offering holds one unit of its share instead of devices. Returns the node
        (``""`` for a share or devices that belong to no node), or None if nothing fits.
        ``room``: as for :meth:`availability`; only a node with room for the pod is picked.
        """
        self.release(key)
        avail = self.availability(offering, room)
        if not avail.free or (avail.largest_free or 0) < count:
            return None
        claim = offering.claim
        assert claim is not None
        if claim.replicas > 1:
            self.reservations[key] = ((), offering.slug)
            self.generation += 1
            return ""
        matched = tuple(d for d in self.matching(offering) if room is None or d.node is None or room.get(d.node, 0) >= 1)
        if claim.capacity or any(d.multiple or d.taints for d in matched):
            picked = share_pick(claim, matched, self.taken(), self.consumed(), count)
            if picked is None:
                return None
            chosen, amounts = picked
            if amounts is not None:
                self.share_reservations[key] = (chosen[0].key, amounts)
            else:
                self.reservations[key] = (tuple(d.key for d in chosen), None)
            self._taken = self._consumed = None
            self.generation += 1
            return chosen[0].node or ""
        by_node: dict[str | None, list[Device]] = {}
        for device in self._free_devices(matched):
            by_node.setdefault(device.node, []).append(device)
        if not by_node:
            return None
        node, devices = max(by_node.items(), key=lambda item: (len(item[1]), item[0] or ""))
        self.reservations[key] = (tuple(d.key for d in devices[:count]), None)
        self._taken = self._consumed = None
        self.generation += 1
        return node or ""

    def hold(self, key: str, devices: Iterable[DeviceKey]) -> None:
        """Hold ``devices`` for the pod ``key`` until a claim reserved for it is allocated (a plain
        extended-resource spawn on a DRA node: :mod:`gpuspawner.dra.extres`)."""
        self.reservations[key] = (tuple(devices), None)
        self._taken = None
        self.generation += 1

    def release(self, key: str) -> None:
        if (self.reservations.pop(key, None), self.share_reservations.pop(key, None)) != (None, None):
            self._taken = self._consumed = None
            self.generation += 1

    # ------------------------------------------------------------------ reads

    def device_nodes(self) -> frozenset[str]:
        """The nodes any ResourceSlice publishes devices of (kept until the slices change)."""
        if self._device_nodes is None:
            self._device_nodes = frozenset(str(node) for s in self.slices.values() if (node := (s.get("spec") or {}).get("nodeName")))
        return self._device_nodes

    def pools(self) -> dict[tuple[str, str], Pool]:
        if self._pools is None:
            self._pools = build_pools(self.slices.values(), (r for r in self.rules.values() if r is not None))
        return self._pools

    def devices(self, complete_only: bool = True) -> list[Device]:
        """The devices the counts see: current generations, off device-plugin nodes."""
        return [
            d
            for pool in self.pools().values()
            if pool.complete or not complete_only
            for d in pool.devices
            if d.node not in self.plugin_nodes
        ]

    def discovered(self) -> list[Offering]:
        """NVIDIA's whole GPUs and MIG devices as offerings (complete or not: an incomplete pool still names them)."""
        if self._discovered is None:
            self._discovered = discover(self.devices(complete_only=False))
        return self._discovered

    def matching(self, offering: Offering, complete_only: bool = True) -> tuple[Device, ...]:
        """The devices ``offering``'s claim selects: its class's selectors and its own, all true."""
        claim = offering.claim
        if claim is None:
            return ()
        cache_key = (claim.device_class, claim.selectors, claim.alternatives, complete_only)
        found = self._matches.get(cache_key)
        if found is None:
            # "This, or else that" (firstAvailable): a device of any choice serves the offering.
            choices = [(a.device_class, a.selectors) for a in claim.alternatives] or [(claim.device_class, claim.selectors)]
            tests = []
            for device_class, own in choices:
                class_selectors = self.classes.get(device_class)
                if class_selectors is not None:
                    tests.append(class_selectors + tuple(compile_selector(s) for s in own))
            found = tuple(d for d in self.devices(complete_only) if any(all(s.matches(d.activation) for s in t) for t in tests))
            self._matches[cache_key] = found
        return found

    def availability(self, offering: Offering, room: Mapping[str, int] | None = None) -> Availability:
        """Capacity and free units of a DRA offering now (reservations count as taken); kept until
        the next write (a page view reads it for each DRA offering, each device would be read again).

        ``room``: node -> how many more of the offering's pods the node takes beside what runs
        there (:mod:`gpuspawner.capacity.draplaced`: cordon, taints, affinity, cpu, memory, pod
        slots); devices of a node not in it are out of the pod's reach. None: every node, no limit.
        """
        stamp = (self.generation, self.synced)
        if self._availability[0] != stamp:
            self._availability = (stamp, {})
        kept = self._availability[1]
        # All of the offering it reads (a claim holds dicts: its repr, which names every field, is its key).
        rooms = None if room is None else tuple(sorted(room.items()))
        key = (offering.slug, repr(offering.claim), tuple(offering.counts), rooms)
        found = kept.get(key)
        if found is None:
            found = kept[key] = self._count(offering, room)
        return found

    def _count(self, offering: Offering, room: Mapping[str, int] | None) -> Availability:
        claim = offering.claim
        if claim is None or not self.synced:
            return UNCOUNTED
        complete = {d.key for d in self.matching(offering)}
        if any(d.key not in complete for d in self.matching(offering, complete_only=False)):
            return UNCOUNTED  # a pool of its devices is incomplete: unknown, never zero or full
        devices = self.matching(offering)
        if room is not None:  # the pod cannot land on the other nodes (devices of no node: any node)
            devices = tuple(d for d in devices if d.node is None or d.node in room)
        found = self._free_by_node(offering, devices)
        if found is None:
            return UNCOUNTED
        capacity, free_by_node, together = found
        return placed(capacity, free_by_node, devices, max(offering.counts), room, together)

    def _free_by_node(
        self, offering: Offering, devices: tuple[Device, ...]
    ) -> tuple[int, Counter[str | None], Counter[tuple[str | None, tuple[Any, ...]]] | None] | None:
        """(capacity, free units per node, and where the claim's devices must share attributes
        (``matchAttribute``, e.g. one GPU's ``parentUUID``) free units per node and those values) of
        ``offering`` among ``devices``, by the devices alone; None: unknown."""
        claim = offering.claim
        assert claim is not None
        taken = self.taken()
        if claim.replicas == 1 and counters.partitionable(devices, self.pool_counters()):
            if any(trap(d.taints, claim.tolerations) for d in devices):
                return None  # the allocator may give it a device whose eviction then takes it back
            usable = [d for d in devices if not device_blocked(d.taints, claim.tolerations)]
            free = self._in_order(offering, usable, taken)
            # Successive placements fit together, so those sharing the claim's matched attributes are what one claim can get.
            together = (
                Counter((d.node, tuple(d.qualified_attribute(a) for a in claim.match_attributes)) for d in free)
                if claim.match_attributes
                else None
            )
            return len(self._in_order(offering, devices, Counter())), Counter(d.node for d in free), together
        if any(d.shared_counters for d in devices):
            return None  # partitionable devices overlap (dynamic MIG): counting them one by one would be wrong
        if claim.capacity or any(d.multiple or d.taints for d in devices):
            found = capacity_free(claim, devices, taken, self.consumed())
            return None if found is None else (*found, None)
        if claim.replicas > 1:
            return (*shared_free(offering, devices, taken, self.claims.values(), self.reservations.values()), None)
        free_by_node: Counter[str | None] = Counter()
        for d in devices:
            if not taken[d.key]:
                free_by_node[d.node] += 1
        return len(devices), free_by_node, None

    def _in_order(self, offering: Offering, devices: Iterable[Device], taken: Counter[DeviceKey]) -> list[Device]:
        """The devices successive claims of ``offering`` get among ``devices`` (partitionable ones by their
        counters): for alternatives (``firstAvailable``), as the allocator tries them on a node, every claim
        takes the first choice that still fits there, so each choice is placed after the ones before it
        have taken all they can (overlapping placements make this fewer than the choices' union)."""
        pools = self.pool_counters()
        if not offering.claim or not offering.claim.alternatives:
            return counters.placeable(list(devices), pools, taken)
        allowed = {d.key for d in devices}
        held = Counter(taken)
        out: list[Device] = []
        for choice in choices(offering):
            got = counters.placeable([d for d in self.matching(choice) if d.key in allowed], pools, held)
            held.update(d.key for d in got)
            out += got
        return out

    def pool_counters(self) -> dict[tuple[str, str], counters.PoolCounters]:
        """The counter sets of partitionable devices (dynamic MIG), per pool (:mod:`gpuspawner.dra.counters`)."""
        if self._counters is None:
            self._counters = counters.pool_counters(self.slices.values())
        return self._counters

    def taken(self) -> Counter[DeviceKey]:
        """How many claims (and reservations) hold each device."""
        if self._taken is None:
            taken: Counter[DeviceKey] = Counter()
            for claim in self.claims.values():
                taken.update(set(claim.devices))
            for devices, _ in self.reservations.values():
                taken.update(devices)
            self._taken = taken
        return self._taken

    def consumed(self) -> dict[DeviceKey, dict[str, Fraction]]:
        """What the claims (and share reservations) consumed of each multi-allocatable device."""
        if self._consumed is None:
            used: dict[DeviceKey, dict[str, Fraction]] = {}
            for claim in self.claims.values():
                for key, amounts in claim.consumed:
                    add_consumed(used.setdefault(key, {}), amounts)
            for key, amounts in self.share_reservations.values():
                add_consumed(used.setdefault(key, {}), amounts)
            self._consumed = used
        return self._consumed

    # ------------------------------------------------------------------ internals

    def _free_devices(self, devices: tuple[Device, ...]) -> list[Device]:
        taken = self.taken()
        if counters.partitionable(devices, self.pool_counters()):
            return counters.placeable(devices, self.pool_counters(), taken)
        return [d for d in devices if not taken[d.key]]

    def _changed_devices(self) -> None:
        self._device_nodes = None
        self._pools = None
        self._matches = {}
        self._discovered = None
        self._counters = None

    def _release_for(self, raw: Mapping[str, Any]) -> None:
        """An allocated claim reserved for a pod ends that pod's reservation (its devices now count as allocated)."""
        status = raw.get("status") or {}
        if not (status.get("allocation") or {}):
            return
        namespace = (raw.get("metadata") or {}).get("namespace", "")
        for consumer in status.get("reservedFor") or []:
            self.release(f"{namespace}/{consumer.get('name', '')}")


def unmatched(offerings: Iterable[Offering], state: DraState) -> list[str]:
    """Warnings for the admin's DRA offerings that select no device the cluster publishes now.

    Only said when it can be known: the slices and classes are listed. A selector may match
    later (nodes not up yet, an autoscaled pool), so this is a warning, not an error.
    """
    if not state.synced:
        return []
    published = len(state.devices(complete_only=False))
    out = []
    for offering in offerings:
        claim = offering.claim
        if claim is None or offering.source != "config":
            continue
        if claim.device_class not in state.classes:
            problem = state.class_errors.get(claim.device_class) or "no such DeviceClass in the cluster (is the DRA driver installed?)"
            out.append(f"offering {offering.slug!r}: device class {claim.device_class!r}: {problem}")
        elif not state.matching(offering, complete_only=False):
            out.append(
                f"offering {offering.slug!r}: its DRA selectors match none of the {published} devices published now "
                f"(device class {claim.device_class!r}; selectors {list(claim.selectors)}): nobody can get one until such a device appears"
            )
    return out
