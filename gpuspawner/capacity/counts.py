"""Nodes + pods -> capacity, allocated and free per offering. Pure.

Counted with the scheduler's own filters (:mod:`gpuspawner.core.fit`) applied to the pod the
hub would create for the offering: its GPU limits, node selector, node affinity and
tolerations, plus what the notebook itself asks for (:class:`~gpuspawner.pod.notebook.Notebook`:
cpu and memory guarantees, one pod's room). A node counts for an offering exactly where
that pod could land:

* ``capacity``: the units of the offering the node advertises (``status.allocatable``,
  never ``capacity``), on nodes the pod's selector, affinity, tolerations and the
  node's cordon let it onto;
* ``allocated``: the units the pods bound there request (all namespaces, non-terminal,
  init containers as the scheduler counts them);
* ``free``: how many one-unit notebooks the scheduler would still bind there, one after
  another: also limited by ``allocatable.pods`` and by the cpu and memory left beside
  the other pods' requests (a GPU is not free if the notebook cannot fit beside it);
* ``largest_free``: the most units one notebook can take on one node (at most its largest count).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpuspawner.core.fit import NodeFacts, PodSpec, blocked, room, used_by_node
from gpuspawner.core.model import UNCOUNTED, Availability, Offering
from gpuspawner.names.selectors import and_terms
from gpuspawner.pod.notebook import Notebook
from gpuspawner.pod.podspec import merge_tolerations

NO_NOTEBOOK = Notebook()


#: One node's numbers for one offering: (capacity, allocated, free, largest_free).
Row = tuple[int, int, int, int]


def units(offering: Offering, amounts: Mapping[str, int]) -> int:
    """Whole units of ``offering`` that ``amounts`` of each resource make."""
    return min((amounts.get(r, 0) // per for r, per in offering.resources.items()), default=0)


def offering_pod(offering: Offering, notebook: Notebook = NO_NOTEBOOK, count: int = 1) -> PodSpec:
    """The scheduler's view of the notebook pod for ``count`` units of ``offering``.

    Merged the way GPUSpawner merges an offering into KubeSpawner's settings: the
    offering's selector wins over the hub's on the same key, affinity terms AND together,
    tolerations add up.
    """
    requests = dict(notebook.requests)
    for name, amount in offering.limits_for(count).items():
        requests[name] = requests.get(name, 0) + amount
    return PodSpec(
        requests=requests,
        node_selector={**notebook.node_selector, **offering.node_selector},
        terms=and_terms(notebook.terms, offering.placement_terms),
        tolerations=tuple(merge_tolerations(list(notebook.tolerations), offering.tolerations)),
    )


class Tally:
    """Counts one offering node by node; built once per offering and notebook (the index keeps it)."""

    __slots__ = ("offering", "pod", "notebook_requests", "tolerations")

    def __init__(self, offering: Offering, notebook: Notebook = NO_NOTEBOOK):
        self.offering = offering
        self.pod = offering_pod(offering, notebook)
        self.notebook_requests = dict(notebook.requests)
        self.tolerations = self.pod.admitted_tolerations()

    def reaches(self, node: NodeFacts) -> bool:
        """Could the scheduler place this offering's pod on ``node`` if it were empty?"""
        resources = self.offering.resources
        if not resources or any(node.allocatable.get(r, 0) <= 0 for r in resources):
            return False
        return blocked(self.pod, node, self.tolerations) is None

    def row(self, node: NodeFacts, used: Mapping[str, int], reached: bool | None = None) -> Row | None:
        """This offering's numbers on ``node`` given what its pods request (None: not one of its nodes).

        ``reached``: :meth:`reaches` for this node if known (it changes only when the node does).
        """
        if not (self.reaches(node) if reached is None else reached):
            return None
        offering = self.offering
        capacity = units(offering, node.allocatable)
        gpu_free = max(units(offering, {r: node.allocatable.get(r, 0) - used.get(r, 0) for r in offering.resources}), 0)
        free = room(self.pod.requests, node, used)
        largest = min(gpu_free, max(offering.counts)) if room(self.notebook_requests, node, used) >= 1 else 0
        return capacity, capacity - gpu_free, free, largest


def node_serves(offering: Offering, node: NodeFacts, notebook: Notebook = NO_NOTEBOOK) -> bool:
    """Could the scheduler place ``offering``'s pod on ``node`` if it were empty?"""
    return Tally(offering, notebook).reaches(node)


def summarise(rows: Iterable[tuple[str, Row]]) -> Availability:
    """Fold (node, row) pairs of the nodes that serve one offering."""
    capacity = allocated = free = largest = 0
    names = []
    for name, (cap, alloc, fr, big) in rows:
        capacity += cap
        allocated += alloc
        free += fr
        largest = max(largest, big)
        names.append(name)
    return Availability(capacity=capacity, allocated=allocated, free=free, largest_free=largest, nodes=tuple(sorted(names)))


def availability(
    offering: Offering,
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    notebook: Notebook = NO_NOTEBOOK,
) -> Availability:
    """One offering's availability over a snapshot of the cluster (the CLI and tests use it)."""
    if not offering.resources:
        return UNCOUNTED
    used = used_by_node(pods)
    counter = Tally(offering, notebook)
    rows = []
    for raw in nodes:
        facts = NodeFacts.from_node(raw)
        row = counter.row(facts, used.get(facts.name, {}))
        if row is not None:
            rows.append((facts.name, row))
    return summarise(rows)


def unreached(
    nodes: Iterable[Mapping[str, Any]],
    offerings: Iterable[Offering],
    notebook: Notebook = NO_NOTEBOOK,
    class_labels: Iterable[str] = (),
) -> list[tuple[str, str, int, str]]:
    """GPU resources no offering's pod can land on, and why: (node, resource, units, reason).

    Every GPU a node advertises belongs to exactly one offering or shows up here: cordoned,
    a VM host, MIG mid-reconfiguration, a taint none tolerates, a resource no offering asks for.
    """
    from gpuspawner.core.nodeclass import unserved_reason

    labels = tuple(class_labels)
    tallies = [Tally(o, notebook) for o in offerings if o.resources]
    out = []
    for raw in nodes:
        facts = NodeFacts.from_node(raw)
        for resource, amount in sorted(facts.allocatable.items()):
            if "/" not in resource or amount <= 0:
                continue
            asking = [t for t in tallies if resource in t.offering.resources]
            if any(t.reaches(facts) for t in asking):
                continue
            reason = unserved_reason(facts, resource, labels)
            if reason is None and asking:
                blocks = {b for t in asking if (b := blocked(t.pod, facts, t.tolerations)) is not None}
                reason = "; ".join(sorted(blocks)) or "no offering's pod fits"
            out.append((facts.name, resource, amount, reason or f"no offering asks for {resource}"))
    return out
