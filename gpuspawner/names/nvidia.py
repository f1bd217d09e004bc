"""NVIDIA's device-plugin resource names and GPU Feature Discovery labels, in one place. Pure.

Spelled as NVIDIA's ``k8s-device-plugin`` (with GPU Feature Discovery) publishes them on
nodes: the extended resources a notebook pod asks for, and the node labels that tell what a
GPU node offers. Every module that needs them imports them from here -- the culler too, which
of gpuspawner reads only :mod:`gpuspawner.names` -- and none spells them again (tests keep
the literal strings on purpose: they check the real format). NVIDIA's DRA names are in
:mod:`gpuspawner.names.dranames`.
"""

from __future__ import annotations

#: Everything NVIDIA's device plugin advertises starts so (``nvidia.com/gpu``, ``nvidia.com/mig-...``, ``.shared``).
PLUGIN_PREFIX = "nvidia.com/"
#: A whole GPU, or a time-sliced or MPS share when the plugin's ``renameByDefault`` is false;
#: also the key of the taint GPU nodes carry.
GPU = "nvidia.com/gpu"
#: A time-sliced or MPS share when the plugin's ``renameByDefault`` is true.
GPU_SHARED = "nvidia.com/gpu.shared"
#: A MIG device, ``nvidia.com/mig-<profile>`` (the ``mixed`` MIG strategy).
MIG_PREFIX = "nvidia.com/mig-"

#: GPU Feature Discovery's node labels.
PRODUCT_LABEL = "nvidia.com/gpu.product"
#: Pods per GPU of a time-sliced or MPS node (the plugin's sharing ``replicas``).
REPLICAS_LABEL = "nvidia.com/gpu.replicas"
SHARING_LABEL = "nvidia.com/gpu.sharing-strategy"
MEMORY_LABEL = "nvidia.com/gpu.memory"
COUNT_LABEL = "nvidia.com/gpu.count"
MIG_STATE_LABEL = "nvidia.com/mig.config.state"
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
WORKLOAD_LABEL = "nvidia.com/gpu.workload.config"
VGPU_PRESENT_LABEL = "nvidia.com/vgpu.present"
#: The node's NVIDIA driver version, as GFD's version labeler splits it (``570.124.06`` -> ``570``,
#: ``124``, ``06``); GFD also writes the deprecated ``nvidia.com/cuda.driver.major/minor/rev``.
DRIVER_VERSION_LABELS = (
    "nvidia.com/cuda.driver-version.major",
    "nvidia.com/cuda.driver-version.minor",
    "nvidia.com/cuda.driver-version.revision",
)
DRIVER_VERSION_FULL_LABEL = "nvidia.com/cuda.driver-version.full"
#: The newest CUDA version the node's driver supports (NVML's ``cudaDriverGetVersion``, e.g. ``12``,
#: ``8``): GFD names it ``cuda.runtime-version`` although it is the driver's, not a runtime's.
CUDA_VERSION_LABELS = ("nvidia.com/cuda.runtime-version.major", "nvidia.com/cuda.runtime-version.minor")
CUDA_VERSION_FULL_LABEL = "nvidia.com/cuda.runtime-version.full"
#: The GPUs' CUDA compute capability (``8``, ``0`` for an A100).
COMPUTE_LABELS = ("nvidia.com/gpu.compute.major", "nvidia.com/gpu.compute.minor")


def is_device_resource(name: str) -> bool:
    """Whether an extended resource counts GPU devices one by one: a GPU, a share or a MIG device."""
    return name in (GPU, GPU_SHARED) or name.startswith(MIG_PREFIX)
