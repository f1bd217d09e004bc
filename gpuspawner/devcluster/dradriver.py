"""A simulated NVIDIA DRA driver: the DeviceClasses and ResourceSlices ``k8s-dra-driver-gpu`` publishes.

The real driver is a kubelet plugin on every GPU node. It publishes one ResourceSlice per
node (pool named after the node, driver ``gpu.nvidia.com``) listing the node's GPUs
(``gpu-<minor>``) or, on a GPU in static MIG mode, its MIG devices
(``gpu-<minor>-mig-<profile>-<GI profile id>-<placement start>``; the parent is then not
listed), with the attribute and capacity names of its ``deviceinfo.go`` and ``mig.go``, and
its Helm chart installs the DeviceClasses ``gpu.nvidia.com`` (with
``extendedResourceName: nvidia.com/gpu`` on resource.k8s.io/v1), ``mig.nvidia.com`` and
``vfio.gpu.nvidia.com``. Here the same objects are written straight to the API server for
kwok nodes, so the real kube-scheduler allocates claims against them and kwok runs the pods.
What is not simulated: the kubelet's prepare step (CDI devices, MPS daemons, time-slice
settings); a pod's claim config is never applied to a GPU.

Names come from :mod:`gpuspawner.names.dranames`; the products' numbers are NVML's.
"""

from __future__ import annotations

import time
import urllib.error
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuspawner.devcluster.nodes import node_manifest
from gpuspawner.names import dranames as dn
from gpuspawner.names.nvidia import PRODUCT_LABEL

MIB = 1024 * 1024


@dataclass(frozen=True)
class Product:
    """One GPU model as NVML names it (productName, brand, architecture, compute capability, memory MiB)."""

    name: str
    architecture: str
    compute_capability: str
    memory_mib: int
    brand: str = "Nvidia"


A100_40GB = Product("NVIDIA A100-SXM4-40GB", "Ampere", "8.0", 40960)
H100_80GB = Product("NVIDIA H100 80GB HBM3", "Hopper", "9.0", 81559)
L4 = Product("NVIDIA L4", "Ada Lovelace", "8.9", 23034)
L40S = Product("NVIDIA L40S", "Ada Lovelace", "8.9", 46068)

#: A100-40GB GPU instance profiles (NVML's GpuInstanceProfileInfo): profile -> (GI profile id,
#: memory MiB, multiprocessors, memory slices, (copy engines, decoders, encoders, JPEG, OFA)).
A100_40GB_MIG: dict[str, tuple[int, int, int, int, tuple[int, ...]]] = {
    "1g.5gb": (19, 4864, 14, 1, (1, 0, 0, 0, 0)),
    "2g.10gb": (14, 9856, 28, 2, (2, 1, 0, 0, 0)),
    "3g.20gb": (9, 19968, 42, 4, (3, 2, 0, 0, 0)),
    "7g.40gb": (0, 40192, 98, 8, (7, 5, 0, 1, 1)),
}

#: Every A100-40GB GPU instance profile NVML reports (``GetGpuInstanceProfileInfo``), as the table above,
#: with its possible placements (``GetGpuInstancePossiblePlacements``: start memory slices; the size is
#: the memory slices column): what NVIDIA's driver walks for dynamic MIG (``inspectMigProfilesAndPlacements``).
A100_40GB_DYNAMIC_MIG: dict[str, tuple[tuple[int, int, int, int, tuple[int, ...]], tuple[int, ...]]] = {
    "1g.5gb": (A100_40GB_MIG["1g.5gb"], (0, 1, 2, 3, 4, 5, 6)),
    "1g.5gb+me": ((20, 4864, 14, 1, (1, 1, 0, 1, 1)), (0, 1, 2, 3, 4, 5, 6)),
    "1g.10gb": ((15, 9856, 14, 2, (1, 1, 0, 0, 0)), (0, 2, 4, 6)),
    "2g.10gb": (A100_40GB_MIG["2g.10gb"], (0, 2, 4)),
    "3g.20gb": (A100_40GB_MIG["3g.20gb"], (0, 4)),
    "4g.20gb": ((5, 19968, 56, 4, (4, 2, 0, 0, 0)), (0,)),
    "7g.40gb": (A100_40GB_MIG["7g.40gb"], (0,)),
}
#: The memory slices of an A100-40GB.
A100_MEMORY_SLICES = 8

DRIVER_VERSION = "550.54.15"
CUDA_DRIVER_VERSION = "12.4.0"


@dataclass(frozen=True)
class DraNode:
    """One simulated node the DRA driver serves: ``gpus`` of ``product``; ``mig`` lays out each GPU
    as (profile, placement start) pairs (static MIG), else the GPUs are whole; ``dynamic_mig``:
    the driver's ``DynamicMIG`` on A100-40GBs in MIG mode (every placement of every profile,
    partitionable devices taking from one counter set per GPU; :func:`dynamic_mig_devices`)."""

    name: str
    product: Product
    gpus: int
    mig: tuple[tuple[str, int], ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    dynamic_mig: bool = False
    #: Fields added to each whole GPU it publishes (e.g. :data:`BINDING_FIELDS`).
    device_fields: Mapping[str, Any] = field(default_factory=dict)
    #: The driver's ``--consumable-shares`` (its ConsumableShares feature): "memory", "unlimited"
    #: or a number of shares; "" (disabled): each device goes to one claim.
    shares: str = ""
    #: Device taints, by device name (``spec.devices[].taints``; as an admin's DeviceTaintRule or a driver would put them).
    taints: Mapping[str, tuple[Mapping[str, str], ...]] = field(default_factory=dict)


#: The devcluster's DRA nodes: whole H100s, whole L4s, an A100 in the balanced MIG layout.
DRA_NODES = (
    DraNode("dra-h100", H100_80GB, 2),
    DraNode("dra-l4", L4, 4),
    DraNode("dra-a100-mig", A100_40GB, 1, mig=(("2g.10gb", 0), ("1g.5gb", 2), ("1g.5gb", 3), ("3g.20gb", 4))),
)
#: A node whose two A100s the driver partitions on demand (dynamic MIG); apart from DRA_NODES, whose
#: static A100 MIG devices it would join in the same offerings.
DYNAMIC_MIG_NODES = (DraNode("dra-a100-dynmig", A100_40GB, 2, dynamic_mig=True),)


A10 = Product("NVIDIA A10", "Ampere", "8.6", 23028)

#: A DRA-managed node that GPU Feature Discovery labels like a device-plugin H100 node, and no
#: ``nvidia.com/gpu`` in its allocatable: a plain ``nvidia.com/gpu`` offering of H100s reaches it
#: and the scheduler serves it from this node's devices through a claim of its own (the
#: ``gpu.nvidia.com`` class maps ``nvidia.com/gpu``; see :mod:`gpuspawner.dra.extres`).
EXTRES_NODE = DraNode("dra-h100-mapped", H100_80GB, 2, labels={PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3"})

#: The device status condition that a device with binding conditions waits for, and the one
#: that fails its binding (names of our own: NVIDIA's GPU driver publishes no binding
#: conditions; fabric-attached devices, KEP-5007, do).
BOUND_CONDITION = "FabricAttached"
BOUND_FAILURE = "FabricAttachFailed"
BINDING_FIELDS: Mapping[str, Any] = {
    "bindingConditions": [BOUND_CONDITION],
    "bindingFailureConditions": [BOUND_FAILURE],
    "bindsToNode": True,
}
#: A node whose GPU must be attached before a pod binds (the scheduler waits in PreBind until
#: the claim's device status has ``FabricAttached: True``).
ATTACHED_NODE = DraNode("dra-a10-attach", A10, 1, device_fields=BINDING_FIELDS)


def _str(value: str) -> dict[str, str]:
    return {"string": value}


def _version(value: str) -> dict[str, str]:
    parts = (value.split(".") + ["0", "0"])[:3]
    return {"version": ".".join(parts)}


def _uuid(prefix: str, *parts: object) -> str:
    return f"{prefix}-{uuid.uuid5(uuid.NAMESPACE_DNS, '/'.join(map(str, parts)))}"


def _product_attributes(product: Product, pci_bus_id: str) -> dict[str, Any]:
    return {
        dn.ATTR_PRODUCT: _str(product.name),
        dn.ATTR_BRAND: _str(product.brand),
        dn.ATTR_ARCHITECTURE: _str(product.architecture),
        dn.ATTR_COMPUTE_CAPABILITY: _version(product.compute_capability),
        dn.ATTR_DRIVER_VERSION: _version(DRIVER_VERSION),
        dn.ATTR_CUDA_DRIVER_VERSION: _version(CUDA_DRIVER_VERSION),
        dn.ATTR_PCI_BUS_ID: _str(pci_bus_id),
    }


def _quantity_mib(mib: int) -> dict[str, str]:
    """A byte count as resource.NewQuantity(bytes, BinarySI) serialises it."""
    return {"value": f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"}


def gpu_device(node: str, minor: int, product: Product) -> dict[str, Any]:
    """A whole GPU as the driver's ``GpuInfo.GetDevice`` publishes it."""
    attributes = {dn.ATTR_TYPE: _str(dn.TYPE_GPU), dn.ATTR_UUID: _str(_uuid("GPU", node, minor))}
    attributes.update(_product_attributes(product, f"0000:{0x0F + minor:02x}:00.0"))
    return {"name": dn.gpu_device_name(minor), "attributes": attributes, "capacity": {dn.CAP_MEMORY: _quantity_mib(product.memory_mib)}}


def mig_device(node: str, minor: int, product: Product, profile: str, start: int) -> dict[str, Any]:
    """A static MIG device as the driver's ``MigDeviceInfo.GetDevice`` publishes it (A100-40GB profiles)."""
    profile_id, memory_mib, sms, slices, engines = A100_40GB_MIG[profile]
    attributes = {
        dn.ATTR_TYPE: _str(dn.TYPE_MIG),
        dn.ATTR_PARENT_UUID: _str(_uuid("GPU", node, minor)),
        dn.ATTR_PROFILE: _str(profile),
        dn.ATTR_UUID: _str(_uuid("MIG", node, minor, profile, start)),
    }
    attributes.update(_product_attributes(product, f"0000:{0x0F + minor:02x}:00.0"))
    capacity: dict[str, Any] = {dn.CAP_MEMORY: _quantity_mib(memory_mib), dn.CAP_MULTIPROCESSORS: {"value": str(sms)}}
    for engine, amount in zip(dn.MIG_ENGINE_CAPACITIES, engines, strict=True):
        capacity[engine] = {"value": str(amount)}
    for i in range(start, start + slices):
        capacity[f"memorySlice{i}"] = {"value": "1"}
    return {"name": dn.mig_device_name(minor, profile, profile_id, start), "attributes": attributes, "capacity": capacity}


def counter_set_name(minor: int) -> str:
    """The counter set of one GPU (``GpuInfo.GetSharedCounterSetName``: ``gpu-<minor>-counter-set``)."""
    return f"{dn.gpu_device_name(minor)}-counter-set"


def _counters(profile_spec: tuple[int, int, int, int, tuple[int, ...]], start: int, size: int) -> dict[str, dict[str, str]]:
    """A profile's capacities as counters (``capacitiesToCounters``: names in DNS form) plus ``memory-slice-<i>`` of 1
    for each memory slice from ``start`` (``addCountersForMemSlices``)."""
    _, memory_mib, sms, _, engines = profile_spec
    counters = {"multiprocessors": {"value": str(sms)}, "memory": _quantity_mib(memory_mib)}
    for engine, amount in zip(DYNAMIC_MIG_ENGINE_COUNTERS, engines, strict=True):
        counters[engine] = {"value": str(amount)}
    for i in range(start, start + size):
        counters[f"memory-slice-{i}"] = {"value": "1"}
    return counters


#: ``camelToDNSName`` of :data:`gpuspawner.names.dranames.MIG_ENGINE_CAPACITIES`, the counters' names.
DYNAMIC_MIG_ENGINE_COUNTERS = ("copy-engines", "decoders", "encoders", "jpeg-engines", "ofa-engines")


def _largest(
    table: Mapping[str, tuple[tuple[int, int, int, int, tuple[int, ...]], tuple[int, ...]]],
) -> tuple[int, int, int, int, tuple[int, ...]]:
    """Each capacity's largest value over all profiles (``maxCapacities``; the 7g.40gb's here)."""
    specs = [spec for spec, _ in table.values()]
    engines = tuple(max(s[4][i] for s in specs) for i in range(len(DYNAMIC_MIG_ENGINE_COUNTERS)))
    return (0, max(s[1] for s in specs), max(s[2] for s in specs), max(s[3] for s in specs), engines)


def node_counter_sets(spec: DraNode) -> list[dict[str, Any]]:
    """The pool's ``sharedCounters``: one counter set per GPU of a dynamic-MIG node (``PartSharedCounterSets``)."""
    if not spec.dynamic_mig:
        return []
    full = _largest(A100_40GB_DYNAMIC_MIG)
    return [{"name": counter_set_name(minor), "counters": _counters(full, 0, A100_MEMORY_SLICES)} for minor in range(spec.gpus)]


def dynamic_mig_device(node: str, minor: int, product: Product, profile: str, start: int) -> dict[str, Any]:
    """A MIG placement that could be made, as the driver's ``MigSpec.PartGetDevice`` publishes it: the
    attributes of ``CommonAttributesMig`` (no ``uuid``: the MIG device does not exist yet), the capacities
    of ``CommonCapacitiesMig`` (no memory slices), and ``consumesCounters`` from its GPU's counter set."""
    profile_spec, _ = A100_40GB_DYNAMIC_MIG[profile]
    profile_id, memory_mib, sms, slices, engines = profile_spec
    attributes = {dn.ATTR_TYPE: _str(dn.TYPE_MIG), dn.ATTR_PARENT_UUID: _str(_uuid("GPU", node, minor)), dn.ATTR_PROFILE: _str(profile)}
    attributes.update(_product_attributes(product, f"0000:{0x0F + minor:02x}:00.0"))
    capacity: dict[str, Any] = {dn.CAP_MEMORY: _quantity_mib(memory_mib), dn.CAP_MULTIPROCESSORS: {"value": str(sms)}}
    for engine, amount in zip(dn.MIG_ENGINE_CAPACITIES, engines, strict=True):
        capacity[engine] = {"value": str(amount)}
    return {
        "name": dn.mig_device_name(minor, profile, profile_id, start),
        "attributes": attributes,
        "capacity": capacity,
        "consumesCounters": [{"counterSet": counter_set_name(minor), "counters": _counters(profile_spec, start, slices)}],
    }


def dynamic_mig_devices(node: str, minor: int, product: Product) -> list[dict[str, Any]]:
    """Every placement of every profile of one A100-40GB in MIG mode, sorted by name as the driver publishes them.

    The whole GPU is not among them: an A100 cannot leave MIG mode without a reset, so the driver
    offers only its partitions there (``isDynamicMIGCapable``; Hopper and later also offer the GPU).
    """
    devices = [
        dynamic_mig_device(node, minor, product, profile, start)
        for profile, (_, starts) in A100_40GB_DYNAMIC_MIG.items()
        for start in starts
    ]
    return sorted(devices, key=lambda d: d["name"])


#: GPU-memory shares: L40S GPUs that several claims share by memory (``--consumable-shares=memory``).
SHARE_NODES = (DraNode("dra-l40s", L40S, 2, shares="memory"),)


def consumable_shares(device: dict[str, Any], mode: str) -> dict[str, Any]:
    """``device`` as NVIDIA's ``applyConsumableShares`` (cmd/gpu-kubelet-plugin/consumable_shares.go)
    publishes it with ``--consumable-shares=mode``: ``allowMultipleAllocations``, the memory
    (rounded down to 1Mi) taken in 1Mi steps -- by default all of it ("memory") or none
    ("unlimited", a number) -- and for a number N a ``shares`` capacity of N, one by default."""
    if not mode or mode == "disabled":
        return device
    memory = device["capacity"].get(dn.CAP_MEMORY)
    out = {**device, "allowMultipleAllocations": True, "capacity": dict(device["capacity"])}
    if memory is None:
        return out
    whole = memory["value"]
    default = whole if mode == "memory" else "0"
    low = "1Mi" if mode == "memory" else "0"
    out["capacity"][dn.CAP_MEMORY] = {
        "value": whole,
        "requestPolicy": {"default": default, "validRange": {"min": low, "max": whole, "step": "1Mi"}},
    }
    if mode not in ("memory", "unlimited"):
        n = str(int(mode))
        out["capacity"]["shares"] = {"value": n, "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": n, "step": "1"}}}
    return out


def node_devices(spec: DraNode) -> list[dict[str, Any]]:
    """Every device the driver publishes for ``spec``'s node."""
    devices = []
    for minor in range(spec.gpus):
        if spec.dynamic_mig:
            devices.extend(dynamic_mig_devices(spec.name, minor, spec.product))
        elif spec.mig:
            devices.extend(mig_device(spec.name, minor, spec.product, profile, start) for profile, start in spec.mig)
        else:
            devices.append({**gpu_device(spec.name, minor, spec.product), **spec.device_fields})
    devices = [consumable_shares(d, spec.shares) for d in devices]
    return [{**d, "taints": [dict(t) for t in spec.taints[d["name"]]]} if spec.taints.get(d["name"]) else d for d in devices]


def resource_slices(
    node: str, devices: list[dict[str, Any]], generation: int = 1, slice_count: int = 1, counter_sets: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """The node's pool as ``slice_count`` ResourceSlices of one ``generation`` (devices split evenly).

    ``counter_sets`` (partitionable devices): the pool's ``sharedCounters`` go first, in a slice of
    their own (the API allows devices or counter sets in one slice, not both; NVIDIA's driver
    splits them so from Kubernetes 1.35), and the devices are split in runs (one slice per GPU
    when ``slice_count`` is the node's GPUs, as the driver's ``generateSplitResourceSlices``).
    """
    spec = {"driver": dn.DRIVER, "nodeName": node}
    total = slice_count + (1 if counter_sets else 0)
    bodies: list[dict[str, Any]] = [{"sharedCounters": counter_sets}] if counter_sets else []
    if counter_sets:
        run = -(-len(devices) // slice_count)
        bodies += [{"devices": devices[i * run : (i + 1) * run]} for i in range(slice_count)]
    else:
        bodies += [{"devices": devices[i::slice_count]} for i in range(slice_count)]
    return [
        {
            "apiVersion": dn.RESOURCE_API,
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{dn.DRIVER}-{generation}-{i}"},
            "spec": {**spec, "pool": {"name": node, "generation": generation, "resourceSliceCount": total}, **body},
        }
        for i, body in enumerate(bodies)
    ]


def device_classes() -> list[dict[str, Any]]:
    """The DeviceClasses of the driver's Helm chart (``templates/deviceclass-*.yaml``), v1 API."""

    def cls(name: str, device_type: str, **extra: Any) -> dict[str, Any]:
        expression = f"device.driver == '{dn.DRIVER}' && device.attributes['{dn.DRIVER}'].type == '{device_type}'"
        return {
            "apiVersion": dn.RESOURCE_API,
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expression}}], **extra},
        }

    return [
        cls(dn.CLASS_GPU, dn.TYPE_GPU, extendedResourceName=dn.EXTENDED_RESOURCE),
        cls(dn.CLASS_MIG, dn.TYPE_MIG),
        cls(dn.CLASS_VFIO, dn.TYPE_VFIO),
    ]


DRA_NODE_LABEL = "gpuspawner.io/dra"
#: Host resources of a simulated DRA node (no extended GPU resource: the driver, not the device plugin, serves it).
HOST = {"cpu": "32", "memory": "256Gi", "pods": "110", "ephemeral-storage": "500Gi"}


def dra_node_manifest(spec: DraNode, index: int) -> dict[str, Any]:
    """A kwok Node for ``spec`` (the devcluster gives it a pod network of its own band)."""
    entry = {"name": spec.name, "x-gpuspawner-class": spec.name, "allocatable": HOST, "labels": {DRA_NODE_LABEL: "true", **spec.labels}}
    return node_manifest(entry, 250 * 256 + index)


class SimulatedDriver:
    """Installs and removes the simulated driver's objects on a devcluster (``KubeHTTP``)."""

    def __init__(self, client: Any, nodes: Iterable[DraNode] = DRA_NODES, first_index: int = 0, classes: bool = True):
        """``first_index``: the first node's pod-network band (a second driver on the same cluster
        starts after the first's nodes); ``classes``: whether it installs and removes the DeviceClasses."""
        self.client = client
        self.nodes = tuple(nodes)
        self.first_index = first_index
        self.classes = classes

    def install(self, timeout: float = 60.0) -> None:
        """Create the device classes, the nodes (kwok makes them Ready) and one slice per node."""
        for obj in device_classes() if self.classes else ():
            self._create("/apis/resource.k8s.io/v1/deviceclasses", obj)
        for i, spec in enumerate(self.nodes, self.first_index):
            self._create_node(dra_node_manifest(spec, i))
            self.publish(
                spec.name, node_devices(spec), slice_count=spec.gpus if spec.dynamic_mig else 1, counter_sets=node_counter_sets(spec)
            )
        deadline = time.monotonic() + timeout
        while not all(self._ready(spec.name) for spec in self.nodes):
            if time.monotonic() > deadline:
                raise TimeoutError(f"simulated DRA nodes not Ready after {timeout:.0f}s (is kwok running?)")
            time.sleep(0.2)

    def publish(
        self,
        node: str,
        devices: list[dict[str, Any]],
        generation: int = 1,
        slice_count: int = 1,
        keep_old: bool = False,
        counter_sets: list[dict[str, Any]] | None = None,
    ) -> None:
        """Replace ``node``'s pool with ``slice_count`` slices of ``generation`` (a driver restart or re-layout).

        ``keep_old``: leave the older generation's slices in place, as between a real driver's
        publishing the new generation and its deleting the old one (only the newest counts).
        ``counter_sets``: partitionable devices' counter sets (:func:`resource_slices`).
        """
        if not keep_old:
            self._delete_slices(node)
        for obj in resource_slices(node, devices, generation, slice_count, counter_sets):
            self._create("/apis/resource.k8s.io/v1/resourceslices", obj)

    def uninstall(self) -> None:
        """Remove the slices, nodes and classes this driver made (pods on them first)."""
        for spec in self.nodes:
            self._delete_slices(spec.name)
            self._ignore_missing("DELETE", f"/api/v1/nodes/{spec.name}")
        for obj in device_classes() if self.classes else ():
            self._ignore_missing("DELETE", f"/apis/resource.k8s.io/v1/deviceclasses/{obj['metadata']['name']}")

    def set_device_condition(self, namespace: str, claim: str, condition: str = BOUND_CONDITION, status: str = "True") -> None:
        """Set ``condition`` on every allocated device of the claim's ``status.devices``, as a driver
        does once it has prepared (attached) them; the scheduler's PreBind reads it."""
        path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{claim}"
        obj = self.client.request("GET", path)
        results = (((obj.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        entry = {
            "type": condition,
            "status": status,
            "reason": "Simulated",
            "message": f"{condition} set by the simulated driver",
            "lastTransitionTime": now,
        }
        obj["status"]["devices"] = [
            {"driver": r["driver"], "pool": r["pool"], "device": r["device"], "conditions": [entry]} for r in results
        ]
        self.client.request("PUT", f"{path}/status", obj)

    def _delete_slices(self, node: str) -> None:
        self._ignore_missing("DELETE", f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName={node}")

    def _ready(self, node: str) -> bool:
        conditions = (self.client.request("GET", f"/api/v1/nodes/{node}").get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    def _create(self, path: str, obj: dict[str, Any]) -> None:
        try:
            self.client.request("POST", path, obj)
        except urllib.error.HTTPError as exc:
            if exc.code != 409:
                raise

    def _create_node(self, node: dict[str, Any]) -> None:
        """A node with a pod network of the cluster's own (see podnet); kept if it exists."""
        try:
            self.client.create_node(node)
        except urllib.error.HTTPError as exc:
            if exc.code != 409:
                raise

    def _ignore_missing(self, method: str, path: str) -> None:
        try:
            self.client.request(method, path)
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise
