"""What kind of GPU a node's resource is, and node-affinity terms that select exactly that kind. Pure.

The NVIDIA device plugin advertises several kinds of GPU under one resource name:
``nvidia.com/gpu`` is a whole GPU, a time-sliced or MPS share (``renameByDefault: false``),
a MIG slice (``single`` strategy, and every MIG partition on GKE), or a vGPU. Only the
node's labels tell them apart, and a node may carry some of them, all of them or none
(a plain device-plugin install; GPU Feature Discovery not yet run; labels mid-change).

The rules, first match wins, for ``nvidia.com/gpu`` on a node:

1. shared: product ends ``-SHARED``, ``nvidia.com/gpu.sharing-strategy`` is
   ``time-slicing`` or ``mps``, GKE's sharing label is set, or ``nvidia.com/gpu.replicas``
   is set to anything but ``1``;
2. MIG on GKE: ``cloud.google.com/gke-gpu-partition-size`` is set;
3. MIG, single strategy: the product contains ``-MIG-``;
4. vGPU guest: ``nvidia.com/vgpu.present=true``;
5. a site's vGPU class: one of the configured class labels is set;
6. otherwise a whole GPU.

Each class comes with :class:`~gpuspawner.names.selectors.Terms` that hold on a node exactly
when the rules give that node the same class *and the same identity* (the labels its
name comes from): the identity labels are pinned (to their value, or absent where they
are absent) and the labels of every earlier rule are excluded. So two classes' pods can
never land on the same node's resource, and a node no label describes (no product, no
cloud accelerator label) gets a class of its own instead of joining every other.
``nvidia.com/gpu.shared`` is always a share, ``nvidia.com/mig-*`` always a MIG slice.

Nodes that host VMs (``nvidia.com/gpu.workload.config=vm-passthrough|vm-vgpu``) are never
selected, nor, for MIG, nodes whose ``nvidia.com/mig.config.state`` says mig-manager is
reconfiguring them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpuspawner.core.fit import NodeFacts
from gpuspawner.names.nvidia import (
    GPU,
    GPU_SHARED,
    MIG_PREFIX,
    MIG_STATE_LABEL,
    PRODUCT_LABEL,
    REPLICAS_LABEL,
    SHARING_LABEL,
    VGPU_PRESENT_LABEL,
    WORKLOAD_LABEL,
)
from gpuspawner.names.selectors import (
    NOT_IN,
    Req,
    Terms,
    absent,
    all_of,
    and_terms,
    any_of,
    equals,
    pinned,
)
from gpuspawner.names.vocabulary import Kind

GKE_ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"
GKE_PARTITION_LABEL = "cloud.google.com/gke-gpu-partition-size"
GKE_SHARING_LABEL = "cloud.google.com/gke-gpu-sharing-strategy"
GKE_MAX_CLIENTS_LABEL = "cloud.google.com/gke-max-shared-clients-per-gpu"
EKS_ACCELERATOR_LABEL = "k8s.amazonaws.com/accelerator"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"

#: Where a node's GPU gets its name, in order: GFD's product, then the clouds' accelerator
#: labels, then the instance type (AKS and plain device-plugin installs have only that).
IDENTITY_LABELS = (PRODUCT_LABEL, GKE_ACCELERATOR_LABEL, EKS_ACCELERATOR_LABEL, INSTANCE_TYPE_LABEL)
SHARING_STRATEGIES = ("time-slicing", "mps")
VM_WORKLOADS = ("vm-passthrough", "vm-vgpu")
#: mig-manager's states while a node is not (yet) in its configured MIG layout.
MIG_UNSETTLED = ("pending", "rebooting", "failed")

NOT_VM = Req(WORKLOAD_LABEL, NOT_IN, VM_WORKLOADS)
MIG_SETTLED = Req(MIG_STATE_LABEL, NOT_IN, MIG_UNSETTLED)
#: Not a share by rule 1 (the product's ``-SHARED`` suffix is excluded by pinning the product).
NOT_SHARED: Terms = and_terms(
    all_of(Req(SHARING_LABEL, NOT_IN, SHARING_STRATEGIES), absent(GKE_SHARING_LABEL)),
    any_of(all_of(absent(REPLICAS_LABEL)), all_of(equals(REPLICAS_LABEL, "1"))),
)


@dataclass(frozen=True)
class GpuClass:
    """One kind of GPU resource on a class of nodes, and the terms that select that class."""

    kind: Kind  # FULL, SHARED, MIG or VGPU
    resource: str
    terms: Terms
    identity: tuple[str, str] | None  # (label, value) the name comes from; None: unlabelled
    profile: str | None = None  # MIG profile (of a MIG slice, or of the slice a share shares)
    flavour: str = ""  # MIG: "mixed", "single", "gke"; vGPU: "guest", "class"
    class_label: tuple[str, str] | None = None  # a site's vGPU class (label, value)


def hosts_pods(node: NodeFacts) -> bool:
    """Not cordoned and not a VM host: discovery reads offerings from this node."""
    return not node.unschedulable and node.labels.get(WORKLOAD_LABEL) not in VM_WORKLOADS


def mig_settled(labels: Mapping[str, str]) -> bool:
    return labels.get(MIG_STATE_LABEL) not in MIG_UNSETTLED


def identity(labels: Mapping[str, str]) -> tuple[str, str] | None:
    for key in IDENTITY_LABELS:
        if labels.get(key):
            return key, labels[key]
    return None


def identity_terms(labels: Mapping[str, str]) -> Terms:
    """Pin the identity label; every identity label before it must be absent (or all, if none is set)."""
    reqs: list[Req] = []
    for key in IDENTITY_LABELS:
        if labels.get(key):
            reqs.append(equals(key, labels[key]))
            break
        reqs.append(absent(key))
    return all_of(*reqs)


def is_shared(labels: Mapping[str, str]) -> bool:
    """Rule 1: a time-sliced or MPS share of a GPU."""
    product = labels.get(PRODUCT_LABEL) or ""
    return (
        product.endswith("-SHARED")
        or labels.get(SHARING_LABEL) in SHARING_STRATEGIES
        or GKE_SHARING_LABEL in labels
        or (REPLICAS_LABEL in labels and labels[REPLICAS_LABEL] != "1")
    )


def mig_profile_of(resource: str) -> str | None:
    """``nvidia.com/mig-1g.10gb.me`` -> ``1g.10gb+me`` (the device plugin writes ``+`` as ``.``)."""
    if not resource.startswith(MIG_PREFIX) or resource.endswith((".count", ".memory")):
        return None
    profile = resource[len(MIG_PREFIX) :]
    if profile.endswith(".me"):
        profile = profile[: -len(".me")] + "+me"
    return profile


def mig_resource_name(profile: str) -> str:
    """``3g.20gb`` -> ``nvidia.com/mig-3g.20gb``; ``1g.10gb+me`` -> ``nvidia.com/mig-1g.10gb.me``.

    The device plugin turns ``+`` into ``.`` in resource names; ``-me`` stays.
    The inverse, for the profile's display form, is :func:`mig_profile_of`.
    """
    return f"{MIG_PREFIX}{profile.replace('+', '.')}"


def mig_profile_parts(profile: str) -> tuple[int, int] | None:
    """``3g.20gb`` -> (3 compute slices, 20 GB); None if it is not a MIG profile."""
    match = re.match(r"^(?:\d+c\.)?(\d+)g\.(\d+)gb(?:[+-]me(?:\.all)?|\+gfx)?$", profile)
    if not match:
        return None
    return int(match.group(1)), int(match.group(2))


def classify(node: NodeFacts, resource: str, class_labels: tuple[str, ...] = ()) -> GpuClass | None:
    """The class of ``resource`` on ``node``, or None where discovery offers nothing of it.

    None for a resource that is no GPU kind discovery knows (``nvidia.com/vgpu``, HAMi's
    ``nvidia.com/gpumem``: describe those as custom offerings) and for MIG mid-reconfiguration.
    Whether the node takes pods at all is :func:`hosts_pods`'s call.
    """
    labels = node.labels
    ident = identity(labels)
    pins = identity_terms(labels)
    profile = mig_profile_of(resource)
    if profile is not None:
        if not mig_settled(labels):
            return None
        return GpuClass(Kind.MIG, resource, and_terms(pins, all_of(MIG_SETTLED, NOT_VM)), ident, profile, "mixed")
    if resource == GPU_SHARED:
        return GpuClass(Kind.SHARED, resource, and_terms(pins, _share_pins(labels)), ident, _shared_slice(labels))
    if resource != GPU:
        return None
    if is_shared(labels):
        terms = and_terms(pins, _share_pins(labels), all_of(pinned(GKE_PARTITION_LABEL, labels)))
        return GpuClass(Kind.SHARED, resource, terms, ident, _shared_slice(labels))
    not_shared = and_terms(NOT_SHARED, all_of(NOT_VM))
    partition = labels.get(GKE_PARTITION_LABEL)
    if partition:
        if not mig_settled(labels):
            return None
        terms = and_terms(not_shared, pins, all_of(equals(GKE_PARTITION_LABEL, partition), MIG_SETTLED))
        return GpuClass(Kind.MIG, resource, terms, ident, partition, "gke")
    plain = and_terms(not_shared, all_of(absent(GKE_PARTITION_LABEL)), pins)
    product = labels.get(PRODUCT_LABEL) or ""
    if "-MIG-" in product:
        if not mig_settled(labels):
            return None
        profile = product.split("-MIG-", 1)[1]
        return GpuClass(Kind.MIG, resource, and_terms(plain, all_of(MIG_SETTLED)), ident, profile, "single")
    if labels.get(VGPU_PRESENT_LABEL) == "true":
        return GpuClass(Kind.VGPU, resource, and_terms(plain, all_of(equals(VGPU_PRESENT_LABEL, "true"))), ident, flavour="guest")
    not_guest = and_terms(plain, all_of(Req(VGPU_PRESENT_LABEL, NOT_IN, ("true",))))
    for i, key in enumerate(class_labels):
        if labels.get(key):
            earlier = [absent(k) for k in class_labels[:i]]
            terms = and_terms(not_guest, all_of(*earlier, equals(key, labels[key])))
            return GpuClass(Kind.VGPU, resource, terms, ident, flavour="class", class_label=(key, labels[key]))
    return GpuClass(Kind.FULL, resource, and_terms(not_guest, all_of(*(absent(k) for k in class_labels))), ident)


def _shared_slice(labels: Mapping[str, str]) -> str | None:
    """The MIG profile a share is a share of (time-slicing on MIG), if any."""
    product = labels.get(PRODUCT_LABEL) or ""
    if "-MIG-" in product:
        return product.split("-MIG-", 1)[1].removesuffix("-SHARED")
    return labels.get(GKE_PARTITION_LABEL)


def whole_gpu_terms(class_labels: Iterable[str] = ()) -> Terms:
    """Rule 6 without an identity: any whole GPU (what a configured ``kind: full`` offering selects)."""
    return and_terms(
        NOT_SHARED,
        all_of(NOT_VM, absent(GKE_PARTITION_LABEL), Req(VGPU_PRESENT_LABEL, NOT_IN, ("true",)), *(absent(k) for k in class_labels)),
    )


def _share_pins(labels: Mapping[str, str]) -> Terms:
    """A 1/8 share must not land on a 1/4 node, nor a time-sliced one on an MPS node."""
    keys = (REPLICAS_LABEL, SHARING_LABEL, GKE_SHARING_LABEL, GKE_MAX_CLIENTS_LABEL)
    return all_of(*(pinned(k, labels) for k in keys), NOT_VM)


def node_classes(node: NodeFacts, class_labels: Iterable[str] = ()) -> list[tuple[GpuClass, int]]:
    """Every GPU class the node serves, with the units of it the node advertises."""
    if not hosts_pods(node):
        return []
    labels = tuple(class_labels)
    out = []
    for resource, units in node.allocatable.items():
        if units > 0 and "/" in resource:
            found = classify(node, resource, labels)
            if found is not None:
                out.append((found, units))
    return out


def unserved_reason(node: NodeFacts, resource: str, class_labels: Iterable[str] = ()) -> str | None:
    """Why discovery offers nothing of ``resource`` on ``node`` (None: it does)."""
    if node.unschedulable:
        return "the node is cordoned"
    workload = node.labels.get(WORKLOAD_LABEL)
    if workload in VM_WORKLOADS:
        return f"the node hosts VMs ({WORKLOAD_LABEL}={workload})"
    if node.allocatable.get(resource, 0) <= 0:
        return f"the node advertises no {resource}"
    if classify(node, resource, tuple(class_labels)) is None:
        if resource == GPU or mig_profile_of(resource) is not None:
            return f"MIG is being reconfigured ({MIG_STATE_LABEL}={node.labels.get(MIG_STATE_LABEL)})"
        return f"{resource} is no GPU kind discovery knows: describe it as a custom offering"
    return None
