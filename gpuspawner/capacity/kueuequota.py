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
* A flavor has room for what Kueue's ``available`` leaves of each resource the group covers
  (:class:`QuotaTree`): the ClusterQueue's ``nominalQuota`` less what it reserves
  (``status.flavorsReservation``), plus what it may borrow from its cohort: what the cohort's
  queues (and the Cohort objects' own quota, up their ``spec.parentName`` tree) lend and do not
  use, within the queue's ``borrowingLimit``; a queue's ``lendingLimit`` keeps
  ``nominalQuota - lendingLimit`` for itself. The pod goes to the first flavor with room.

Preemption is not counted: a server Kueue would admit only by preempting another workload waits
for that (its words say so), so it is not "allowed" here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuspawner.capacity.counts import offering_pod
from gpuspawner.core.fit import PODS, PodSpec, amount
from gpuspawner.core.model import Offering, QueueRoom
from gpuspawner.names.kueuenames import CLUSTER_QUEUES, COHORTS, COND_ACTIVE, LOCAL_QUEUES, RESOURCE_FLAVORS, STOP_NONE
from gpuspawner.names.selectors import Terms, terms_match, untolerated_taint
from gpuspawner.pod.notebook import Notebook

#: The kinds :class:`KueueState` keeps (the inventory's stream names for them).
STREAMS = (LOCAL_QUEUES, CLUSTER_QUEUES, RESOURCE_FLAVORS, COHORTS)
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
class Quota:
    """One (flavor, resource) of a ClusterQueue's or Cohort's ``resourceGroups``: ``nominalQuota``,
    and ``borrowingLimit`` / ``lendingLimit`` (None: no limit), in scheduler units."""

    nominal: int = 0
    borrowing_limit: int | None = None
    lending_limit: int | None = None


def _limit(name: str, value: Any) -> int | None:
    return None if value is None else amount(name, value)


def _quotas(resources: Iterable[Mapping[str, Any]]) -> dict[str, Quota]:
    out = {}
    for entry in resources or ():
        name = str(entry.get("name") or "")
        nominal = amount(name, entry.get("nominalQuota", 0) or 0)
        if name and nominal is not None:
            out[name] = Quota(nominal, _limit(name, entry.get("borrowingLimit")), _limit(name, entry.get("lendingLimit")))
    return out


def _groups(spec: Mapping[str, Any]) -> tuple[ResourceGroup, ...]:
    return tuple(
        ResourceGroup(
            covered=frozenset(str(r) for r in group.get("coveredResources") or ()),
            flavors=tuple((str(f.get("name") or ""), _quotas(f.get("resources") or ())) for f in group.get("flavors") or ()),
        )
        for group in spec.get("resourceGroups") or ()
    )


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
    """One of a ClusterQueue's (or Cohort's) ``spec.resourceGroups``: the resources it covers and,
    in order, each flavor's :class:`Quota` of them (scheduler units: cpu in millicores, memory in
    bytes)."""

    covered: frozenset[str]
    flavors: tuple[tuple[str, Mapping[str, Quota]], ...]

    def quotas(self) -> dict[tuple[str, str], Quota]:
        """Each (flavor, resource) the group gives a quota."""
        return {(name, r): q for name, quotas in self.flavors for r, q in quotas.items()}


@dataclass(frozen=True)
class ClusterQueue:
    """A ClusterQueue: its resource groups, what its admitted workloads reserve per flavor, its
    cohort (``spec.cohortName``, "" for none), and whether it admits anything (condition
    ``Active`` not False, ``stopPolicy`` None)."""

    name: str
    groups: tuple[ResourceGroup, ...]
    reserved: Mapping[str, Mapping[str, int]]
    admits: bool = True
    cohort: str = ""

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> ClusterQueue:
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        reserved = {
            str(f.get("name") or ""): _quantities(f.get("resources") or (), "total") for f in status.get("flavorsReservation") or ()
        }
        return cls(
            name=str(_meta(obj).get("name", "")),
            groups=_groups(spec),
            reserved=reserved,
            admits=_admits(obj),
            cohort=str(spec.get("cohortName") or ""),
        )


@dataclass(frozen=True)
class Cohort:
    """A Cohort object (``kueue.x-k8s.io/v1beta2`` ``cohorts``): its parent (``spec.parentName``,
    "" for a root) and its own quota, a pool its ClusterQueues share on top of theirs. A cohort a
    ClusterQueue or Cohort names without an object is a root with no quota of its own."""

    name: str
    parent: str = ""
    groups: tuple[ResourceGroup, ...] = ()

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> Cohort:
        spec = obj.get("spec") or {}
        return cls(name=str(_meta(obj).get("name", "")), parent=str(spec.get("parentName") or ""), groups=_groups(spec))


#: One (flavor, resource) pair, as Kueue's ``resources.FlavorResource``.
FlavorResource = tuple[str, str]


@dataclass
class _Node:
    """A ClusterQueue or Cohort as Kueue's ``resourceNode`` (``pkg/cache/scheduler/resource_node.go``):
    its quotas; ``subtree``, its nominal quota plus what its children lend it (each child's
    ``SubtreeQuota`` less its ``localQuota``); ``usage``, for a ClusterQueue what it reserves,
    for a Cohort what its children use beyond their ``localQuota``."""

    name: str
    quotas: Mapping[FlavorResource, Quota]
    parent: _Node | None = None
    subtree: dict[FlavorResource, int] | None = None
    usage: dict[FlavorResource, int] | None = None

    def local_quota(self, fr: FlavorResource) -> int:
        """Quota kept from the parent by a ``lendingLimit``: ``max(0, SubtreeQuota - lendingLimit)``."""
        limit = self.quotas.get(fr, Quota()).lending_limit
        return max(0, (self.subtree or {}).get(fr, 0) - limit) if limit is not None else 0

    def local_available(self, fr: FlavorResource) -> int:
        return max(0, self.local_quota(fr) - (self.usage or {}).get(fr, 0))


def _available(node: _Node, fr: FlavorResource) -> int:
    """Kueue's ``available``: what remains for ``node``, up its cohort tree within its borrowing limits."""
    subtree, usage = node.subtree or {}, node.usage or {}
    if node.parent is None:
        return subtree.get(fr, 0) - usage.get(fr, 0)
    parent = _available(node.parent, fr)
    limit = node.quotas.get(fr, Quota()).borrowing_limit
    if limit is not None:
        stored_in_parent = subtree.get(fr, 0) - node.local_quota(fr)
        used_in_parent = max(0, usage.get(fr, 0) - node.local_quota(fr))
        parent = min(stored_in_parent - used_in_parent + limit, parent)
    return node.local_available(fr) + parent


class QuotaTree:
    """ClusterQueues and their cohorts as Kueue's scheduler cache sums them: what each
    ClusterQueue may still use of a (flavor, resource) now, its own unused quota plus what it may
    borrow (Kueue v0.17.0 ``pkg/cache/scheduler/resource_node.go``: ``available``,
    ``accumulateFromChild``, ``localQuota``; ``ClusterQueueSnapshot.Available`` is never below 0).

    A cohort tree with a cycle admits nothing in Kueue (its members are inactive), and the
    ClusterQueue's ``Active`` condition says so; here the cycle is cut where it closes."""

    def __init__(self, queues: Mapping[str, ClusterQueue], cohorts: Mapping[str, Cohort]) -> None:
        self.nodes: dict[str, _Node] = {}
        cohort_nodes: dict[str, _Node] = {}
        children: dict[str, list[_Node]] = {}

        def cohort_node(name: str, path: tuple[str, ...] = ()) -> _Node:
            found = cohort_nodes.get(name)
            if found is not None:
                return found
            obj = cohorts.get(name) or Cohort(name)
            quotas = {fr: q for g in obj.groups for fr, q in g.quotas().items()}
            node = cohort_nodes[name] = _Node(name, quotas)
            if obj.parent and obj.parent not in (*path, name):
                node.parent = cohort_node(obj.parent, (*path, name))
                children.setdefault(obj.parent, []).append(node)
            return node

        for cq in queues.values():
            quotas = {fr: q for g in cq.groups for fr, q in g.quotas().items()}
            usage = {(flavor, r): n for flavor, rs in cq.reserved.items() for r, n in rs.items()}
            node = self.nodes[cq.name] = _Node(cq.name, quotas, subtree={fr: q.nominal for fr, q in quotas.items()}, usage=usage)
            if cq.cohort:
                node.parent = cohort_node(cq.cohort)
                children.setdefault(cq.cohort, []).append(node)

        def accumulate(node: _Node) -> None:
            node.subtree = {fr: q.nominal for fr, q in node.quotas.items()}
            node.usage = {}
            for child in children.get(node.name, ()):
                if child.subtree is None:
                    accumulate(child)
                for fr, quota in (child.subtree or {}).items():
                    node.subtree[fr] = node.subtree.get(fr, 0) + quota - child.local_quota(fr)
                for fr, used in (child.usage or {}).items():
                    node.usage[fr] = node.usage.get(fr, 0) + max(0, used - child.local_quota(fr))

        for node in list(cohort_nodes.values()):
            if node.subtree is None:
                accumulate(node)

    def available(self, queue: str, fr: FlavorResource) -> int:
        """What ClusterQueue ``queue`` may still take of ``fr`` now, borrowing included (0: none)."""
        node = self.nodes.get(queue)
        return max(0, _available(node, fr)) if node is not None else 0

    def nominal_available(self, queue: str, fr: FlavorResource) -> int:
        """What ``queue`` has left of its own nominal quota, without borrowing."""
        node = self.nodes.get(queue)
        if node is None:
            return 0
        return max(0, (node.subtree or {}).get(fr, 0) - (node.usage or {}).get(fr, 0))


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


def _needs(offering: Offering, notebook: Notebook, cq: ClusterQueue, count: int) -> dict[str, int]:
    """What a server of ``count`` units asks of ``cq``: its pod's requests (``pods`` only where a group covers it)."""
    requests = offering_pod(offering, notebook, count).requests
    covered = set().union(*(g.covered for g in cq.groups))
    return {r: n for r, n in requests.items() if n > 0 and (r != PODS or PODS in covered)}


def takers(
    offering: Offering, notebook: Notebook, cq: ClusterQueue, flavors: Mapping[str, Flavor]
) -> list[tuple[ResourceGroup, list[str]]] | None:
    """Each of ``cq``'s resource groups the offering's pod asks from, with the flavors of it that
    would take the pod, in order; None where Kueue admits none (the offering's GPU resource is
    in no group of the queue)."""
    if any(not any(r in g.covered for g in cq.groups) for r in offering.resources):
        return None
    one = _needs(offering, notebook, cq, 1)
    pod = offering_pod(offering, notebook)
    found: list[tuple[ResourceGroup, list[str]]] = []
    for group in cq.groups:
        if not any(r in group.covered for r in one):
            continue
        keys = frozenset(k for name, _ in group.flavors if name in flavors for k in flavors[name].node_labels)
        names = [name for name, _ in group.flavors if name in flavors and flavor_takes(flavors[name], pod, keys)]
        found.append((group, names))
    return found


def room(
    offering: Offering, notebook: Notebook, cq: ClusterQueue, flavors: Mapping[str, Flavor], tree: QuotaTree | None = None
) -> tuple[int, int, int]:
    """(one-unit servers ``cq`` still admits, the most units of ``offering`` one server may take,
    how many of those one-unit servers it admits only by borrowing from its cohort), by what
    :class:`QuotaTree` says is available (see the module's docstring)."""
    if not cq.admits:
        return 0, 0, 0
    groups = takers(offering, notebook, cq, flavors)
    if groups is None:
        return 0, 0, 0  # the offering's GPU is not in this queue: Kueue admits none
    tree = tree if tree is not None else QuotaTree({cq.name: cq}, {})

    def counted(left: Callable[[str, FlavorResource], int]) -> tuple[int, int]:
        lefts = [(group, [{r: left(cq.name, (name, r)) for r in group.covered} for name in names]) for group, names in groups]

        def group_needs(group: ResourceGroup, count: int) -> dict[str, int]:
            return {r: n for r, n in _needs(offering, notebook, cq, count).items() if r in group.covered}

        free = min((sum(_fits(one, group_needs(group, 1)) for one in each) for group, each in lefts), default=0)
        largest = max(
            (c for c in offering.counts if all(any(_fits(one, group_needs(group, c)) >= 1 for one in each) for group, each in lefts)),
            default=0,
        )
        return free, (largest if free > 0 else 0)

    free, largest = counted(tree.available)
    own, _ = counted(tree.nominal_available)
    return free, largest, max(0, free - own)


class KueueState:
    """Kueue's LocalQueues, ClusterQueues, ResourceFlavors and Cohorts as the hub's watch last saw them.

    ``synced``: each kind has been listed; ``unavailable``: why they cannot be read (Kueue's
    CRDs not served, 404; the hub may not read them, 403), "" while they can.
    """

    def __init__(self) -> None:
        self.local: dict[tuple[str, str], LocalQueue] = {}
        self.cluster: dict[str, ClusterQueue] = {}
        self.flavors: dict[str, Flavor] = {}
        self.cohorts: dict[str, Cohort] = {}
        self.synced: dict[str, bool] = dict.fromkeys(STREAMS, False)
        self.unavailable = ""

    def replace(self, kind: str, items: Iterable[Mapping[str, Any]]) -> None:
        """A (re)list of one kind."""
        if kind == LOCAL_QUEUES:
            self.local = {}
        elif kind == CLUSTER_QUEUES:
            self.cluster = {}
        elif kind == COHORTS:
            self.cohorts = {}
        else:
            self.flavors = {}
        apply = self.event(kind)
        for item in items:
            apply("ADDED", item)

    def event(self, kind: str) -> Callable[[str, Mapping[str, Any]], None]:
        """The handler of one kind's watch events (``ADDED``, ``MODIFIED``, ``DELETED``)."""
        return {
            LOCAL_QUEUES: self._local_event,
            CLUSTER_QUEUES: self._cluster_event,
            RESOURCE_FLAVORS: self._flavor_event,
            COHORTS: self._cohort_event,
        }[kind]

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

    def _cohort_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        cohort = Cohort.from_object(obj)
        if kind == "DELETED":
            self.cohorts.pop(cohort.name, None)
        else:
            self.cohorts[cohort.name] = cohort

    def tree(self) -> QuotaTree:
        """Every ClusterQueue and cohort as the watch last saw them, summed as Kueue sums them."""
        return QuotaTree(self.cluster, self.cohorts)

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
        free, largest, borrowed = room(offering, notebook, cq, self.flavors, self.tree())
        return QueueRoom(queue, free=free, largest=largest, borrowed=borrowed, cohort=cq.cohort if borrowed else "")
