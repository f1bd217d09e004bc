"""Nodes -> offerings, from the labels GPU Feature Discovery and the clouds put on nodes.

Pure: takes node dicts (as ``kubectl get nodes -o json`` prints them, or as the
Kubernetes API returns them) and returns :class:`~gpuspawner.core.model.Offering`
objects. Which kind of GPU each node's resource is, and the node-affinity terms that
select exactly the nodes of that kind, is :mod:`gpuspawner.core.nodeclass`'s; here each class
gets its name, its slug and its tolerations, and the nodes of one slug fold into one
offering. The rules, all from the NVIDIA device plugin / GFD conventions:

* Only ``status.allocatable`` counts; ``status.capacity`` keeps stale keys after a
  MIG reconfiguration. A resource listed with value 0 is not an offering.
* MIG resources count only where ``nvidia.com/mig.config.state`` is not one of
  mig-manager's unsettled states (pending, rebooting, failed).
* Cordoned nodes and nodes that host VMs (``nvidia.com/gpu.workload.config=vm-*``)
  offer nothing to pods.
* A node without GPU labels (a plain device-plugin install, or labels not there yet)
  gets an offering of its own, named after its cloud accelerator label or instance type
  if it has one ("GPU (unlabelled nodes)" if not); it never joins a labelled one.
* ``nvidia.com/gpu.memory`` is MiB in today's GFD and bytes in old releases.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from gpuspawner.core.fit import NodeFacts
from gpuspawner.core.model import DEFAULT_GPU_TOLERATION, Offering
from gpuspawner.core.nodeclass import (
    GKE_MAX_CLIENTS_LABEL,
    GKE_SHARING_LABEL,
    INSTANCE_TYPE_LABEL,
    GpuClass,
    mig_profile_parts,
    mig_resource_name,
    node_classes,
)
from gpuspawner.core.products import gpu_memory_mib, product_name
from gpuspawner.core.wording import mig_compute_phrase, share_phrase
from gpuspawner.names.nvidia import GPU, MEMORY_LABEL, REPLICAS_LABEL, SHARING_LABEL
from gpuspawner.names.selectors import HARD_EFFECTS, Terms, all_of, and_terms, any_of, equals, factor, tolerates
from gpuspawner.names.vocabulary import Isolation, Kind

__all__ = [
    "DEFAULT_VGPU_CLASS_LABELS",
    "GPU_TAINT_KEYS",
    "aggregate",
    "discover",
    "gpu_tolerations",
    "memory_mib",
    "node_offerings",
    "product_name",
]

#: Taints that clouds and sites put on GPU nodes to keep other pods off; a discovered
#: offering tolerates the ones its nodes carry. Any other taint is the admin's to
#: tolerate (``offering_overrides`` -> ``extra_tolerations``).
GPU_TAINT_KEYS = frozenset({GPU, "node-role.kubernetes.io/gpu", "sku", "gpu", "nvidia.com/gpu.present"})

#: Site labels that name a vGPU node class (seed 001: ``vgpu.type=v100-8g-8GB``).
DEFAULT_VGPU_CLASS_LABELS = ("vgpu.type",)

_VGPU_PROFILE = re.compile(r"^(?P<gpu>.+?)-(?P<profile>\d+[ABCQ])$")


def memory_mib(value: str | None) -> int | None:
    """GFD's ``nvidia.com/gpu.memory``: MiB today, bytes in old releases."""
    try:
        number = int(value) if value is not None else None
    except ValueError:
        return None
    if number is None or number <= 0:
        return None
    return number // (1024 * 1024) if number > 1024 * 1024 * 4 else number  # > 4 TiB "MiB" is bytes


def _slug(*parts: str) -> str:
    text = "-".join(p for p in parts if p).lower().replace("+", "-plus-")
    text = re.sub(r"[^a-z0-9]+", "-", text).strip("-")
    return text[:63].rstrip("-")


def discover(nodes: Iterable[Mapping[str, Any]], vgpu_class_labels: Iterable[str] = DEFAULT_VGPU_CLASS_LABELS) -> list[Offering]:
    """All GPU offerings the given nodes can serve, one per distinct (kind, identity, slice).

    The order is stable: by kind (shared, MIG, whole, vGPU), then by memory.
    """
    class_labels = tuple(vgpu_class_labels)
    return aggregate(node_offerings(NodeFacts.from_node(node), class_labels) for node in nodes)


def _full_terms(offering: Offering) -> Terms:
    return and_terms(all_of(*(equals(k, v) for k, v in offering.node_selector.items())), offering.node_affinity)


def aggregate(per_node: Iterable[Iterable[tuple[Offering, int]]]) -> list[Offering]:
    """Fold the offerings of each node (with the units it has) into one ordered list.

    Nodes whose offerings share a slug are one offering: it selects the nodes of each
    (its terms are ORed; e.g. an L4 named by GFD's product label on one node and by
    GKE's accelerator label on another) and tolerates the GPU taints of each. A
    whole-GPU offering's counts are the powers of two up to the most GPUs one node has.
    """
    found: dict[str, Offering] = {}
    terms: dict[str, Terms] = {}
    max_units: dict[str, int] = {}
    for offers in per_node:
        for offering, units in offers:
            first = found.get(offering.slug)
            if first is not None and first.resources != offering.resources:
                # Never one offering for two resources (its pod can ask for only one of them).
                offering = replace(offering, slug=_slug(offering.slug, *offering.resources))
            first = found.setdefault(offering.slug, offering)
            if first is not offering:
                extra = tuple(t for t in offering.tolerations if t not in first.tolerations)
                if extra:  # nodes of one offering may carry different GPU taints: tolerate them all
                    found[offering.slug] = replace(first, tolerations=first.tolerations + extra)
                mine = _full_terms(offering)
                if mine != terms[offering.slug]:
                    terms[offering.slug] = any_of(terms[offering.slug], mine)
            else:
                terms[offering.slug] = _full_terms(offering)
            max_units[offering.slug] = max(max_units.get(offering.slug, 0), units)
    out = []
    for slug, offering in found.items():
        selector, affinity = factor(terms[slug])
        offering = replace(offering, node_selector=selector, node_affinity=affinity)
        if offering.kind is Kind.FULL:
            counts = tuple(c for c in (1, 2, 4, 8, 16) if c <= max_units[slug]) or (1,)
            offering = replace(offering, counts=counts)
        out.append(offering)
    order = [Kind.SHARED, Kind.MIG, Kind.FULL, Kind.VGPU]
    return sorted(out, key=lambda o: (order.index(o.kind), o.memory_mib or 0, o.slug))


def node_offerings(facts: NodeFacts, class_labels: tuple[str, ...] = DEFAULT_VGPU_CLASS_LABELS) -> list[tuple[Offering, int]]:
    """The offerings one node serves, each with the units of it the node has."""
    tolerations = gpu_tolerations(facts.taints)
    return [(_offering(cls, facts.labels, tolerations), units) for cls, units in node_classes(facts, class_labels)]


def gpu_tolerations(taints: Iterable[Mapping[str, Any]]) -> tuple[dict[str, Any], ...]:
    """The default ``nvidia.com/gpu`` toleration plus one for each GPU-node taint in ``taints``."""
    out: list[dict[str, Any]] = [dict(DEFAULT_GPU_TOLERATION)]
    for taint in taints:
        key = taint.get("key")
        if key in GPU_TAINT_KEYS and taint.get("effect") in HARD_EFFECTS and not tolerates(out, taint):
            # (also nvidia.com/gpu:NoExecute, which the default NoSchedule toleration does not cover)
            out.append({"key": key, "operator": "Equal", "value": taint.get("value", ""), "effect": taint["effect"]})
    return tuple(out)


def _identity_name(cls: GpuClass) -> tuple[str, str]:
    """(display name, slug part) of the GPU a class's nodes carry."""
    if cls.identity is None:
        return "GPU (unlabelled nodes)", "unlabelled"
    key, value = cls.identity
    if key == INSTANCE_TYPE_LABEL:
        return f"GPU on {value}", value
    return product_name(value), value


def _offering(cls: GpuClass, labels: Mapping[str, str], tolerations: tuple[dict[str, Any], ...]) -> Offering:
    selector, affinity = factor(cls.terms)
    common: dict[str, Any] = dict(
        resources={cls.resource: 1}, node_selector=selector, node_affinity=affinity, tolerations=tolerations, source="discovered"
    )
    if cls.kind is Kind.MIG:
        return _mig(cls, labels, common)
    if cls.kind is Kind.SHARED:
        return _shared(cls, labels, common)
    name, part = _identity_name(cls)
    product = cls.identity[1] if cls.identity else None
    if cls.kind is Kind.VGPU:  # a vGPU's memory is its profile's: only the node's label says it
        memory = memory_mib(labels.get(MEMORY_LABEL))
    else:
        memory = gpu_memory_mib(product, measured_mib=memory_mib(labels.get(MEMORY_LABEL)))
    if cls.kind is Kind.VGPU and cls.class_label is not None:
        key, value = cls.class_label
        return Offering(
            slug=_slug(Kind.VGPU, key, value),
            kind=Kind.VGPU,
            display_name=f"vGPU class {value}",
            description=f"Nodes of the site's vGPU class {key}={value}.",
            product=product,
            memory_mib=memory,
            compute_share="a vGPU slice of the physical GPU",
            isolation=Isolation.VM,
            **common,
        )
    if cls.kind is Kind.VGPU:
        match = _VGPU_PROFILE.match(product or "")
        display = f"{product_name(match.group('gpu'))} vGPU {match.group('profile')}" if match else f"{name} vGPU"
        return Offering(
            slug=_slug(Kind.VGPU, part),
            kind=Kind.VGPU,
            display_name=display,
            description=f"A virtual GPU of profile {product or 'unknown'} on a vGPU guest node.",
            product=product,
            memory_mib=memory,
            compute_share="a vGPU slice of the physical GPU",
            isolation=Isolation.VM,
            **common,
        )
    if cls.identity is None or cls.identity[0] == INSTANCE_TYPE_LABEL:
        description = (
            f"Whole GPUs on nodes that carry no GPU Feature Discovery labels ({name}). "
            "Their model and sharing settings are unknown to the hub."
        )
    else:
        description = f"Whole {name} GPUs, not shared with anyone."
    return Offering(
        slug=_slug("gpu", part),
        kind=Kind.FULL,
        display_name=name,
        description=description,
        product=product,
        memory_mib=memory,
        compute_share="all of its compute",
        isolation=Isolation.EXCLUSIVE,
        **common,
    )


def _mig(cls: GpuClass, labels: Mapping[str, str], common: dict[str, Any]) -> Offering:
    profile = cls.profile or ""
    parts = mig_profile_parts(profile)
    slices = parts[0] if parts else 0
    name, part = _identity_name(cls)
    product = cls.identity[1] if cls.identity else None
    # GFD labels a MIG device's memory under its resource: nvidia.com/mig-<profile>.memory (mixed),
    # nvidia.com/gpu.memory (single, where nvidia.com/gpu is the MIG device); GKE's nodes have no GFD.
    label = f"{cls.resource}.memory" if cls.flavour == "single" else f"{mig_resource_name(profile)}.memory"
    mem = gpu_memory_mib(product, profile, memory_mib(labels.get(label)))
    pool = labels.get("cloud.google.com/gke-nodepool") if cls.flavour == "gke" else None
    if cls.flavour == "single" and product:
        part = product.split("-MIG-", 1)[0]
        name = product_name(part)
    hint = {"gke": "gke", "single": "single"}.get(cls.flavour, "")
    return Offering(
        slug=_slug(Kind.MIG, hint, part if cls.identity else "gpu", profile),
        kind=Kind.MIG,
        display_name=f"{name} · MIG {profile}" + (f" ({pool})" if pool else ""),
        description=f"A MIG slice {profile} of {_a(name)}: its own memory and compute, isolated in hardware.",
        product=product,
        memory_mib=mem,
        compute_share=mig_compute_phrase(slices) if slices else "a MIG slice",
        isolation=Isolation.HARDWARE,
        **common,
    )


def _shared(cls: GpuClass, labels: Mapping[str, str], common: dict[str, Any]) -> Offering:
    gke_sharing = labels.get(GKE_SHARING_LABEL)
    strategy = labels.get(SHARING_LABEL) or ("mps" if gke_sharing == "mps" else "time-slicing")
    if strategy not in ("mps", "time-slicing"):
        strategy = "time-slicing"
    replicas = _int(labels.get(REPLICAS_LABEL)) or _int(labels.get(GKE_MAX_CLIENTS_LABEL)) or 0
    name, part = _identity_name(cls)
    product = cls.identity[1] if cls.identity else None
    if cls.profile:
        name = f"{name} MIG {cls.profile}"
    share = f"1/{replicas}" if replicas else "a share"
    how = "MPS share" if strategy == "mps" else "time-sliced"
    # (a share of a MIG slice: GFD's single strategy labels the slice's memory as nvidia.com/gpu.memory)
    total = gpu_memory_mib(product, cls.profile, memory_mib(labels.get(MEMORY_LABEL)))
    if strategy == "mps":
        memory = total // replicas if total and replicas else None  # MPS caps each client's memory
        description = f"{share} of {_a(name)} through MPS: a memory limit of your own, compute shared with others."
    else:
        memory = total  # time-slicing does not split memory: all of it is shared
        description = (
            f"{share} of {_a(name)} by time-slicing. Memory is not isolated: "
            "other users' notebooks share the same GPU memory, and one can starve the others."
        )
    slice_part = cls.profile if cls.profile and cls.profile.lower() not in part.lower() else ""
    part = part if cls.identity else "gpu"
    if cls.resource == GPU and not part.upper().endswith("-SHARED"):
        # A share requested as plain nvidia.com/gpu (GKE, labels mid-change) is the same thing as on
        # a "-SHARED" product node, and never the same as a renamed nvidia.com/gpu.shared share.
        part = f"{part}-SHARED"
    return Offering(
        slug=_slug(Kind.SHARED, part, slice_part, strategy, f"{replicas}x" if replicas else ""),
        kind=Kind.SHARED,
        display_name=f"{name} · {share} {how}",
        description=description,
        product=product,
        memory_mib=memory,
        compute_share=share_phrase(replicas, strategy) if replicas else f"a {how} share",
        isolation=Isolation.PARTIAL if strategy == "mps" else Isolation.NONE,
        replicas=replicas or None,
        sharing=strategy,
        **common,
    )


def _a(name: str) -> str:
    """ "an A100", "an H100", "an L4", "a Tesla T4": letters said with a vowel sound take "an"."""
    return f"{'an' if name[:1].upper() in 'AEFHILMNORSX' else 'a'} {name}"


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
