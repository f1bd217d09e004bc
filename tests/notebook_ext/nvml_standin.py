"""A stand-in for NVIDIA's management library (libnvidia-ml.so.1) for the GPU view's tests.

There is no GPU here, so the one thing replaced is the shared library itself: pynvml (the
real ``nvidia-ml-py``) loads ``libnvidia-ml.so.1`` into ``pynvml.nvmlLib`` and calls its C
functions with ctypes arguments. :class:`StandInLib` is put there instead and answers those
calls as the C library does: it fills the ctypes structures pynvml passes by reference
(``c_nvmlMemory_t``, ``c_nvmlUtilization_t``, device handles) and returns NVML's return
codes, which pynvml's own code turns into its real ``NVMLError_*`` exceptions. Everything
above the library (pynvml's wrappers, error classes, the extension) is the real code.

A GPU in MIG mode answers as NVML does inside a container given one MIG device: the parent
GPU, MIG mode on, and one MIG device handle (others NOT_FOUND); MIG devices report no
utilisation (NOT_SUPPORTED).

Load it into a real server with :func:`install` (e.g. from a jupyter_server_config.py).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import pynvml

GIB = 2**30


@dataclass
class Gpu:
    name: str
    uuid: str
    total: int
    used: int
    utilization: int | None = None  # None: NOT_SUPPORTED
    mig: list[Gpu] = field(default_factory=list)  # the MIG devices this container sees


class StandInLib:
    """libnvidia-ml.so.1's C functions for the GPUs given (ctypes in, return codes out)."""

    def __init__(self, gpus: list[Gpu], init_error: int = pynvml.NVML_SUCCESS) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.calls: list[str] = []
        self._handles: dict[int, tuple[Gpu, bool]] = {}  # address -> (gpu, is a MIG device)
        self._structs: list[pynvml.struct_c_nvmlDevice_t] = []

    def __getattr__(self, name: str):
        raise AttributeError(name)  # pynvml turns this into NVMLError_FunctionNotFound

    def _handle(self, gpu: Gpu, mig: bool, out) -> None:
        struct = pynvml.struct_c_nvmlDevice_t()
        self._structs.append(struct)
        self._handles[ctypes.addressof(struct)] = (gpu, mig)
        out._obj.contents = struct

    def _gpu(self, handle) -> tuple[Gpu, bool]:
        return self._handles[ctypes.addressof(handle.contents)]

    def nvmlInitWithFlags(self, flags):
        self.calls.append("init")
        return self.init_error

    def nvmlShutdown(self):
        return pynvml.NVML_SUCCESS

    def nvmlErrorString(self, code):
        return b"stand-in NVML error %d" % code

    def nvmlDeviceGetCount_v2(self, count):
        count._obj.value = len(self.gpus)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetHandleByIndex_v2(self, index, device):
        if index.value >= len(self.gpus):
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        self._handle(self.gpus[index.value], False, device)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetMigMode(self, device, current, pending):
        gpu, _ = self._gpu(device)
        if not gpu.mig:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        current._obj.value = pending._obj.value = pynvml.NVML_DEVICE_MIG_ENABLE
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetMaxMigDeviceCount(self, device, count):
        count._obj.value = 7
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device, index, mig_device):
        gpu, _ = self._gpu(device)
        if index.value >= len(gpu.mig):
            return pynvml.NVML_ERROR_NOT_FOUND
        self._handle(gpu.mig[index.value], True, mig_device)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetName(self, device, buffer, size):
        buffer.value = self._gpu(device)[0].name.encode()[: size.value - 1]
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetUUID(self, device, buffer, size):
        buffer.value = self._gpu(device)[0].uuid.encode()[: size.value - 1]
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetMemoryInfo(self, device, memory):
        gpu, _ = self._gpu(device)
        memory._obj.total, memory._obj.used, memory._obj.free = gpu.total, gpu.used, gpu.total - gpu.used
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetUtilizationRates(self, device, utilization):
        gpu, mig = self._gpu(device)
        if mig or gpu.utilization is None:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        utilization._obj.gpu, utilization._obj.memory = gpu.utilization, 0
        return pynvml.NVML_SUCCESS


def install(lib: StandInLib) -> StandInLib:
    """Make pynvml call ``lib`` instead of loading libnvidia-ml.so.1."""
    pynvml._nvmlGetFunctionPointer_cache.clear()
    pynvml.nvmlLib = lib
    return lib


def uninstall() -> None:
    """pynvml as imported: it will look for libnvidia-ml.so.1 again."""
    pynvml._nvmlGetFunctionPointer_cache.clear()
    pynvml.nvmlLib = None


#: A MIG 1g.10gb slice of an A100 80GB, as its container sees it.
MIG_1G_10GB = [
    Gpu(
        "NVIDIA A100-SXM4-80GB",
        "GPU-5f3c0000-aaaa-bbbb-cccc-000000000001",
        80 * GIB,
        0,
        mig=[Gpu("NVIDIA A100-SXM4-80GB MIG 1g.10gb", "MIG-7d1e0000-aaaa-bbbb-cccc-000000000002", 10 * GIB, int(3.1 * GIB))],
    )
]
#: Two whole H100s.
TWO_H100 = [
    Gpu("NVIDIA H100 80GB HBM3", "GPU-11110000-aaaa-bbbb-cccc-000000000001", 80 * GIB, 20 * GIB, utilization=87),
    Gpu("NVIDIA H100 80GB HBM3", "GPU-22220000-aaaa-bbbb-cccc-000000000002", 80 * GIB, 0, utilization=0),
]
