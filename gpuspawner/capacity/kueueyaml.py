"""Kueue objects for a hub's GPU offerings, as YAML to review and apply. Pure.

``gpuspawner kueue`` (docs/kueue.md) turns the hub's offerings into:

* one **ResourceFlavor** per distinct placement of the GPU offerings (node selector and
  tolerations): ``spec.nodeLabels`` is the offering's node selector, ``spec.tolerations`` its
  tolerations, so a T4 share and an A100 MIG slice are different flavors. Offerings that land
  on the same nodes the same way (the MIG profiles of one A100 model) share one flavor, named
  after the words their slugs share;
* one **ClusterQueue** skeleton: a quota per (flavor, extended resource), its nominal quota
  the offering's capacity now (0 where unknown), grouped as Kueue requires (below), plus a
  group of its own for ``cpu`` and ``memory``, which every notebook pod requests;
* a **LocalQueue** in the hub's namespace for every queue ``c.GPUSpawner.kueue_queues`` names.

Kueue's rules (v0.17.0, ``apis/kueue/v1beta2/clusterqueue_types.go`` and
``pkg/webhooks/clusterqueue_webhook.go``): a resource and a flavor belong to one resource
group each; every flavor of a group lists every covered resource, in the group's order; at
most 16 groups, 64 flavors and 64 resources a group, 256 flavors in all; at most 8 node
labels and 8 tolerations a flavor. So offerings whose flavors share a resource (every flavor
asking for ``nvidia.com/gpu``) form one group, each flavor listing the group's resources
with a quota of 0 for those its nodes do not have.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import yaml

from gpuspawner.core.model import Offering
from gpuspawner.core.quantity import QuantityError, parse_quantity
from gpuspawner.names.kueuenames import API_VERSION

#: The flavor of the cpu/memory group: no node labels, so it never narrows a pod's placement.
CPU_FLAVOR = "default-flavor"
MAX_GROUPS = 16
MAX_PER_GROUP = 64
MAX_FLAVORS = 256
MAX_LABELS = 8
MAX_TOLERATIONS = 8

UNCOVERED_NOTE = (
    "Kueue admits a pod only if its ClusterQueue covers every resource the pod requests: one it does not\n"
    "cover leaves the Workload pending, 'resource <name> unavailable in ClusterQueue'\n"
    "(pkg/scheduler/flavorassigner/flavorassigner.go), unless Kueue's configuration lists it under\n"
    "resources.excludeResourcePrefixes. A notebook pod requests cpu and memory, so they are covered here,\n"
    "in a group of their own whose flavor has no node labels; their quota defaults to the allocatable\n"
    "cpu and memory of the cluster's schedulable nodes now. Cover ephemeral-storage too if your pods request it."
)


@dataclass(frozen=True)
class Document:
    """One Kubernetes object and the comment written above it."""

    comment: str
    body: Mapping[str, Any]


@dataclass
class Flavor:
    """One placement: the offerings that land on the same nodes the same way, and their quotas."""

    node_labels: dict[str, str]
    tolerations: list[dict[str, Any]]
    slugs: list[str] = field(default_factory=list)
    #: resource -> units now (None: unknown)
    quotas: dict[str, int | None] = field(default_factory=dict)
    name: str = ""


def _placement(offering: Offering) -> tuple[Any, ...]:
    labels = tuple(sorted(offering.node_selector.items()))
    tolerations = tuple(sorted(tuple(sorted((k, str(v)) for k, v in t.items())) for t in offering.tolerations))
    return labels, tolerations


def _common_words(slugs: Sequence[str]) -> str:
    """The hyphen-separated words every slug starts with ("" if none)."""
    split = [s.split("-") for s in slugs]
    words: list[str] = []
    for column in zip(*split, strict=False):
        if len(set(column)) != 1:
            break
        words.append(column[0])
    return "-".join(words)


def _name_flavors(flavors: Sequence[Flavor], taken: set[str]) -> None:
    for flavor in flavors:
        base = flavor.slugs[0] if len(flavor.slugs) == 1 else (_common_words(flavor.slugs) or flavor.slugs[0])
        name, n = base, 2
        while name in taken:
            suffix = f"-{n}"
            name, n = base[: 63 - len(suffix)].rstrip("-") + suffix, n + 1
        taken.add(name)
        flavor.name = name


def _groups(flavors: Sequence[Flavor]) -> list[tuple[list[str], list[Flavor]]]:
    """Flavors sharing a resource, transitively, in one group: (covered resources, flavors), in first-seen order."""
    parent: dict[str, str] = {}

    def root(r: str) -> str:
        while parent[r] != r:
            parent[r] = parent[parent[r]]
            r = parent[r]
        return r

    order: list[str] = []
    for flavor in flavors:
        resources = list(flavor.quotas)
        for r in resources:
            if r not in parent:
                parent[r] = r
                order.append(r)
        for r in resources[1:]:
            parent[root(r)] = root(resources[0])
    groups: dict[str, tuple[list[str], list[Flavor]]] = {}
    for r in order:
        groups.setdefault(root(r), ([], []))[0].append(r)
    for flavor in flavors:
        groups[root(next(iter(flavor.quotas)))][1].append(flavor)
    return list(groups.values())


def _quantity(value: Fraction, binary: bool) -> str:
    """A Kubernetes quantity for ``value`` (cores or bytes), rounded down."""
    if binary:
        whole = int(value)
        for suffix, size in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
            if whole and whole % size == 0:
                return f"{whole // size}{suffix}"
        return str(whole)
    milli = int(value * 1000)
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def allocatable_totals(nodes: Iterable[Mapping[str, Any]]) -> tuple[str, str]:
    """The allocatable cpu and memory of the schedulable nodes, as Kubernetes quantities."""
    cpu, memory = Fraction(0), Fraction(0)
    for node in nodes:
        if (node.get("spec") or {}).get("unschedulable"):
            continue
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        try:
            cpu += parse_quantity(allocatable.get("cpu", 0))
            memory += parse_quantity(allocatable.get("memory", 0))
        except QuantityError:
            continue
    return _quantity(cpu, binary=False), _quantity(memory, binary=True)


def kueue_documents(
    offerings: Iterable[Offering],
    capacities: Mapping[str, int | None],
    *,
    cluster_queue: str,
    namespace: str,
    local_queues: Iterable[str],
    cpu_memory: tuple[str, str] = ("0", "0"),
    priority_classes: Iterable[str] = (),
) -> list[Document]:
    """The ResourceFlavors, the ClusterQueue and the LocalQueues for ``offerings``.

    ``capacities``: each offering's units now, by slug (None or absent: unknown, quota 0);
    ``cpu_memory``: the quota of the cpu/memory group; ``local_queues``: the LocalQueues the
    hub's mapping names. Raises ValueError where Kueue's limits cannot hold these offerings.
    """
    flavors: dict[tuple[Any, ...], Flavor] = {}
    skipped: list[str] = []
    for offering in offerings:
        if not offering.is_gpu:
            continue
        if offering.claim is not None:
            skipped.append(
                f"{offering.slug}: a DRA offering (ResourceClaim of class {offering.claim.device_class}) asks for no extended "
                "resource; Kueue counts DRA devices only through its own deviceClassMappings, not set up here"
            )
            continue
        if not offering.resources:
            skipped.append(f"{offering.slug}: asks for no extended resource, so there is nothing to give a quota to")
            continue
        key = _placement(offering)
        flavor = flavors.get(key)
        if flavor is None:
            flavor = flavors[key] = Flavor(dict(offering.node_selector), [dict(t) for t in offering.tolerations])
        flavor.slugs.append(offering.slug)
        capacity = capacities.get(offering.slug)
        for resource, per_unit in offering.resources.items():
            units = None if capacity is None else capacity * per_unit
            known = flavor.quotas.get(resource)
            flavor.quotas[resource] = units if known is None else max(known, units or 0)
    ordered = list(flavors.values())
    _name_flavors(ordered, {CPU_FLAVOR})
    for flavor in ordered:
        if len(flavor.node_labels) > MAX_LABELS or len(flavor.tolerations) > MAX_TOLERATIONS:
            raise ValueError(
                f"offering(s) {', '.join(flavor.slugs)}: a ResourceFlavor holds at most {MAX_LABELS} node labels and "
                f"{MAX_TOLERATIONS} tolerations; this placement has {len(flavor.node_labels)} and {len(flavor.tolerations)}"
            )
    groups = _groups(ordered)
    if len(groups) + 1 > MAX_GROUPS or len(ordered) + 1 > MAX_FLAVORS:
        raise ValueError(f"{len(groups) + 1} resource groups and {len(ordered) + 1} flavors: Kueue allows {MAX_GROUPS} and {MAX_FLAVORS}")
    for resources, members in groups:
        if len(resources) > MAX_PER_GROUP or len(members) > MAX_PER_GROUP:
            raise ValueError(
                f"a resource group of {len(resources)} resources and {len(members)} flavors: Kueue allows {MAX_PER_GROUP} of each"
            )

    documents = [
        Document(
            f"The cpu/memory flavor of ClusterQueue {cluster_queue}: no node labels, it matches every node.\n"
            "The GPU flavors below: one per placement of the GPU offerings, nodeLabels from the offering's node\n"
            "selector, tolerations as its pod has them. Node affinity (e.g. 'not a MIG node') has no place in a\n"
            "flavor: the pod keeps it, and Kueue reads it when it picks a flavor.",
            {"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": CPU_FLAVOR}, "spec": {}},
        )
    ]
    for flavor in ordered:
        spec: dict[str, Any] = {}
        if flavor.node_labels:
            spec["nodeLabels"] = dict(sorted(flavor.node_labels.items()))
        if flavor.tolerations:
            spec["tolerations"] = flavor.tolerations
        documents.append(
            Document(
                f"Offering(s) {', '.join(flavor.slugs)}: their node selector and tolerations.",
                {"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": flavor.name}, "spec": spec},
            )
        )

    resource_groups: list[dict[str, Any]] = [
        {
            "coveredResources": ["cpu", "memory"],
            "flavors": [
                {
                    "name": CPU_FLAVOR,
                    "resources": [{"name": "cpu", "nominalQuota": cpu_memory[0]}, {"name": "memory", "nominalQuota": cpu_memory[1]}],
                }
            ],
        }
    ]
    unknown: list[str] = []
    for resources, members in groups:
        entries = []
        for flavor in members:
            quotas = []
            for resource in resources:
                units = flavor.quotas.get(resource, 0)
                if units is None:
                    unknown.append(f"{flavor.name}/{resource}")
                quotas.append({"name": resource, "nominalQuota": str(units or 0)})
            entries.append({"name": flavor.name, "resources": quotas})
        resource_groups.append({"coveredResources": list(resources), "flavors": entries})
    comment = [
        f"ClusterQueue {cluster_queue}: a skeleton to review. nominalQuota is what the cluster has now",
        "(the offering's capacity, as `gpuspawner offerings` counts it); 0 where unknown"
        + (f": {', '.join(unknown)}." if unknown else "."),
        "Kueue's rules: a resource and a flavor belong to one resource group each, and every flavor of a",
        "group lists each covered resource in the group's order: a flavor's 0 is a resource its nodes lack.",
        *UNCOVERED_NOTE.splitlines(),
        f"namespaceSelector: the hub's namespace ({namespace}) only; {{}} admits every namespace.",
    ]
    comment += [f"Not quota'd: {line}" for line in skipped]
    classes = sorted(set(priority_classes))
    if classes:
        comment.append(f"c.GPUSpawner.kueue_priority_classes names WorkloadPriorityClasses to create: {', '.join(classes)}.")
    documents.append(
        Document(
            "\n".join(comment),
            {
                "apiVersion": API_VERSION,
                "kind": "ClusterQueue",
                "metadata": {"name": cluster_queue},
                "spec": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                    "queueingStrategy": "BestEffortFIFO",
                    "resourceGroups": resource_groups,
                },
            },
        )
    )
    for queue in sorted(set(local_queues)):
        documents.append(
            Document(
                f"LocalQueue {queue}: named in c.GPUSpawner.kueue_queues.",
                {
                    "apiVersion": API_VERSION,
                    "kind": "LocalQueue",
                    "metadata": {"name": queue, "namespace": namespace},
                    "spec": {"clusterQueue": cluster_queue},
                },
            )
        )
    return documents


def render(documents: Iterable[Document], header: str = "") -> str:
    """YAML text: each document after ``---`` and its comment."""
    parts = []
    if header:
        parts.append("".join(f"# {line}".rstrip() + "\n" for line in header.splitlines()))
    for doc in documents:
        comment = "".join(f"# {line}".rstrip() + "\n" for line in doc.comment.splitlines())
        parts.append("---\n" + comment + yaml.safe_dump(dict(doc.body), sort_keys=False, default_flow_style=False))
    return "".join(parts)
