"""Nodes -> offerings, from the labels GPU Feature Discovery and the clouds put on nodes.

Pure: takes node dicts (as ``kubectl get nodes -o json`` prints them, or as the
Kubernetes API returns them) and returns :class:`~gpuspawner.offerings.Offering`
objects. The rules, all from the NVIDIA device plugin / GFD conventions:

* Only ``status.allocatable`` counts; ``status.capacity`` keeps stale keys after a
  MIG reconfiguration. A resource listed with value 0 is not an offering.
* MIG resources count only where ``nvidia.com/mig.config.state`` is absent or
  ``success`` (mig-manager is reconfiguring otherwise).
* Cordoned nodes and nodes that host VMs (``nvidia.com/gpu.workload.config=vm-*``)
  offer nothing to pods.
* ``nvidia.com/gpu.memory`` is MiB in today's GFD and bytes in old releases.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping

from .offerings import (
    GKE_ACCELERATOR_LABEL,
    GKE_PARTITION_LABEL,
    GPU,
    GPU_SHARED,
    PRODUCT_LABEL,
    VGPU_PRESENT_LABEL,
    Isolation,
    Kind,
    Offering,
    DEFAULT_GPU_TOLERATION,
    mig_profile_from_resource,
    mig_profile_parts,
    mig_resource_name,
    quantity,
    share_phrase,
)

MIG_STATE_LABEL = "nvidia.com/mig.config.state"
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
WORKLOAD_LABEL = "nvidia.com/gpu.workload.config"
REPLICAS_LABEL = "nvidia.com/gpu.replicas"
SHARING_LABEL = "nvidia.com/gpu.sharing-strategy"
MEMORY_LABEL = "nvidia.com/gpu.memory"
GKE_SHARING_LABEL = "cloud.google.com/gke-gpu-sharing-strategy"
GKE_MAX_CLIENTS_LABEL = "cloud.google.com/gke-max-shared-clients-per-gpu"

#: Taints that clouds and sites put on GPU nodes to keep other pods off; a discovered
#: offering tolerates the ones its nodes carry. Any other taint is the admin's to
#: tolerate (``offering_overrides`` -> ``extra_tolerations``).
GPU_TAINT_KEYS = frozenset({GPU, "node-role.kubernetes.io/gpu", "sku", "gpu", "nvidia.com/gpu.present"})

#: Site labels that name a vGPU node class (seed 001: ``vgpu.type=v100-8g-8GB``).
DEFAULT_VGPU_CLASS_LABELS = ("vgpu.type",)

_VGPU_PROFILE = re.compile(r"^(?P<gpu>.+?)-(?P<profile>\d+[ABCQ])$")
_FORM_FACTORS = {"SXM", "SXM2", "SXM4", "SXM5", "PCIE", "HBM2", "HBM2E", "HBM3", "HBM3E", "NVL", "GRID"}
_GKE_ACCELERATORS = {
    "nvidia-tesla-a100": "A100 40GB",
    "nvidia-a100-80gb": "A100 80GB",
    "nvidia-h100-80gb": "H100 80GB",
    "nvidia-h100-mega-80gb": "H100 Mega 80GB",
    "nvidia-tesla-t4": "Tesla T4",
    "nvidia-l4": "L4",
}


@dataclass(frozen=True)
class NodeFacts:
    """What discovery needs of one node, read once."""

    name: str
    labels: Mapping[str, str]
    allocatable: Mapping[str, int]
    taints: tuple[Mapping[str, Any], ...]
    unschedulable: bool

    @classmethod
    def from_node(cls, node: Mapping[str, Any]) -> "NodeFacts":
        meta = node.get("metadata") or {}
        spec = node.get("spec") or {}
        status = node.get("status") or {}
        allocatable = {}
        for name, qty in (status.get("allocatable") or {}).items():
            if "/" in name:  # extended resources are whole numbers; cpu/memory are not ours
                amount = quantity(qty)
                if amount is not None:
                    allocatable[name] = amount
        return cls(
            name=str(meta.get("name", "")),
            labels=dict(meta.get("labels") or {}),
            allocatable=allocatable,
            taints=tuple(spec.get("taints") or ()),
            unschedulable=bool(spec.get("unschedulable")),
        )

    @property
    def hosts_pods(self) -> bool:
        return not self.unschedulable and not self.labels.get(WORKLOAD_LABEL, "").startswith("vm-")

    @property
    def mig_ready(self) -> bool:
        return self.labels.get(MIG_STATE_LABEL, "success") == "success"


def memory_mib(value: str | None) -> int | None:
    """GFD's ``nvidia.com/gpu.memory``: MiB today, bytes in old releases."""
    try:
        number = int(value) if value is not None else None
    except ValueError:
        return None
    if number is None or number <= 0:
        return None
    return number // (1024 * 1024) if number > 1024 * 1024 * 4 else number  # > 4 TiB "MiB" is bytes


def product_name(product: str) -> str:
    """``NVIDIA-A100-SXM4-40GB`` -> ``A100 40GB``; ``Tesla-T4-SHARED`` -> ``Tesla T4``."""
    if product in _GKE_ACCELERATORS:
        return _GKE_ACCELERATORS[product]
    words = product.replace("_", "-").split("-")
    if words and words[0].upper() == "NVIDIA":
        words = words[1:]
    if "MIG" in words:
        words = words[: words.index("MIG")]
    kept = [w for w in words if w.upper() not in _FORM_FACTORS and w.upper() != "SHARED"]
    return " ".join(kept) or product


def _slug(*parts: str) -> str:
    text = "-".join(parts).lower().replace("+", "-plus-")
    text = re.sub(r"[^a-z0-9]+", "-", text).strip("-")
    return text[:63].rstrip("-")


def discover(nodes: Iterable[Mapping[str, Any]], vgpu_class_labels: Iterable[str] = DEFAULT_VGPU_CLASS_LABELS) -> list[Offering]:
    """All GPU offerings the given nodes can serve, one per distinct (kind, product, slice).

    The order is stable: by kind (shared, MIG, whole, vGPU), then by memory.
    """
    class_labels = tuple(vgpu_class_labels)
    return aggregate(node_offerings(NodeFacts.from_node(node), class_labels) for node in nodes)


def aggregate(per_node: Iterable[Iterable[tuple[Offering, int]]]) -> list[Offering]:
    """Fold the offerings of each node (with the units it has) into one ordered list.

    A whole-GPU offering's counts are the powers of two up to the most GPUs one node has.
    """
    found: dict[str, Offering] = {}
    max_units: dict[str, int] = {}
    for offers in per_node:
        for offering, units in offers:
            first = found.setdefault(offering.slug, offering)
            if first is not offering and offering.tolerations != first.tolerations:
                # Nodes of one offering may carry different GPU taints: tolerate them all.
                extra = tuple(t for t in offering.tolerations if t not in first.tolerations)
                found[offering.slug] = replace(first, tolerations=first.tolerations + extra)
            max_units[offering.slug] = max(max_units.get(offering.slug, 0), units)
    out = []
    for slug, offering in found.items():
        if offering.kind is Kind.FULL:
            counts = tuple(c for c in (1, 2, 4, 8, 16) if c <= max_units[slug]) or (1,)
            offering = replace(offering, counts=counts)
        out.append(offering)
    order = [Kind.SHARED, Kind.MIG, Kind.FULL, Kind.VGPU]
    return sorted(out, key=lambda o: (order.index(o.kind), o.memory_mib or 0, o.slug))


def node_offerings(facts: NodeFacts, class_labels: tuple[str, ...] = DEFAULT_VGPU_CLASS_LABELS) -> list[tuple[Offering, int]]:
    """The offerings one node serves, each with the units of it the node has."""
    if not facts.hosts_pods:
        return []
    return list(_node_offerings(facts, tuple(class_labels)))


def _node_offerings(facts: NodeFacts, class_labels: tuple[str, ...]) -> Iterable[tuple[Offering, int]]:
    labels = facts.labels
    product = labels.get(PRODUCT_LABEL)
    tolerations = gpu_tolerations(facts.taints)
    for resource, units in facts.allocatable.items():
        if units <= 0:
            continue
        profile = mig_profile_from_resource(resource)
        if profile is not None:
            if facts.mig_ready:
                yield _mig(profile, resource, product or "GPU", {PRODUCT_LABEL: product} if product else {}, labels, tolerations), units
        elif resource == GPU_SHARED:
            yield _shared(labels, product, GPU_SHARED, _sharing_selector(labels, product), tolerations), units
        elif resource == GPU:
            yield from ((o, units) for o in _plain_gpu(facts, product, class_labels, tolerations))


def _sharing_selector(labels: Mapping[str, str], product: str | None) -> dict[str, str]:
    """Product plus replicas and strategy: a 1/8 share must not land on a 1/4 node."""
    selector = {PRODUCT_LABEL: product} if product else {}
    for key in (REPLICAS_LABEL, SHARING_LABEL):
        if labels.get(key):
            selector[key] = labels[key]
    return selector


def gpu_tolerations(taints: Iterable[Mapping[str, Any]]) -> tuple[dict[str, Any], ...]:
    """The default ``nvidia.com/gpu`` toleration plus one for each GPU-node taint in ``taints``."""
    out = [dict(DEFAULT_GPU_TOLERATION)]
    for taint in taints:
        key = taint.get("key")
        if key in GPU_TAINT_KEYS and key != GPU and taint.get("effect") in ("NoSchedule", "NoExecute"):
            tol = {"key": key, "operator": "Equal", "value": taint.get("value", ""), "effect": taint["effect"]}
            if tol not in out:
                out.append(tol)
    return tuple(out)


def _plain_gpu(facts: NodeFacts, product: str | None, class_labels: tuple[str, ...], tolerations) -> Iterable[Offering]:
    labels = facts.labels
    partition = labels.get(GKE_PARTITION_LABEL)
    accelerator = labels.get(GKE_ACCELERATOR_LABEL)
    if partition:  # GKE MIG: plain nvidia.com/gpu plus the partition-size node label
        if not facts.mig_ready:
            return
        selector = {GKE_PARTITION_LABEL: partition}
        if accelerator:
            selector[GKE_ACCELERATOR_LABEL] = accelerator
        pool = labels.get("cloud.google.com/gke-nodepool")
        yield _mig(partition, GPU, accelerator or product or "GPU", selector, labels, tolerations, slug_hint="gke", pool=pool)
        return
    if product and labels.get(MIG_STRATEGY_LABEL) == "single" and "-MIG-" in product:
        if not facts.mig_ready:
            return
        base, profile = product.split("-MIG-", 1)
        yield _mig(profile, GPU, base, {PRODUCT_LABEL: product}, labels, tolerations, slug_hint="single")
        return
    gke_sharing = labels.get(GKE_SHARING_LABEL)
    replicas = _int(labels.get(REPLICAS_LABEL)) or 1
    if (product and product.endswith("-SHARED")) or replicas > 1 or gke_sharing:
        if gke_sharing:
            selector = {GKE_SHARING_LABEL: gke_sharing}
            for key in (GKE_ACCELERATOR_LABEL, GKE_MAX_CLIENTS_LABEL):
                if labels.get(key):
                    selector[key] = labels[key]
        else:
            selector = _sharing_selector(labels, product)
        yield _shared(labels, product or accelerator, GPU, selector, tolerations)
        return
    if labels.get(VGPU_PRESENT_LABEL) == "true" and product:
        match = _VGPU_PROFILE.match(product)
        name = f"{product_name(match.group('gpu'))} vGPU {match.group('profile')}" if match else f"{product_name(product)} vGPU"
        yield _vgpu(_slug("vgpu", product), name, f"A virtual GPU of profile {product} on a vGPU guest node.",
                    {VGPU_PRESENT_LABEL: "true", PRODUCT_LABEL: product}, labels, product, tolerations)
        return
    for key in class_labels:
        if labels.get(key):
            value = labels[key]
            yield _vgpu(_slug("vgpu", key, value), f"vGPU class {value}", f"Nodes of the site's vGPU class {key}={value}.",
                        {key: value}, labels, product, tolerations)
            return
    name = product_name(product) if product else (product_name(accelerator) if accelerator else "GPU")
    selector = {PRODUCT_LABEL: product} if product else ({GKE_ACCELERATOR_LABEL: accelerator} if accelerator else {})
    # GKE gives whole-GPU, MIG and shared pools the same accelerator label: keep whole GPUs off the others.
    absent = (GKE_PARTITION_LABEL, GKE_SHARING_LABEL) if not product and accelerator else ()
    yield Offering(
        slug=_slug("gpu", product or accelerator or "nvidia"),
        kind=Kind.FULL,
        display_name=name,
        description=f"Whole {name} GPUs, not shared with anyone.",
        resources={GPU: 1},
        node_selector=selector,
        absent_labels=absent,
        tolerations=tolerations,
        product=product or accelerator,
        memory_mib=memory_mib(labels.get(MEMORY_LABEL)),
        compute_share="all of its compute",
        isolation=Isolation.EXCLUSIVE,
        source="discovered",
    )


def _vgpu(slug: str, name: str, description: str, selector: dict, labels: Mapping[str, str], product: str | None, tolerations) -> Offering:
    """A vGPU node class: a guest's vGPU profile, or a site's own class label."""
    return Offering(
        slug=slug,
        kind=Kind.VGPU,
        display_name=name,
        description=description,
        resources={GPU: 1},
        node_selector=selector,
        tolerations=tolerations,
        product=product,
        memory_mib=memory_mib(labels.get(MEMORY_LABEL)),
        compute_share="a vGPU slice of the physical GPU",
        isolation=Isolation.VM,
        source="discovered",
    )


def _mig(
    profile: str, resource: str, product: str, selector: dict, labels: Mapping[str, str], tolerations,
    slug_hint: str = "", pool: str | None = None,
) -> Offering:
    parts = mig_profile_parts(profile)
    slices, gb = parts if parts else (0, 0)
    mem = memory_mib(labels.get(f"{mig_resource_name(profile)}.memory")) or (gb * 1024 or None)
    name = product_name(product)
    return Offering(
        slug=_slug("mig", *( [slug_hint] if slug_hint else []), product, profile),
        kind=Kind.MIG,
        display_name=f"{name} · MIG {profile}" + (f" ({pool})" if pool else ""),
        description=f"A MIG slice {profile} of {_a(name)}: its own memory and compute, isolated in hardware.",
        resources={resource: 1},
        node_selector={k: v for k, v in selector.items() if v},
        tolerations=tolerations,
        product=product,
        memory_mib=mem,
        compute_share=f"{slices}/7 of the GPU's compute" if slices else "a MIG slice",
        isolation=Isolation.HARDWARE,
        source="discovered",
    )


def _shared(labels: Mapping[str, str], product: str | None, resource: str, selector: dict, tolerations) -> Offering:
    gke_sharing = labels.get(GKE_SHARING_LABEL)
    strategy = labels.get(SHARING_LABEL) or ("mps" if gke_sharing == "mps" else "time-slicing")
    if strategy not in ("mps", "time-slicing"):
        strategy = "time-slicing"
    replicas = _int(labels.get(REPLICAS_LABEL)) or _int(labels.get(GKE_MAX_CLIENTS_LABEL)) or 0
    name = product_name(product) if product else "GPU"
    share = f"1/{replicas}" if replicas else "a share"
    how = "MPS share" if strategy == "mps" else "time-sliced"
    total = memory_mib(labels.get(MEMORY_LABEL))
    isolation = Isolation.PARTIAL if strategy == "mps" else Isolation.NONE
    if strategy == "mps":
        memory = total // replicas if total and replicas else None  # MPS caps each client's memory
        description = f"{share} of {_a(name)} through MPS: a memory limit of your own, compute shared with others."
    else:
        memory = total  # time-slicing does not split memory: all of it is shared
        description = (
            f"{share} of {_a(name)} by time-slicing. Memory is not isolated: "
            "other users' notebooks share the same GPU memory, and one can starve the others."
        )
    return Offering(
        slug=_slug("shared", product or "gpu", strategy, f"{replicas}x" if replicas else ""),
        kind=Kind.SHARED,
        display_name=f"{name} · {share} {how}",
        description=description,
        resources={resource: 1},
        node_selector=selector,
        tolerations=tolerations,
        product=product,
        memory_mib=memory,
        compute_share=share_phrase(replicas, strategy) if replicas else f"a {how} share",
        isolation=isolation,
        source="discovered",
    )


def _a(name: str) -> str:
    """"an A100", "an H100", "an L4", "a Tesla T4": letters said with a vowel sound take "an"."""
    return f"{'an' if name[:1].upper() in 'AEFHILMNORSX' else 'a'} {name}"


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
