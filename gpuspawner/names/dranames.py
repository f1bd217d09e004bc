"""NVIDIA's Dynamic Resource Allocation names, in one place. Pure.

What NVIDIA's DRA driver (``k8s-dra-driver-gpu``) publishes and installs, spelled exactly as
its source does (``cmd/gpu-kubelet-plugin/deviceinfo.go`` and ``mig.go``, the Helm chart's
``templates/deviceclass-*.yaml``, ``api/nvidia.com/resource/v1beta1``), and the
``resource.k8s.io/v1`` words gpuspawner reads. Every other module imports these; none spells
them again (docs/architecture.md, "Dynamic Resource Allocation").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuspawner.names.nvidia import GPU

#: The Kubernetes API group and version of ResourceSlices, DeviceClasses and ResourceClaims.
RESOURCE_API = "resource.k8s.io/v1"

#: The driver name: ``spec.driver`` of its ResourceSlices, the prefix of its attribute names.
DRIVER = "gpu.nvidia.com"

#: The DeviceClasses the driver's chart installs.
CLASS_GPU = "gpu.nvidia.com"
CLASS_MIG = "mig.nvidia.com"
CLASS_VFIO = "vfio.gpu.nvidia.com"

#: The ``type`` attribute's values, which the device classes select on.
TYPE_GPU = "gpu"
TYPE_MIG = "mig"
TYPE_VFIO = "vfio"

#: The extended resource the gpu class maps to (``spec.extendedResourceName``, v1 only):
#: a pod asking for ``nvidia.com/gpu`` may then be served by a DRA GPU.
EXTENDED_RESOURCE = GPU

#: Attribute names (unqualified: the driver publishes them under its own domain).
ATTR_TYPE = "type"
ATTR_UUID = "uuid"
ATTR_PRODUCT = "productName"
ATTR_BRAND = "brand"
ATTR_ARCHITECTURE = "architecture"
ATTR_COMPUTE_CAPABILITY = "cudaComputeCapability"
ATTR_DRIVER_VERSION = "driverVersion"
ATTR_CUDA_DRIVER_VERSION = "cudaDriverVersion"
ATTR_PROFILE = "profile"
ATTR_PARENT_UUID = "parentUUID"
#: Kubernetes' own attribute (``k8s.io/dynamic-resource-allocation/deviceattribute``), fully qualified.
ATTR_PCI_BUS_ID = "resource.kubernetes.io/pciBusID"

#: Capacity names: ``memory`` in bytes on whole GPUs and MIG devices; MIG devices also
#: publish their engines and one ``memorySlice<N>`` per memory slice they occupy.
CAP_MEMORY = "memory"
CAP_MULTIPROCESSORS = "multiprocessors"
MIG_ENGINE_CAPACITIES = ("copyEngines", "decoders", "encoders", "jpegEngines", "ofaEngines")

#: The opaque configuration the driver reads from a claim's ``config[].opaque.parameters``.
CONFIG_API_VERSION = "resource.nvidia.com/v1beta1"
KIND_GPU_CONFIG = "GpuConfig"
KIND_MIG_CONFIG = "MigDeviceConfig"
SHARING_TIME_SLICING = "TimeSlicing"
SHARING_MPS = "MPS"
SHARING_STRATEGIES = (SHARING_TIME_SLICING, SHARING_MPS)
#: ``timeSlicingConfig.interval`` values.
TIME_SLICE_INTERVALS = ("Default", "Short", "Medium", "Long")


def qualified(attribute: str) -> str:
    """``productName`` -> ``gpu.nvidia.com/productName`` (what ``matchAttribute`` and CEL's map keys use)."""
    return attribute if "/" in attribute else f"{DRIVER}/{attribute}"


def gpu_device_name(minor: int) -> str:
    """A whole GPU's device name in its ResourceSlice (``gpu-<minor>``)."""
    return f"gpu-{minor}"


def mig_device_name(parent_minor: int, profile: str, profile_id: int, placement_start: int) -> str:
    """A static MIG device's name: ``gpu-<minor>-mig-<profile without dots>-<GI profile id>-<placement start>``.

    As the driver's ``MigSpecTuple.ToCanonicalName``: ``1g.5gb`` becomes ``1g5gb`` and ``+``
    becomes ``-`` (``1g.10gb+me`` -> ``1g10gb-me``).
    """
    name = profile.replace(".", "").lower().replace("+", "-")
    return f"gpu-{parent_minor}-mig-{name}-{profile_id}-{placement_start}"


def sharing_config(strategy: str, settings: Mapping[str, Any] | None = None, mig: bool = False) -> dict[str, Any]:
    """The driver's opaque parameters for a shared device: ``GpuConfig`` (``MigDeviceConfig`` for MIG).

    ``settings``: ``timeSlicingConfig`` for time-slicing (``interval``), ``mpsConfig`` for MPS
    (``defaultActiveThreadPercentage``, ``defaultPinnedDeviceMemoryLimit``).
    """
    sharing: dict[str, Any] = {"strategy": strategy}
    if settings:
        key = "mpsConfig" if strategy == SHARING_MPS else "timeSlicingConfig"
        sharing[key] = dict(settings)
    return {"apiVersion": CONFIG_API_VERSION, "kind": KIND_MIG_CONFIG if mig else KIND_GPU_CONFIG, "sharing": sharing}


#: The pod condition kube-controller-manager's device taint eviction controller sets before it
#: deletes a pod whose claim's device has a NoExecute taint the claim does not tolerate
#: (pkg/controller/devicetainteviction, Kubernetes 1.36 and 1.37: type DisruptionTarget,
#: reason DeletionByDeviceTaintManager; the controller is ``device-taint-eviction-controller``).
DISRUPTION_TARGET = "DisruptionTarget"
DEVICE_TAINT_EVICTION = "DeletionByDeviceTaintManager"
#: The other ``DisruptionTarget`` reasons (k8s.io/api/core/v1: PodReasonPreemptionByScheduler, ...)
#: and the kubelet's own ``Evicted``: why a pod left the cluster (core.noticewords, hub.departures).
EVICTION_API = "EvictionByEvictionAPI"
POD_GC = "DeletionByPodGC"
TAINT_MANAGER = "DeletionByTaintManager"
PREEMPTED = "PreemptionByScheduler"
KUBELET = "TerminationByKubelet"
KUBELET_EVICTED = "Evicted"
