"""What a Kueue LocalQueue still admits of an offering, from its ClusterQueue's quota. Pure.

The hub watches Kueue's LocalQueues, ClusterQueues and ResourceFlavors
(:class:`gpuspawner.hub.inventory.Inventory`, only where ``c.GPUSpawner.kueue_queues`` is set)
and feeds them to :class:`KueueState`; :meth:`KueueState.room` answers, for the LocalQueue a
user's server of an offering goes to, how many more one-unit servers its ClusterQueue admits
and the most units one server may take (a :class:`~gpuspawner.core.model.QueueRoom`). The
spawn page and admission take the smaller of that and the nodes' free count
(:meth:`gpuspawner.core.model.Availability.within`).

As Kueue v0.17.0 assigns flavors (``pkg/scheduler/flavorassigner/flavorassigner.go``):

* Every resource the pod requests must be covered by one of the ClusterQueue's resource
  groups (``pods`` only counts where a group covers it). The offering's own extended
  resource uncovered: the queue admits none. The notebook's cpu or memory uncovered is not
  counted here: Kueue refuses such a pod unless its configuration excludes the resource
  (``resources.excludeResourcePrefixes``), which the hub cannot read.
* In each group, a flavor may take the pod when its ResourceFlavor's ``nodeTaints`` are
  tolerated (the pod's tolerations plus the flavor's) and its ``nodeLabels`` match the pod's
  node selector and required node affinity, restricted to the label keys the group's
  flavors use (``flavorSelector``: a key no flavor of the group labels does not count).
* A flavor has room for what ``nominalQuota`` less ``status.flavorsReservation`` leaves, for
  every resource the group covers; the pod goes to the first flavor with room.

**Cohort borrowing is ignored**: a ClusterQueue in a cohort may admit more than its nominal
quota by borrowing what its cohort's other queues do not use (and may have its own lent
away). This counts the nominal quota only, so it may say "allows none" where a borrowing
queue would still admit a server (Kueue then admits it: admission ``warn`` lets it wait for
Kueue's word). docs/kueue.md says so too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuspawner.capacity.counts import offering_pod
from gpuspawner.core.fit import PODS, PodSpec, amount
from gpuspawner.core.model import Offering, QueueRoom
from gpuspawner.names.kueuenames import CLUSTER_QUEUES, COND_ACTIVE, LOCAL_QUEUES, RESOURCE_FLAVORS, STOP_NONE
from gpuspawner.names.selectors import Terms, terms_match, untolerated_taint
from gpuspawner.pod.notebook import Notebook

#: The kinds :class:`KueueState` keeps (the inventory's stream names for them).
STREAMS = (LOCAL_QUEUES, CLUSTER_QUEUES, RESOURCE_FLAVORS)
#: Why the queue's room is unknown until Kueue's objects have been listed once.
NOT_LISTED = "Kueue's queues are not listed yet"
#: Why a DRA offering's queue room is unknown (Kueue's DRA support maps device classes to
#: resources in its own configuration, which the hub cannot read).
NOT_FOR_DRA = "devices of Dynamic Resource Allocation are not counted against Kueue's quota"


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _quantities(resources: Iterable[Mapping[str, Any]], key: str) -> dict[str, int]:
    out = {}
    for entry in resources or ():
        name = str(entry.get("name") or "")
        value = amount(name, entry.get(key, 0) or 0)
        if name and value is not None:
            out[name] = value
    return out


@dataclass(frozen=True)
class Flavor:
    """A ResourceFlavor as flavor assignment reads it."""

    name: str
    node_labels: Mapping[str, str]
    taints: tuple[Mapping[str, Any], ...] = ()
    tolerations: tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> Flavor:
        spec = obj.get("spec") or {}
        return cls(
            name=str(_meta(obj).get("name", "")),
            node_labels={str(k): str(v) for k, v in (spec.get("nodeLabels") or {}).items()},
            taints=tuple(dict(t) for t in spec.get("nodeTaints") or ()),
            tolerations=tuple(dict(t) for t in spec.get("tolerations") or ()),
        )


@dataclass(frozen=True)
class ResourceGroup:
    """One of a ClusterQueue's ``spec.resourceGroups``: the resources it covers and, in order,
    each flavor's ``nominalQuota`` of them (scheduler units: cpu in millicores, memory in bytes)."""

    covered: frozenset[str]
    flavors: tuple[tuple[str, Mapping[str, int]], ...]


@dataclass(frozen=True)
class ClusterQueue:
    """A ClusterQueue: its resource groups, what its admitted workloads reserve per flavor, and
    whether it admits anything (condition ``Active`` not False, ``stopPolicy`` None)."""

    name: str
    groups: tuple[ResourceGroup, ...]
    reserved: Mapping[str, Mapping[str, int]]
    admits: bool = True

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> ClusterQueue:
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        groups = tuple(
            ResourceGroup(
                covered=frozenset(str(r) for r in group.get("coveredResources") or ()),
                flavors=tuple(
                    (str(f.get("name") or ""), _quantities(f.get("resources") or (), "nominalQuota")) for f in group.get("flavors") or ()
                ),
            )
            for group in spec.get("resourceGroups") or ()
        )
        reserved = {
            str(f.get("name") or ""): _quantities(f.get("resources") or (), "total") for f in status.get("flavorsReservation") or ()
        }
        return cls(name=str(_meta(obj).get("name", "")), groups=groups, reserved=reserved, admits=_admits(obj))


def condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    """The condition of type ``kind`` in a Kubernetes object's ``status.conditions`` (None: not there)."""
    return next((c for c in (obj.get("status") or {}).get("conditions") or () if c.get("type") == kind), None)


def _admits(obj: Mapping[str, Any]) -> bool:
    """Whether a ClusterQueue admits at all: no ``stopPolicy``, and not ``Active`` False."""
    if ((obj.get("spec") or {}).get("stopPolicy") or STOP_NONE) != STOP_NONE:
        return False
    active = condition(obj, COND_ACTIVE)
    return active is None or active.get("status") != "False"


@dataclass(frozen=True)
class LocalQueue:
    namespace: str
    name: str
    cluster_queue: str
    admits: bool = True

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> LocalQueue:
        meta, spec = _meta(obj), obj.get("spec") or {}
        return cls(
            namespace=str(meta.get("namespace", "")),
            name=str(meta.get("name", "")),
            cluster_queue=str(spec.get("clusterQueue") or ""),
            admits=(spec.get("stopPolicy") or STOP_NONE) == STOP_NONE,
        )


def restricted(pod: PodSpec, keys: frozenset[str]) -> tuple[dict[str, str], Terms]:
    """The pod's node selector and required node-affinity terms as Kueue matches them against a
    flavor: only the label ``keys`` the group's flavors use; a term left empty drops the affinity
    (its terms are ORed, so it matches every flavor); matchFields never count."""
    selector = {k: v for k, v in pod.node_selector.items() if k in keys}
    terms = []
    for term in pod.terms:
        kept = tuple(req for req in term if not req.field and req.key in keys)
        if not kept:
            return selector, ()
        terms.append(kept)
    return selector, tuple(terms)


def flavor_takes(flavor: Flavor, pod: PodSpec, keys: frozenset[str]) -> bool:
    """Would Kueue assign ``flavor`` to this pod at all (taints, node labels), whatever its quota?"""
    if untolerated_taint((*pod.admitted_tolerations(), *flavor.tolerations), flavor.taints) is not None:
        return False
    selector, terms = restricted(pod, keys)
    labels = flavor.node_labels
    return all(labels.get(k) == v for k, v in selector.items()) and terms_match(terms, labels)


def _fits(left: Mapping[str, int], needs: Mapping[str, int]) -> int:
    """How many pods asking ``needs`` the room ``left`` takes, one after another."""
    return min((max(left.get(r, 0), 0) // n for r, n in needs.items() if n > 0), default=0)


def room(offering: Offering, notebook: Notebook, cq: ClusterQueue, flavors: Mapping[str, Flavor]) -> tuple[int, int]:
    """(one-unit servers ``cq`` still admits, the most units of ``offering`` one server may take) by
    its nominal quota (see the module's docstring: cohort borrowing is ignored)."""
    if not cq.admits:
        return 0, 0

    def needs(count: int) -> dict[str, int]:
        requests = offering_pod(offering, notebook, count).requests
        covered = set().union(*(g.covered for g in cq.groups))
        return {r: n for r, n in requests.items() if n > 0 and (r != PODS or PODS in covered)}

    one = needs(1)
    if any(not any(r in g.covered for g in cq.groups) for r in offering.resources):
        return 0, 0  # the offering's GPU is not in this queue: Kueue admits none
    pod = offering_pod(offering, notebook)
    takers: list[tuple[ResourceGroup, list[Mapping[str, int]]]] = []
    for group in cq.groups:
        if not any(r in group.covered for r in one):
            continue
        keys = frozenset(k for name, _ in group.flavors if name in flavors for k in flavors[name].node_labels)
        lefts: list[Mapping[str, int]] = []
        for name, nominal in group.flavors:
            flavor = flavors.get(name)
            if flavor is None or not flavor_takes(flavor, pod, keys):
                continue
            reserved = cq.reserved.get(name) or {}
            lefts.append({r: nominal.get(r, 0) - reserved.get(r, 0) for r in group.covered})
        takers.append((group, lefts))

    def group_needs(group: ResourceGroup, count: int) -> dict[str, int]:
        return {r: n for r, n in needs(count).items() if r in group.covered}

    free = min((sum(_fits(left, group_needs(group, 1)) for left in lefts) for group, lefts in takers), default=0)
    largest = max(
        (c for c in offering.counts if all(any(_fits(left, group_needs(group, c)) >= 1 for left in lefts) for group, lefts in takers)),
        default=0,
    )
    return free, (largest if free > 0 else 0)


class KueueState:
    """Kueue's LocalQueues, ClusterQueues and ResourceFlavors as the hub's watch last saw them.

    ``synced``: each kind has been listed; ``unavailable``: why they cannot be read (Kueue's
    CRDs not served, 404; the hub may not read them, 403), "" while they can.
    """

    def __init__(self) -> None:
        self.local: dict[tuple[str, str], LocalQueue] = {}
        self.cluster: dict[str, ClusterQueue] = {}
        self.flavors: dict[str, Flavor] = {}
        self.synced: dict[str, bool] = dict.fromkeys(STREAMS, False)
        self.unavailable = ""

    def replace(self, kind: str, items: Iterable[Mapping[str, Any]]) -> None:
        """A (re)list of one kind."""
        if kind == LOCAL_QUEUES:
            self.local = {}
        elif kind == CLUSTER_QUEUES:
            self.cluster = {}
        else:
            self.flavors = {}
        apply = self.event(kind)
        for item in items:
            apply("ADDED", item)

    def event(self, kind: str) -> Callable[[str, Mapping[str, Any]], None]:
        """The handler of one kind's watch events (``ADDED``, ``MODIFIED``, ``DELETED``)."""
        return {LOCAL_QUEUES: self._local_event, CLUSTER_QUEUES: self._cluster_event, RESOURCE_FLAVORS: self._flavor_event}[kind]

    def _local_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        queue = LocalQueue.from_object(obj)
        key = (queue.namespace, queue.name)
        if kind == "DELETED":
            self.local.pop(key, None)
        else:
            self.local[key] = queue

    def _cluster_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        queue = ClusterQueue.from_object(obj)
        if kind == "DELETED":
            self.cluster.pop(queue.name, None)
        else:
            self.cluster[queue.name] = queue

    def _flavor_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        flavor = Flavor.from_object(obj)
        if kind == "DELETED":
            self.flavors.pop(flavor.name, None)
        else:
            self.flavors[flavor.name] = flavor

    def room(self, offering: Offering, notebook: Notebook, namespace: str, queue: str) -> QueueRoom:
        """What the LocalQueue ``queue`` in ``namespace`` still admits of ``offering``. A queue
        or ClusterQueue the hub has not seen is unknown (Kueue refuses the pod if it does not
        exist: see gpuspawner.hub.kueue); a stopped or inactive one admits none."""
        if self.unavailable:
            return QueueRoom(queue, unknown=self.unavailable)
        if not all(self.synced.values()):
            return QueueRoom(queue, unknown=NOT_LISTED)
        if offering.claim is not None:
            return QueueRoom(queue, unknown=NOT_FOR_DRA)
        local = self.local.get((namespace, queue))
        cq = self.cluster.get(local.cluster_queue) if local is not None else None
        if local is None or cq is None:
            # Not seen (yet: just made, or a watch behind) or misnamed: Kueue decides, and says
            # "LocalQueue ... doesn't exist" itself (the spawn is refused with its words).
            missing = f"LocalQueue {queue}" if local is None else f"ClusterQueue {local.cluster_queue}"
            return QueueRoom(queue, unknown=f"{missing} is not known to the hub")
        if not local.admits:
            return QueueRoom(queue, free=0, largest=0)
        free, largest = room(offering, notebook, cq, self.flavors)
        return QueueRoom(queue, free=free, largest=largest)
