"""Nodes + pods -> capacity, allocated and free per offering. Pure.

Counts from exactly the facts the scheduler uses: a node's ``status.allocatable``
(never ``capacity``), the requests of every non-terminal pod bound to it (all
namespaces, init containers as Kubernetes counts them), the taints the offering
tolerates and the labels it selects, and cordoned nodes excluded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from .discovery import NodeFacts
from .offerings import Offering, quantity

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
_HARD_EFFECTS = ("NoSchedule", "NoExecute")


@dataclass(frozen=True)
class Availability:
    """Units of one offering: how many exist, are taken and are free, and where."""

    capacity: int | None
    allocated: int | None
    free: int | None
    largest_free: int | None
    nodes: tuple[str, ...] = ()

    @property
    def counted(self) -> bool:
        return self.capacity is not None


UNCOUNTED = Availability(capacity=None, allocated=None, free=None, largest_free=None)


def tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """Kubernetes' toleration matching (v1 helper ``ToleratesTaint``)."""
    for tol in tolerations:
        effect = tol.get("effect") or ""
        if effect and effect != taint.get("effect"):
            continue
        key = tol.get("key") or ""
        operator = tol.get("operator") or "Equal"
        if not key:
            if operator == "Exists":
                return True
            continue
        if key != taint.get("key"):
            continue
        if operator == "Exists" or (tol.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def node_serves(offering: Offering, node: NodeFacts) -> bool:
    """Could the scheduler place this offering's pod on ``node`` if it were empty?"""
    if not node.hosts_pods:
        return False
    labels = node.labels
    if any(labels.get(k) != v for k, v in offering.node_selector.items()):
        return False
    if any(k in labels for k in offering.absent_labels):
        return False
    if any(node.allocatable.get(r, 0) <= 0 for r in offering.resources):
        return False
    return all(tolerates(offering.tolerations, t) for t in node.taints if t.get("effect") in _HARD_EFFECTS)


def units(offering: Offering, amounts: Mapping[str, int]) -> int:
    """Whole units of ``offering`` that ``amounts`` of each resource make."""
    return min((amounts.get(r, 0) // per for r, per in offering.resources.items()), default=0)


def _whole(value: Any) -> int:
    amount = quantity(value)
    return amount if amount is not None else 0


def _extended(resources: Mapping[str, Any] | None) -> dict[str, int]:
    out = {}
    requests = (resources or {}).get("requests") or {}
    limits = (resources or {}).get("limits") or {}
    for name in set(requests) | set(limits):
        if "/" in name:  # extended resources; requests default to limits
            out[name] = _whole(requests.get(name, limits.get(name)))
    return out


def pod_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """Effective extended-resource requests of a pod, as the scheduler computes them.

    max(sum of app containers + sidecars, each init container + the sidecars started
    before it) + pod overhead.
    """
    spec = pod.get("spec") or {}
    total: dict[str, int] = {}
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for init in spec.get("initContainers") or ():
        req = _extended(init.get("resources"))
        if init.get("restartPolicy") == "Always":
            for k, v in req.items():
                sidecars[k] = sidecars.get(k, 0) + v
            req = dict(sidecars)
        else:
            req = {k: req.get(k, 0) + sidecars.get(k, 0) for k in set(req) | set(sidecars)}
        for k, v in req.items():
            init_peak[k] = max(init_peak.get(k, 0), v)
    for container in spec.get("containers") or ():
        for k, v in _extended(container.get("resources")).items():
            total[k] = total.get(k, 0) + v
    for k, v in sidecars.items():
        total[k] = total.get(k, 0) + v
    for k, v in init_peak.items():
        total[k] = max(total.get(k, 0), v)
    for k, v in (spec.get("overhead") or {}).items():
        if "/" in k:
            total[k] = total.get(k, 0) + _whole(v)
    return {k: v for k, v in total.items() if v}


def holds_resources(pod: Mapping[str, Any]) -> bool:
    """Bound and not terminal: the scheduler counts its requests against the node."""
    spec = pod.get("spec") or {}
    phase = (pod.get("status") or {}).get("phase")
    return bool(spec.get("nodeName")) and phase not in TERMINAL_PHASES


def used_by_node(pods: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """node name -> extended resource -> amount requested by the pods bound there."""
    used: dict[str, dict[str, int]] = {}
    for pod in pods:
        if not holds_resources(pod):
            continue
        node = pod["spec"]["nodeName"]
        bucket = used.setdefault(node, {})
        for k, v in pod_requests(pod).items():
            bucket[k] = bucket.get(k, 0) + v
    return used


def node_availability(offering: Offering, node: NodeFacts, used: Mapping[str, int]) -> tuple[int, int]:
    """(capacity units, free units) of ``offering`` on one node it serves."""
    capacity = units(offering, node.allocatable)
    free = units(offering, {r: node.allocatable.get(r, 0) - used.get(r, 0) for r in offering.resources})
    return capacity, max(free, 0)


def summarise(offering: Offering, per_node: Iterable[tuple[str, int, int]]) -> Availability:
    """Fold (node, capacity, free) rows of the nodes that serve ``offering``."""
    capacity = free = largest = 0
    names = []
    for name, cap, fr in per_node:
        capacity += cap
        free += fr
        largest = max(largest, fr)
        names.append(name)
    return Availability(capacity=capacity, allocated=capacity - free, free=free, largest_free=largest, nodes=tuple(sorted(names)))


def availability(offering: Offering, nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]) -> Availability:
    """One offering's availability over a snapshot of the cluster (the CLI and tests use it)."""
    if not offering.resources:
        return UNCOUNTED
    used = used_by_node(pods)
    rows = []
    for raw in nodes:
        facts = NodeFacts.from_node(raw)
        if node_serves(offering, facts):
            rows.append((facts.name, *node_availability(offering, facts, used.get(facts.name, {}))))
    return summarise(offering, rows)
