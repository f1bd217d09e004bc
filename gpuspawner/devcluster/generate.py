"""Random GPU clusters beyond the devcluster's own node classes, for property and truth tests.

``random_cluster(rng)`` draws nodes the way real clusters have them: GPU Feature
Discovery labels of real products (whole GPUs of several counts; MIG mixed and single,
some with labels missing; time-slicing renamed and not; MPS; vGPU guests; a site's vGPU
class), nodes a plain device-plugin install serves with no GPU labels at all, the node
pools of GKE, EKS, AKS and OpenShift with their labels and taints, and what goes wrong:
cordons, NotReady and unreachable taints, taints nobody tolerates, zero allocatable,
mig-manager mid-reconfiguration, labels and allocatable out of step mid-change, and
pod limits as small as the clouds set them. ``random_pods`` adds what other users
already run there (GPU jobs and cpu/memory hogs in other namespaces, daemon pods).

Every node comes with ``truth``: for each GPU resource it advertises, the kind of offering
it must belong to (``full``, ``shared``, ``mig``, ``vgpu``) or why no offering may take it
(``hidden:<reason>``). The truth is written here from what the generator chose to build,
not from gpuspawner's rules, so a property test can hold discovery to it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from gpuspawner.devcluster.gputables import (
    AKS_SIZES,
    EKS_ACCELERATORS,
    FOREIGN_TAINT,
    GFD_COMMON,
    GKE_ACCELERATORS,
    GKE_PARTITIONS,
    GPU_TAINTS,
    MIG_PRODUCTS,
    NOT_READY,
    PRODUCTS,
    SITE_CLASSES,
    SOFT_TAINT,
    UNREACHABLE,
    USER_POOL_TAINT,
    VGPU_PROFILES,
)
from gpuspawner.devcluster.nodes import KWOK_ANNOTATION, pod_cidr
from gpuspawner.names.nvidia import (
    COUNT_LABEL,
    GPU,
    GPU_SHARED,
    MEMORY_LABEL,
    MIG_PREFIX,
    MIG_STATE_LABEL,
    MIG_STRATEGY_LABEL,
    PRODUCT_LABEL,
    REPLICAS_LABEL,
    SHARING_LABEL,
    VGPU_PRESENT_LABEL,
    WORKLOAD_LABEL,
)


@dataclass
class GeneratedNode:
    """A Node manifest and what each of its GPU resources is (``truth``: resource -> kind or ``hidden:why``)."""

    manifest: dict[str, Any]
    truth: dict[str, str] = field(default_factory=dict)
    platform: str = ""
    scheme: str = ""

    @property
    def name(self) -> str:
        return str(self.manifest["metadata"]["name"])


class _Draw:
    """One node being drawn: labels, allocatable, taints, truth."""

    def __init__(self, rng: random.Random, name: str, index: int):
        self.rng = rng
        self.name = name
        self.index = index
        self.labels: dict[str, str] = {}
        self.allocatable: dict[str, str] = {}
        self.taints: list[dict[str, str]] = []
        self.truth: dict[str, str] = {}
        self.unschedulable = False
        self.platform = "on-prem"
        self.scheme = ""

    def gfd(self, product: str, count: int, replicas: int = 1, strategy: str | None = "none", old: bool = False) -> None:
        """GPU Feature Discovery's labels (``old``: a GFD before the sharing-strategy label)."""
        memory, family, cc = PRODUCTS.get(product.split("-MIG-")[0].removesuffix("-SHARED"), (16384, "unknown", "0.0", {}))[:3]
        self.labels.update(GFD_COMMON)
        self.labels.update(
            {
                PRODUCT_LABEL: product,
                COUNT_LABEL: str(count),
                MEMORY_LABEL: str(memory),
                "nvidia.com/gpu.family": family,
                "nvidia.com/gpu.compute.major": cc.split(".")[0],
                "nvidia.com/gpu.compute.minor": cc.split(".")[1],
                VGPU_PRESENT_LABEL: "false",
                "nvidia.com/mig.capable": "true" if product in MIG_PRODUCTS else "false",
            }
        )
        if not old:
            self.labels[REPLICAS_LABEL] = str(replicas)
            if strategy is not None:
                self.labels[SHARING_LABEL] = strategy
        elif replicas > 1:
            self.labels[REPLICAS_LABEL] = str(replicas)

    def host(self, pods: int | None = None) -> None:
        rng = self.rng
        cpu = rng.choice([4, 8, 16, 32, 64, 96])
        self.allocatable.update(
            {
                "cpu": str(cpu) if rng.random() < 0.7 else f"{cpu * 1000 - rng.choice([100, 250, 940])}m",
                "memory": f"{cpu * rng.choice([4, 8])}Gi" if rng.random() < 0.7 else f"{cpu * 4 * 1024 * 1024 - 3_145_728}Ki",
                "pods": str(pods if pods is not None else rng.choice([110, 110, 110, 58, 30, 8, 4])),
                "ephemeral-storage": "100Gi",
            }
        )

    def manifest(self) -> dict[str, Any]:
        labels = {
            **self.labels,
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "type": "kwok",
        }
        cidr = pod_cidr(self.index)
        spec: dict[str, Any] = {"podCIDR": cidr, "podCIDRs": [cidr], "taints": [dict(t) for t in self.taints]}
        if self.unschedulable:
            spec["unschedulable"] = True
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": labels, "annotations": {KWOK_ANNOTATION: "fake"}},
            "spec": spec,
            "status": {"allocatable": dict(self.allocatable), "capacity": dict(self.allocatable)},
        }


# ------------------------------------------------------------------------- GPU schemes


def _whole(d: _Draw) -> None:
    rng = d.rng
    product = rng.choice(list(PRODUCTS))
    count = rng.choice([1, 1, 2, 4, 8])
    old = rng.random() < 0.15
    d.gfd(product, count, old=old)
    if rng.random() < 0.1:  # only the product label survived (a partial or hand-made label set)
        for key in (REPLICAS_LABEL, SHARING_LABEL):
            d.labels.pop(key, None)
    d.allocatable[GPU] = str(count)
    d.truth[GPU] = "full"
    d.scheme = "whole" + (" (old GFD)" if old else "")


def _mig_mixed(d: _Draw) -> None:
    rng = d.rng
    product = rng.choice(MIG_PRODUCTS)
    count = rng.choice([1, 2, 4, 8])
    layout_name, layout = rng.choice(list(PRODUCTS[product][3].items()))
    disabled = rng.choice([0, 0, 0, 1]) if count > 1 else 0  # GPUs left out of MIG: plain nvidia.com/gpu
    d.gfd(product, count)
    d.labels.update({MIG_STRATEGY_LABEL: "mixed", "nvidia.com/mig.config": layout_name})
    state = rng.choice(["success"] * 6 + ["pending", "rebooting", "failed", None])
    if state is not None:
        d.labels[MIG_STATE_LABEL] = state
    for profile, per_gpu in layout.items():
        resource = f"{MIG_PREFIX}{profile.replace('+', '.')}"
        d.allocatable[resource] = str(per_gpu * (count - disabled))
        if rng.random() < 0.8:  # partial labels: some per-profile labels missing
            d.labels[f"{resource}.count"] = str(per_gpu * (count - disabled))
        d.truth[resource] = "mig" if state in ("success", None) else "hidden:mig-reconfiguring"
    if rng.random() < 0.15:
        d.labels.pop(MIG_STRATEGY_LABEL)
    if rng.random() < 0.1:  # a partial label set without the product: slices of an unnamed GPU
        for key in (PRODUCT_LABEL, REPLICAS_LABEL, SHARING_LABEL):
            d.labels.pop(key, None)
    d.allocatable[GPU] = str(disabled)
    if disabled:
        d.truth[GPU] = "full"
    d.scheme = f"MIG mixed {layout_name}" + (f" ({state})" if state not in ("success", None) else "")


def _mig_single(d: _Draw) -> None:
    rng = d.rng
    product = rng.choice(MIG_PRODUCTS)
    layouts = {n: lay for n, lay in PRODUCTS[product][3].items() if len(lay) == 1 and "+" not in next(iter(lay))}
    layout_name, layout = rng.choice(list(layouts.items()))
    profile, per_gpu = next(iter(layout.items()))
    count = rng.choice([1, 2, 4])
    d.gfd(f"{product}-MIG-{profile}", count * per_gpu)
    d.labels.update({MIG_STRATEGY_LABEL: "single", "nvidia.com/mig.config": layout_name})
    state = rng.choice(["success"] * 5 + ["pending", None])
    if state is not None:
        d.labels[MIG_STATE_LABEL] = state
    if rng.random() < 0.15:  # partial labels: no strategy label, the product still says -MIG-
        d.labels.pop(MIG_STRATEGY_LABEL)
    d.allocatable[GPU] = str(count * per_gpu)
    d.truth[GPU] = "mig" if state != "pending" else "hidden:mig-reconfiguring"
    d.scheme = f"MIG single {profile}" + (" (pending)" if state == "pending" else "")


def _shared(d: _Draw, mps: bool = False) -> None:
    rng = d.rng
    product = rng.choice([p for p in PRODUCTS if p not in MIG_PRODUCTS or rng.random() < 0.3])
    count = rng.choice([1, 1, 2, 4])
    replicas = rng.choice([2, 4, 4, 8, 10])
    renamed = rng.random() < 0.5
    strategy = "mps" if mps else "time-slicing"
    old = not mps and rng.random() < 0.2  # before GFD had the sharing-strategy label
    d.gfd(product if renamed else f"{product}-SHARED", count, replicas, strategy, old=old)
    if mps:
        d.labels["nvidia.com/mps.capable"] = "true"
    resource = GPU_SHARED if renamed else GPU
    d.allocatable[resource] = str(count * replicas)
    if renamed and rng.random() < 0.5:
        d.allocatable[GPU] = "0"
    d.truth[resource] = "shared"
    d.scheme = f"{strategy} x{replicas} {'renamed' if renamed else '-SHARED'}" + (" (old GFD)" if old else "")


def _mid_change(d: _Draw) -> None:
    """The device plugin's sharing config changed and labels or allocatable lag behind."""
    rng = d.rng
    product = rng.choice(["Tesla-T4", "NVIDIA-L4", "NVIDIA-A10"])
    count = rng.choice([1, 2])
    case = rng.choice(["labels-first", "allocatable-first", "replicas-only"])
    if case == "labels-first":  # GFD relabelled for time-slicing; the plugin still serves whole GPUs
        d.gfd(f"{product}-SHARED", count, 4, "time-slicing")
        d.allocatable[GPU] = str(count)
        d.truth[GPU] = "shared"
    elif case == "allocatable-first":  # the plugin serves 4 replicas; GFD labels still say whole GPUs
        d.gfd(product, count)
        d.allocatable[GPU] = str(count * 4)
        d.truth[GPU] = "full"
    else:  # the replicas label updated, nothing else yet
        d.gfd(product, count, replicas=4, strategy="none")
        d.allocatable[GPU] = str(count * 4)
        d.truth[GPU] = "shared"
    d.scheme = f"mid-change {case}"


def _vgpu_guest(d: _Draw) -> None:
    product = d.rng.choice(VGPU_PROFILES)
    d.gfd(product, 1)
    d.labels[VGPU_PRESENT_LABEL] = "true"
    d.labels["nvidia.com/vgpu.host-driver-version"] = "550.54.10"
    d.allocatable[GPU] = "1"
    d.truth[GPU] = "vgpu"
    d.scheme = "vGPU guest"


def _site_class(d: _Draw) -> None:
    d.gfd(d.rng.choice(["GRID-V100-8C", "NVIDIA-A10-12C"]), 1)
    d.labels["vgpu.type"] = d.rng.choice(SITE_CLASSES)
    d.allocatable[GPU] = "1"
    d.truth[GPU] = "vgpu"
    d.scheme = "site vGPU class"


def _unlabelled(d: _Draw) -> None:
    """A plain device-plugin install: nvidia.com/gpu and no GPU labels (maybe a cloud instance type)."""
    count = d.rng.choice([1, 2, 4, 8])
    d.allocatable[GPU] = str(count)
    if d.rng.random() < 0.5:
        d.labels["node.kubernetes.io/instance-type"] = d.rng.choice(["gpu-box-1", "gpu-box-4", "p3.8xlarge"])
    d.truth[GPU] = "full"
    d.scheme = "unlabelled device plugin"


def _fractional(d: _Draw) -> None:
    d.gfd("Tesla-V100-SXM2-16GB", 1)
    d.allocatable["nvidia.com/vgpu"] = "1000"
    d.truth["nvidia.com/vgpu"] = "hidden:not-discovered"
    d.scheme = "fractional device plugin"


def _vm_host(d: _Draw) -> None:
    d.gfd(d.rng.choice(["NVIDIA-A10", "Tesla-T4"]), 2)
    d.labels[WORKLOAD_LABEL] = d.rng.choice(["vm-passthrough", "vm-vgpu"])
    d.allocatable[GPU] = "2"  # stale: the sandbox plugin serves VMs, not pods
    d.truth[GPU] = "hidden:vm-host"
    d.scheme = "VM host"


def _cpu(d: _Draw) -> None:
    d.scheme = "cpu"


SCHEMES = [
    (_whole, 6),
    (_mig_mixed, 3),
    (_mig_single, 2),
    (_shared, 3),
    (lambda d: _shared(d, mps=True), 2),
    (_mid_change, 1),
    (_vgpu_guest, 1),
    (_site_class, 1),
    (_unlabelled, 3),
    (_fractional, 1),
    (_vm_host, 1),
    (_cpu, 2),
]


# ------------------------------------------------------------------------------ clouds


def _gke(d: _Draw) -> None:
    rng = d.rng
    accelerator = rng.choice(list(GKE_ACCELERATORS))
    d.platform = "gke"
    d.labels.update(
        {
            "cloud.google.com/gke-accelerator": accelerator,
            "cloud.google.com/gke-gpu": "true",
            "cloud.google.com/gke-nodepool": f"pool-{accelerator.split('-')[-1]}",
            "node.kubernetes.io/instance-type": GKE_ACCELERATORS[accelerator],
            "topology.kubernetes.io/zone": "europe-west4-a",
        }
    )
    d.taints.append({"key": GPU, "value": "present", "effect": "NoSchedule"})
    count = rng.choice([1, 2, 4])
    mode = rng.choice(["whole", "whole", "partition", "sharing"] if accelerator in GKE_PARTITIONS else ["whole", "sharing"])
    if mode == "partition":
        partition = rng.choice(GKE_PARTITIONS[accelerator])
        d.labels["cloud.google.com/gke-gpu-partition-size"] = partition
        d.allocatable[GPU] = str(count * rng.choice([2, 3, 7]))
        d.truth[GPU] = "mig"
    elif mode == "sharing":
        clients = rng.choice([2, 4, 8])
        d.labels.update(
            {
                "cloud.google.com/gke-gpu-sharing-strategy": rng.choice(["time-sharing", "mps"]),
                "cloud.google.com/gke-max-shared-clients-per-gpu": str(clients),
            }
        )
        d.allocatable[GPU] = str(count * clients)
        d.truth[GPU] = "shared"
    else:
        d.allocatable[GPU] = str(count)
        d.truth[GPU] = "full"
    d.scheme = f"GKE {mode}"


def _eks(d: _Draw) -> None:
    rng = d.rng
    accelerator = rng.choice(list(EKS_ACCELERATORS))
    instance, product, pods = EKS_ACCELERATORS[accelerator]
    d.platform = "eks"
    d.labels.update(
        {
            "eks.amazonaws.com/nodegroup": f"gpu-{instance.split('.')[0]}",
            "eks.amazonaws.com/capacityType": "ON_DEMAND",
            "k8s.amazonaws.com/accelerator": accelerator,
            "node.kubernetes.io/instance-type": instance,
        }
    )
    if rng.random() < 0.5:
        d.taints.append({"key": GPU, "value": "true", "effect": "NoSchedule"})
    if rng.random() < 0.5:  # the GPU operator's GFD runs here too
        d.gfd(product, 1)
    d.allocatable[GPU] = "1"
    d.truth[GPU] = "full"
    d.host(pods)
    d.scheme = "EKS" + (" + GFD" if PRODUCT_LABEL in d.labels else "")


def _aks(d: _Draw) -> None:
    rng = d.rng
    size = rng.choice(list(AKS_SIZES))
    d.platform = "aks"
    d.labels.update(
        {
            "kubernetes.azure.com/agentpool": "gpupool",
            "kubernetes.azure.com/accelerator": "nvidia",
            "kubernetes.azure.com/mode": "user",
            "node.kubernetes.io/instance-type": size,
        }
    )
    d.taints.append({"key": "sku", "value": "gpu", "effect": "NoSchedule"})
    if rng.random() < 0.5:
        d.gfd(AKS_SIZES[size], 1)
    d.allocatable[GPU] = "1"
    d.truth[GPU] = "full"
    d.host(30)
    d.scheme = "AKS" + (" + GFD" if PRODUCT_LABEL in d.labels else "")


# ---------------------------------------------------------------------------- the draw


def random_node(rng: random.Random, name: str, index: int) -> GeneratedNode:
    """One node: a platform, a GPU scheme, then what can go wrong with it."""
    d = _Draw(rng, name, index)
    platform = rng.choices(["on-prem", "openshift", "gke", "eks", "aks"], weights=[5, 2, 2, 1, 1])[0]
    if platform == "gke":
        _gke(d)
    elif platform == "eks":
        _eks(d)
    elif platform == "aks":
        _aks(d)
    else:
        schemes, weights = zip(*SCHEMES, strict=True)
        rng.choices(schemes, weights=weights)[0](d)
        if platform == "openshift":
            d.platform = "openshift"
            d.labels.update({"node-role.kubernetes.io/worker": "", "node.openshift.io/os_id": "rhcos"})
        if d.allocatable and rng.random() < 0.5:
            d.taints.append(dict(rng.choice(GPU_TAINTS)))
    if "pods" not in d.allocatable:
        d.host()
    _mishaps(d)
    return GeneratedNode(d.manifest(), d.truth, d.platform, d.scheme)


def _hide(d: _Draw, why: str) -> None:
    """Every GPU resource of the node is out of reach; ``hidden:a+b`` when there are two causes."""
    for resource, kind in d.truth.items():
        d.truth[resource] = f"{kind}+{why}" if kind.startswith("hidden:") else f"hidden:{why}"


def _mishaps(d: _Draw) -> None:
    rng = d.rng
    roll = rng.random()
    if roll < 0.07:
        d.unschedulable = True
        if rng.random() < 0.5:  # the node lifecycle controller adds this taint to a cordoned node, in time
            d.taints.append({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"})
        _hide(d, "cordoned")
    elif roll < 0.12:
        d.taints.extend(dict(t) for t in rng.choice([NOT_READY, UNREACHABLE]))
        _hide(d, "not-ready")
    elif roll < 0.15:  # only the NoExecute half: every pod tolerates it (the API server's defaults)
        d.taints.append({"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"})
    elif roll < 0.19:
        d.taints.append(dict(FOREIGN_TAINT))
        _hide(d, "untolerated-taint")
    elif roll < 0.22:
        d.taints.append(dict(SOFT_TAINT))
    elif roll < 0.25:
        d.taints.append(dict(USER_POOL_TAINT))  # z2jh user pools: reachable only with the hub's user-pod tolerations
        _hide(d, "user-pool-taint")
    elif roll < 0.28:  # zero allocatable: the device plugin has not registered (yet)
        for resource in list(d.truth):
            d.allocatable[resource] = "0"
            del d.truth[resource]


def random_cluster(rng: random.Random, size: tuple[int, int] = (4, 12), prefix: str = "n") -> list[GeneratedNode]:
    """A random set of nodes (names ``{prefix}-00``, ...)."""
    return [random_node(rng, f"{prefix}-{i:02d}", i) for i in range(rng.randint(*size))]


# -------------------------------------------------------------------------------- pods
