"""Would this pod spec fit this node? The scheduler's filters, once, as plain data. Pure.

kube-scheduler places a pod on a node only if every filter passes. For a notebook pod
the ones that can fail are:

* NodeUnschedulable: a cordoned node takes only pods that tolerate
  ``node.kubernetes.io/unschedulable:NoSchedule``;
* NodeAffinity: ``nodeSelector`` and the required node-affinity terms;
* TaintToleration: every NoSchedule/NoExecute taint tolerated (with the not-ready and
  unreachable NoExecute tolerations the API server adds to every pod);
* NodeResourcesFit: one more pod within ``allocatable.pods``, and every resource the pod
  requests (cpu, memory, GPUs ...) within allocatable minus what the node's pods request.

Node conditions play no part: the scheduler reads a NotReady node only through its taints.
Capacity counts exactly the nodes these filters pass, with the offering's own pod spec.

Amounts are whole numbers in the scheduler's units: cpu in millicores, memory and
storage in bytes, the rest in units; ``pods`` is counted as a resource every pod takes 1 of.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from gpuspawner.core.quantity import QuantityError, parse_quantity
from gpuspawner.names.selectors import (
    UNSCHEDULABLE_TAINT,
    Terms,
    describe_taint,
    terms_match,
    tolerates,
    untolerated_taint,
    with_default_tolerations,
)

PODS = "pods"
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
_NATIVE = frozenset({"cpu", "memory", PODS, "ephemeral-storage"})
_POD_LEVEL = frozenset({"cpu", "memory"})


def counted_resource(name: str) -> bool:
    """A resource the scheduler's NodeResourcesFit weighs (native, extended, hugepages)."""
    return name in _NATIVE or "/" in name or name.startswith("hugepages-")


def amount(resource: str, value: Any) -> int | None:
    """A quantity in the scheduler's units, rounded up as ``Quantity.Value()``/``MilliValue()`` do.

    ``amount("cpu", "500m") == 500``; ``amount("memory", "1Gi") == 1073741824``. None if malformed.
    """
    if isinstance(value, str):
        # A cluster's pods spell few distinct quantities ("250m", "1Gi"): each is parsed once
        # (the inventory reads every pod event's requests; parsing was most of its cost).
        return _string_amount(resource == "cpu", value)
    return _amount(resource == "cpu", value)


@lru_cache(maxsize=4096)
def _string_amount(milli: bool, value: str) -> int | None:
    return _amount(milli, value)


def _amount(milli: bool, value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        number = parse_quantity(value)
    except QuantityError:
        return None
    if milli:
        number *= 1000
    return int(math.ceil(number))


def amounts(resources: Mapping[str, Any] | None) -> dict[str, int]:
    """A ResourceList -> the counted resources in scheduler units (malformed entries dropped)."""
    out = {}
    for name, value in (resources or {}).items():
        if counted_resource(name):
            number = amount(name, value)
            if number is not None:
                out[name] = number
    return out


@dataclass(frozen=True)
class NodeFacts:
    """What the scheduler (and discovery) reads of one node."""

    name: str
    labels: Mapping[str, str]
    allocatable: Mapping[str, int]
    taints: tuple[Mapping[str, Any], ...]
    unschedulable: bool

    @classmethod
    def from_node(cls, node: Mapping[str, Any]) -> NodeFacts:
        meta = node.get("metadata") or {}
        spec = node.get("spec") or {}
        status = node.get("status") or {}
        return cls(
            name=str(meta.get("name", "")),
            labels=dict(meta.get("labels") or {}),
            allocatable=amounts(status.get("allocatable")),
            taints=tuple(dict(t) for t in spec.get("taints") or ()),
            unschedulable=bool(spec.get("unschedulable")),
        )


# ------------------------------------------------------------------------- pod requests


def _container_requests(container: Mapping[str, Any]) -> dict[str, int]:
    resources = container.get("resources") or {}
    requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
    # The API server defaults a missing request to the limit, resource by resource.
    return amounts({**limits, **requests})


def _add(into: dict[str, int], more: Mapping[str, int]) -> None:
    for k, v in more.items():
        into[k] = into.get(k, 0) + v


def pod_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """A pod's effective requests, as the scheduler computes them (``resourcehelper.PodRequests``).

    max(sum of app containers + sidecars, each init container + the sidecars started before
    it); pod-level cpu/memory requests replace the containers' sum; plus pod overhead; plus
    ``pods: 1``. Zero amounts are dropped.
    """
    spec = pod.get("spec") or {}
    total: dict[str, int] = {}
    for container in spec.get("containers") or ():
        _add(total, _container_requests(container))
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for init in spec.get("initContainers") or ():
        req = _container_requests(init)
        if init.get("restartPolicy") == "Always":
            _add(total, req)
            _add(sidecars, req)
            req = dict(sidecars)
        else:
            req = {k: req.get(k, 0) + sidecars.get(k, 0) for k in set(req) | set(sidecars)}
        for k, v in req.items():
            init_peak[k] = max(init_peak.get(k, 0), v)
    for k, v in init_peak.items():
        total[k] = max(total.get(k, 0), v)
    pod_level = spec.get("resources") or {}
    level = amounts({**(pod_level.get("limits") or {}), **(pod_level.get("requests") or {})})
    for k, v in level.items():
        if k in _POD_LEVEL or k.startswith("hugepages-"):
            total[k] = v
    _add(total, amounts(spec.get("overhead")))
    total[PODS] = 1
    return {k: v for k, v in total.items() if v}


def holds_resources(pod: Mapping[str, Any]) -> bool:
    """Bound and not terminal: the scheduler counts it against its node."""
    spec = pod.get("spec") or {}
    phase = (pod.get("status") or {}).get("phase")
    return bool(spec.get("nodeName")) and phase not in TERMINAL_PHASES


def used_by_node(pods: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """node name -> resource -> amount the pods bound there request (``pods``: how many there are)."""
    used: dict[str, dict[str, int]] = {}
    for pod in pods:
        if holds_resources(pod):
            _add(used.setdefault(pod["spec"]["nodeName"], {}), pod_requests(pod))
    return used


# ------------------------------------------------------------------------------- the pod


@dataclass(frozen=True)
class PodSpec:
    """What the scheduler's filters read of one pod: requests, node selection, tolerations.

    ``tolerations`` are as written; the API server's default ones are added when matching.
    ``requests`` includes ``pods: 1``.
    """

    requests: Mapping[str, int] = field(default_factory=lambda: {PODS: 1})
    node_selector: Mapping[str, str] = field(default_factory=dict)
    terms: Terms = ()
    tolerations: tuple[Mapping[str, Any], ...] = ()

    def admitted_tolerations(self) -> tuple[Mapping[str, Any], ...]:
        return with_default_tolerations(self.tolerations)


def blocked(spec: PodSpec, node: NodeFacts, tolerations: tuple[Mapping[str, Any], ...] | None = None) -> str | None:
    """Why the pod can never land on the node whatever runs there (None: the placement filters pass).

    NodeUnschedulable, NodeAffinity, TaintToleration. Pass ``tolerations`` (from
    :meth:`PodSpec.admitted_tolerations`) to save recomputing them per node.
    """
    tols = spec.admitted_tolerations() if tolerations is None else tolerations
    if node.unschedulable and not tolerates(tols, UNSCHEDULABLE_TAINT):
        return "cordoned"
    labels = node.labels
    for key, value in spec.node_selector.items():
        if labels.get(key) != value:
            return f"node selector {key}={value} does not match"
    if not terms_match(spec.terms, labels, node.name):
        return "node affinity does not match"
    taint = untolerated_taint(tols, node.taints)
    if taint is not None:
        return f"taint {describe_taint(taint)} not tolerated"
    return None


def room(requests: Mapping[str, int], node: NodeFacts, used: Mapping[str, int]) -> int:
    """How many more pods with ``requests`` NodeResourcesFit lets onto the node, one after another.

    Only what the pod requests is checked (a node overcommitted on cpu still takes a pod
    that requests no cpu); a resource the node lacks gives 0. Every pod takes one of ``pods``.
    """
    best: int | None = None
    for name, want in {PODS: 1, **requests}.items():
        if want <= 0:
            continue
        left = node.allocatable.get(name, 0) - used.get(name, 0)
        fits = left // want if left > 0 else 0
        best = fits if best is None else min(best, fits)
        if best == 0:
            return 0
    return best or 0
