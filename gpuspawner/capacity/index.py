"""The cluster index: the slim facts of Nodes and Pods that the free counts need, kept per event. Pure.

:class:`ClusterIndex` holds each node's labels, taints, cordon and allocatable (GPUs, cpu,
memory, pods), each bound non-terminal pod's requests (:mod:`~gpuspawner.capacity.podfacts`) and,
per tracked offering, capacity and free units kept up to date *per event*: an event touches one
node, and only that node's rows are recomputed. A page view reads ready numbers. The counts are
the scheduler's (:mod:`gpuspawner.capacity.counts`; a DRA offering's on the nodes its pod may land
on, :mod:`gpuspawner.capacity.draplaced`), for the pod the hub makes:
:meth:`ClusterIndex.set_notebook` gives the notebook's own cpu and memory guarantees, selector and tolerations.

It does no I/O: :class:`gpuspawner.hub.inventory.Inventory` feeds it from the API server's list and
watch, tests and benchmarks feed it dicts directly. :class:`Health` says how far its counts can be trusted.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuspawner.capacity.counts import NO_NOTEBOOK, Row, Tally
from gpuspawner.capacity.draplaced import DraRooms
from gpuspawner.capacity.karpenterpools import DEFAULT_SCALE_UP_MINUTES, NODECLAIMS, NODEPOOLS, PoolState, autoscaled
from gpuspawner.capacity.kueuequota import KueueState
from gpuspawner.capacity.mapped import mapped_rows, with_mapped
from gpuspawner.capacity.podfacts import PodFacts, pod_key
from gpuspawner.core.fit import NodeFacts
from gpuspawner.core.imagefit import NEEDS, ImageNeeds, fitted, misfit, node_has
from gpuspawner.core.model import UNCOUNTED, Availability, Offering
from gpuspawner.dra.devices import DraState
from gpuspawner.names.nvidia import PLUGIN_PREFIX
from gpuspawner.names.vocabulary import Kind
from gpuspawner.offerings.discovery import DEFAULT_VGPU_CLASS_LABELS, aggregate, node_offerings
from gpuspawner.pod.notebook import Notebook

#: One serial for every index of the process: :attr:`ClusterIndex.changes` never takes a value twice,
#: so (changes) alone tells two states of one index, or of two indexes, apart.
_CHANGES = itertools.count(1)


class _OfferingRows:
    """Capacity, allocated and free units of one offering, per node and in total."""

    __slots__ = ("offering", "tally", "rows", "reach", "capacity", "allocated", "free", "largest_hist", "_cached", "mapped", "combined")

    def __init__(self, offering: Offering, notebook: Notebook):
        self.offering = offering
        self.tally = Tally(offering, notebook)
        self.rows: dict[str, Row] = {}
        #: node -> whether the offering's pod may land there at all (pod events do not change it)
        self.reach: dict[str, bool] = {}
        self.capacity = self.allocated = self.free = 0
        self.largest_hist: Counter[int] = Counter()
        self._cached: Availability | None = None
        #: The extended-resource mapping's rows (capacity.mapped) and the stamp they were made at
        #: (see :meth:`ClusterIndex._mapped`): kept until an event changes what they read.
        self.mapped: tuple[tuple[int, int, bool], list[tuple[str, Row, list[Any]]] | None] | None = None
        #: The last availability with the mapped rows added, and the two it was made of.
        self.combined: tuple[Availability, list[tuple[str, Row, list[Any]]], Availability] | None = None

    def set(self, node: str, row: Row | None) -> bool:
        """The ``node``'s row now (None: it serves the offering no more); whether that changed anything."""
        old = self.rows.pop(node, None)
        if old == row:
            if row is not None:
                self.rows[node] = row
            return False
        self._cached = None
        if old is not None:
            self.capacity -= old[0]
            self.allocated -= old[1]
            self.free -= old[2]
            self.largest_hist[old[3]] -= 1
        if row is not None:
            self.rows[node] = row
            self.capacity += row[0]
            self.allocated += row[1]
            self.free += row[2]
            self.largest_hist[row[3]] += 1
        return True

    def availability(self) -> Availability:
        """Cached until a row changes: a page view costs nothing per node."""
        if self._cached is None:
            largest = max((f for f, n in self.largest_hist.items() if n > 0), default=0)
            self._cached = Availability(
                capacity=self.capacity,
                allocated=self.allocated,
                free=self.free,
                largest_free=largest,
                nodes=tuple(sorted(self.rows)),
            )
        return self._cached


class ClusterIndex:
    """The incremental, pure part of the inventory."""

    def __init__(self, vgpu_class_labels: Iterable[str] = DEFAULT_VGPU_CLASS_LABELS):
        self.class_labels = tuple(vgpu_class_labels)
        self.notebook: Notebook = NO_NOTEBOOK
        self.nodes: dict[str, NodeFacts] = {}
        self.pods: dict[str, PodFacts] = {}
        #: The pods of ``pods`` that carry a hub user's label (KubeSpawner's), by the hub that made them
        #: (``""``: unlabelled): what quotas and the held-GPU metric read, without walking every pod
        #: of the cluster per page view (see :meth:`user_pods`).
        self._user_pods: dict[str, dict[str, PodFacts]] = {}
        #: hub -> who is told when one of that hub's user pods arrives (bound, non-terminal) or leaves
        #: (deleted, terminal): ``observer(key, present)`` (see :meth:`observe_user_pods`).
        self._observers: dict[str, list[Callable[[str, bool], None]]] = {}
        #: Bumped whenever a node, or what the pods use on a node that publishes DRA devices, changes:
        #: with the DRA state's own generation it says when the mapping's rows must be made again.
        self._mapped_generation = 0
        #: A new value (never one seen before in this process) whenever anything a count, a
        #: discovered offering or a DRA or Kueue figure reads may have changed: every write below
        #: takes one (a pod event only where it moved a tracked offering's count, is a hub user's
        #: server or is on a node with DRA devices), and the inventory takes one for each DRA or
        #: Kueue event it applies (:meth:`changed`). The spawn page keeps a page until it moves
        #: (gpuspawner.hub.pagecache); every offering a page shows is tracked once it was made.
        self.changes = next(_CHANGES)
        self.used: dict[str, Counter[str]] = {}
        self.reservations: dict[str, tuple[str, Mapping[str, int]]] = {}
        self.tracked: dict[tuple[str, Any], _OfferingRows] = {}
        self._node_offers: dict[str, list[tuple[Offering, int]]] = {}
        self._discovered: list[Offering] | None = []
        self._discovery = next(_CHANGES)
        #: Devices of Dynamic Resource Allocation (ResourceSlices, DeviceClasses, ResourceClaims).
        self.dra = DraState()
        self._dra_rooms = DraRooms()
        #: Kueue's queues, where the hub watches them (``kueue_queues``; capacity.kueuequota).
        self.kueue = KueueState()
        #: Karpenter's NodePools and NodeClaims, where the hub watches them (capacity.karpenterpools).
        self.pools = PoolState()
        self._pooled: tuple[tuple[int, ...], list[Offering]] | None = None

    # ------------------------------------------------------------------ reads

    def discovered(self) -> list[Offering]:
        """Discovered offerings of the current nodes (recomputed only after a change in them)."""
        if self._discovered is None:
            self._discovered = aggregate(self._node_offers.values())
            self._discovery = next(_CHANGES)
        key = self._pools_key()
        if self._pooled is None or self._pooled[0] != key:  # the pools' offerings, flagged autoscaled (capacity.karpenterpools)
            pools, offerings, _ = self.pools.pools((n.labels for n in self.nodes.values()), self.class_labels)
            self._pooled = key, autoscaled(self._discovered + self.dra.discovered(), pools, offerings, DEFAULT_SCALE_UP_MINUTES)
        return self._pooled[1]

    def _pools_key(self) -> tuple[int, ...]:
        """What the pools' flags read: the nodes' offerings, DRA's, the pools, and (where NodeClaims are not read) the nodes."""
        nodes = 0 if self.pools.synced[NODECLAIMS] or not self.pools.synced[NODEPOOLS] else self._mapped_generation
        return self._discovery, self.dra.generation, self.pools.generation, nodes

    def discovery(self) -> tuple[int, ...]:
        """A value that moves whenever :meth:`discovered` may answer otherwise, or what DRA's devices
        make of an offering may differ (their sizes, their matches): a catalog built from them is kept
        until it moves (:func:`gpuspawner.hub.catalogs.catalog_now`). A pod event never moves it."""
        self.discovered()  # (made now where a node's change dropped it)
        return self._pools_key()

    def availability(self, offering: Offering) -> Availability:
        """Capacity and free units of ``offering`` now (reservations count as taken)."""
        if offering.claim is not None:  # its devices, on the nodes its pod may land on (capacity.draplaced)
            return self.dra.availability(offering, self.dra_room(offering))
        if not offering.resources:
            return UNCOUNTED
        rows = self.tracked.get(_track_key(offering))
        if rows is None or (rows.offering is not offering and rows.offering != offering):  # (the same object: no field compared)
            rows = self._track(offering)
        # DRA nodes that serve the offering's resource through the extended-resource mapping (capacity.mapped).
        mapped = self._mapped(rows)
        if mapped is None:
            return UNCOUNTED
        plugin = rows.availability()
        kept = rows.combined
        if kept is None or kept[0] is not plugin or kept[1] is not mapped:  # both are kept until an event changes them
            kept = rows.combined = (plugin, mapped, with_mapped(plugin, mapped))
        return kept[2]

    def user_pods(self, hub: str | None = None) -> dict[str, PodFacts]:
        """The pods (by key) that carry a hub user's label and, unless ``hub`` is None, were made by
        the hub ``hub`` (``""``: by none, the pods without the hub label)."""
        if hub is not None:
            return self._user_pods.get(hub, {})
        # Each list() is one step for the interpreter: safe beside events applied on another thread.
        return {key: pod for pods in list(self._user_pods.values()) for key, pod in list(pods.items())}

    def observe_user_pods(self, hub: str, observer: Callable[[str, bool], None]) -> None:
        """Tell ``observer(key, present)`` whenever a pod of the hub ``hub`` (``""``: of none) that
        carries a hub user's label arrives in :meth:`user_pods` (``present``: bound and not terminal)
        or leaves it (deleted, or terminal: evicted, its node gone), in the same step as the event or
        relist that says so. The quota ledger gives back a server's grant by it (one observer is
        kept once, however often it is given)."""
        observers = self._observers.setdefault(hub, [])
        if observer not in observers:
            observers.append(observer)

    def _tell(self, hub: str, key: str, present: bool) -> None:
        for observer in list(self._observers.get(hub, ())):
            observer(key, present)

    def fit(self, offering: Offering, needs: ImageNeeds) -> tuple[Offering, str]:
        """``offering`` for an image that needs ``needs`` (:func:`gpuspawner.core.imagefit.fitted`), and
        why none of its nodes or devices can run that image ("" where one can, or it is not known)."""
        fit = fitted(offering, needs)
        if fit is offering:
            return offering, ""
        base = self.availability(offering)
        return fit, misfit(needs, offering, base, self.availability(fit), self.versions(offering, base.nodes))

    def versions(self, offering: Offering, nodes: Iterable[str] = ()) -> list[dict[str, str | None]]:
        """What each device of a DRA ``offering``, or each of ``nodes``, has of what images need
        (driver, CUDA and compute capability versions, by :data:`gpuspawner.core.imagefit.NEEDS` key)."""
        if offering.claim is not None:
            return [{n.key: d.attribute(n.attribute) for n in NEEDS} for d in self.dra.matching(offering)]
        return [{n.key: node_has(n, self.nodes[name].labels) for n in NEEDS} for name in nodes if name in self.nodes]

    # ------------------------------------------------------------------ writes

    def changed(self) -> None:
        """Something the counts read has changed (see :attr:`changes`)."""
        self.changes = next(_CHANGES)

    def set_notebook(self, notebook: Notebook) -> None:
        """The hub's notebook pod (cpu/memory guarantees, selector, tolerations): every count fits it beside the GPU."""
        if notebook != self.notebook:
            self.changed()
            self.notebook = notebook
            for tracked in list(self.tracked):
                self._track(self.tracked[tracked].offering)

    def replace(self, nodes: Iterable[Mapping[str, Any]] | None = None, pods: Iterable[Mapping[str, Any]] | None = None) -> None:
        """A (re)list: replace all nodes and/or all pods, then recompute every row."""
        self.changed()
        if nodes is not None:
            self.nodes = {}
            self._node_offers = {}
            for raw in nodes:
                facts = NodeFacts.from_node(raw)
                self.nodes[facts.name] = facts
                self._node_offers[facts.name] = list(node_offerings(facts, self.class_labels))
            self._discovered = None
            self._plugin_nodes_changed()
            self._mapped_generation += 1
        if pods is not None:
            self.begin_pods()
            self.add_pods(pods)
            self.end_pods()
            return
        for tracked in list(self.tracked):
            self._track(self.tracked[tracked].offering)

    def begin_pods(self) -> None:
        """Start a relist of the pods, fed page by page to :meth:`add_pods` and finished by
        :meth:`end_pods`; the counts read the pods of the relist only from then on (a pod
        gone between the two lists is gone). The API server's raw pages can be dropped as
        soon as each is added: only the slim facts are kept."""
        self._relisting: dict[str, PodFacts] = {}

    def add_pods(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """One page of a relist begun by :meth:`begin_pods`."""
        relisting = self._relisting
        for raw in pods:
            pod = PodFacts.from_pod(raw)
            if pod is not None:
                relisting[pod_key(raw)] = pod

    def end_pods(self) -> None:
        """The relist's pods replace all pods; every row is made again."""
        self.changed()
        self.pods = self._relisting
        del self._relisting
        before, self._user_pods = self._user_pods, {}
        for key, pod in self.pods.items():
            if pod.user:
                self._user_pods.setdefault(pod.hub or "", {})[key] = pod
        for hub in set(before) | set(self._user_pods):  # what the relist found gone, or new
            was, now = before.get(hub, {}), self._user_pods.get(hub, {})
            for key in was.keys() - now.keys():
                self._tell(hub, key, False)
            for key in now.keys() - was.keys():
                self._tell(hub, key, True)
        self.used = {}
        for key, pod in self.pods.items():
            self._add_use(pod.node, pod.requests, +1)
            self.reservations.pop(key, None)
        for node, requests in self.reservations.values():
            self._add_use(node, requests, +1)
        self._mapped_generation += 1
        for tracked in list(self.tracked):
            self._track(self.tracked[tracked].offering)

    def node_event(self, kind: str, raw: Mapping[str, Any]) -> None:
        name = (raw.get("metadata") or {}).get("name", "")
        old_slugs = {o.slug for o, _ in self._node_offers.get(name, ())}
        if kind == "DELETED":
            self.nodes.pop(name, None)
            offers = self._node_offers.pop(name, [])
        else:
            facts = NodeFacts.from_node(raw)
            old = self.nodes.get(name)
            self.nodes[name] = facts
            if old == facts:
                return  # a status heartbeat: nothing the counts use changed
            offers = list(node_offerings(facts, self.class_labels))
            self._node_offers[name] = offers
        self.changed()
        self._mapped_generation += 1
        self._plugin_nodes_changed()
        for rows in self.tracked.values():
            rows.reach.pop(name, None)
        new_slugs = {o.slug for o, _ in offers} if kind != "DELETED" else set()
        if new_slugs != old_slugs or any(o.kind is Kind.FULL for o, _ in offers):
            self._discovered = None
        self._refresh_node(name)

    def pod_event(self, kind: str, raw: Mapping[str, Any]) -> None:
        key = pod_key(raw)
        old = self.pods.pop(key, None)
        new = None if kind == "DELETED" else PodFacts.from_pod(raw)
        if old == new:
            if new is not None:
                self.pods[key] = new
            return
        mapped_before = self._mapped_generation
        touched = set()
        # the hub among whose user pods it was, and is now (None: among none)
        was = (old.hub or "") if old is not None and old.user else None
        now = (new.hub or "") if new is not None and new.user else None
        if old is not None:
            if old.user:
                self._user_pods.get(old.hub or "", {}).pop(key, None)
            self._add_use(old.node, old.requests, -1)
            touched.add(old.node)
        if new is not None:
            self.pods[key] = new
            if new.user:
                self._user_pods.setdefault(new.hub or "", {})[key] = new
            self._add_use(new.node, new.requests, +1)
            touched.add(new.node)
            # The pod is bound: its requests now count, so its reservation goes.
            reserved = self.reservations.pop(key, None)
            if reserved is not None:
                self._add_use(reserved[0], reserved[1], -1)
                touched.add(reserved[0])
        counted = [self._refresh_node(node) for node in touched]
        # A pod that moved no count (another team's pod on a node no offering shown counts, say), is
        # nobody's server and touched no DRA node leaves `changes` as it was: the page stays kept.
        if any(counted) or was is not None or now is not None or self._mapped_generation != mapped_before:
            self.changed()
        if was is not None and was != now:
            self._tell(was, key, False)
        if now is not None and now != was:
            self._tell(now, key, True)

    def reserve(self, key: str, offering: Offering, count: int) -> str | None:
        """Hold ``count`` units of ``offering`` for the pod ``key`` until it is bound (or released).

        The units (and the notebook's cpu, memory and pod slot) are taken on the node with
        the most free room for them, so every offering that shares that node sees them
        taken. Returns the node, or None if no node has room (nothing is held then). A DRA
        offering holds devices instead (:meth:`gpuspawner.dra.devices.DraState.reserve`).
        """
        self.release(key)
        self.changed()
        if offering.claim is not None:
            node = self.dra.reserve(key, offering, count, self.dra_room(offering))
            if node:  # the notebook's cpu, memory and pod slot there too, until the pod is bound
                self.reservations[key] = (node, dict(self.notebook.requests))
                self._add_use(node, self.notebook.requests, +1)
                self._refresh_node(node)
            return node
        self.availability(offering)
        rows = self.tracked[_track_key(offering)].rows
        fits = [(largest, free, node) for node, (_cap, _alloc, free, largest) in rows.items() if largest >= count]
        if not fits:
            return self._reserve_mapped(key, offering, count)
        *_, node = max(fits)
        requests = dict(self.notebook.requests)
        for name, amount in offering.limits_for(count).items():
            requests[name] = requests.get(name, 0) + amount
        self.reservations[key] = (node, requests)
        self._add_use(node, requests, +1)
        self._refresh_node(node)
        return node

    def _reserve_mapped(self, key: str, offering: Offering, count: int) -> str | None:
        """Hold ``count`` units of an extended-resource offering as free DRA devices of a node the mapping serves it on."""
        mapped = self._mapped(self.tracked[_track_key(offering)]) or []
        fits = [(row[3], row[2], node, devices) for node, row, devices in mapped if row[3] >= count]
        if not fits:
            return None
        *_, node, devices = max(fits)
        (per,) = offering.resources.values()
        self.dra.hold(key, devices[: count * per])
        self.reservations[key] = (node, dict(self.notebook.requests))
        self._add_use(node, self.notebook.requests, +1)
        self._refresh_node(node)
        return node

    def release(self, key: str) -> None:
        self.changed()
        self.dra.release(key)
        reserved = self.reservations.pop(key, None)
        if reserved is not None:
            self._add_use(reserved[0], reserved[1], -1)
            self._refresh_node(reserved[0])

    # ------------------------------------------------------------------ internals

    def dra_room(self, offering: Offering) -> dict[str, int]:
        """How many more of a DRA ``offering``'s pods each node with devices takes (:mod:`gpuspawner.capacity.draplaced`)."""
        stamp = (self._mapped_generation, self.notebook, self.dra.generation)
        return self._dra_rooms.get(Tally(offering, self.notebook), self.nodes, self.used, self.dra.device_nodes(), stamp)

    def _plugin_nodes_changed(self) -> None:
        """Nodes whose allocatable advertises NVIDIA extended resources are the device plugin's (never DRA-counted)."""
        self.dra.set_plugin_nodes(
            name for name, facts in self.nodes.items() if any(r.startswith(PLUGIN_PREFIX) and n > 0 for r, n in facts.allocatable.items())
        )

    def _mapped(self, rows: _OfferingRows) -> list[tuple[str, Row, list[Any]]] | None:
        """:func:`~gpuspawner.capacity.mapped.mapped_rows` for ``rows``' offering, made again only
        after an event that changes what they read: a node, the DRA state (slices, classes,
        claims, reservations, listed or not), or what pods use on a node with DRA devices."""
        stamp = (self._mapped_generation, self.dra.generation, self.dra.synced)
        kept = rows.mapped
        if kept is not None and kept[0] == stamp:
            return kept[1]
        found = mapped_rows(rows.tally, self.nodes, self.used, self.dra)
        rows.mapped = (stamp, found)
        return found

    def _add_use(self, node: str, requests: Mapping[str, int], sign: int) -> None:
        if node in self.dra.device_nodes():
            self._mapped_generation += 1
        bucket = self.used.setdefault(node, Counter())
        for name, amount in requests.items():
            bucket[name] += sign * amount
            if not bucket[name]:
                del bucket[name]

    def _row(self, rows: _OfferingRows, node: str) -> Row | None:
        facts = self.nodes.get(node)
        if facts is None:
            return None
        reached = rows.reach.get(node)
        if reached is None:
            reached = rows.reach[node] = rows.tally.reaches(facts)
        return rows.tally.row(facts, self.used.get(node, {}), reached)

    def _refresh_node(self, node: str) -> bool:
        """Every tracked offering's row of ``node`` made again; whether any count changed."""
        facts = self.nodes.get(node)
        used: Mapping[str, int] = self.used.get(node, {})
        changed = False
        for rows in self.tracked.values():
            if facts is None:
                changed |= rows.set(node, None)
                continue
            reached = rows.reach.get(node)
            if reached is None:
                reached = rows.reach[node] = rows.tally.reaches(facts)
            if reached:
                changed |= rows.set(node, rows.tally.row(facts, used, True))
            elif node in rows.rows:
                changed |= rows.set(node, None)
        return changed

    def _track(self, offering: Offering) -> _OfferingRows:
        rows = _OfferingRows(offering, self.notebook)
        for node in self.nodes:
            row = self._row(rows, node)
            if row is not None:
                rows.set(node, row)
        self.tracked[_track_key(offering)] = rows
        return rows


def _track_key(offering: Offering) -> tuple[str, Any]:
    """Rows per slug and placement: an offering fitted to an image (:meth:`ClusterIndex.fit`) is counted beside it."""
    return offering.slug, offering.placement_terms


@dataclass(frozen=True)
class Health:
    """How far the counts can be trusted now. Read without waiting.

    ``ready``: both streams are synced, the counts are live. Otherwise ``answered``
    says whether the API server has answered (or failed) at all since this process
    started, ``as_of`` is the wall-clock time (``time.time()``) at which the counts
    were last live (None: never), and ``error`` the last failure, for the log.
    ``forbidden``: the API server answers, but the hub may not list/watch nodes and pods
    (its RBAC; the logged message): there are no counts, yet pods can be made.
    """

    ready: bool
    answered: bool = True
    as_of: float | None = None
    error: str = ""
    forbidden: str = ""
