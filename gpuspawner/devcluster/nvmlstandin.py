"""An NVML stand-in: ``libnvidia-ml.so.1`` for GPUs that are not here.

There is no NVIDIA GPU or driver on the machines that run the tests, the demo and the
benchmarks, so nothing can load the real NVML. This replaces the *library* under the
``nvidia-ml-py`` binding (``pynvml.nvmlLib``): every C function the probe reaches is a
Python function that takes the binding's own ctypes arguments (``byref`` structs,
string buffers, arrays of ``c_nvmlProcessInfo_v3_t`` and
``c_nvmlProcessUtilizationSample_t``), fills them the way the C library does, and
returns NVML's return codes. The binding's Python layer runs unchanged: it sizes the
arrays, retries on ``NVML_ERROR_INSUFFICIENT_SIZE``, turns codes into its own
exception classes (``NVMLError_NotSupported``, ``NVMLError_GpuIsLost`` ...) and
builds the objects the probe reads. A function the stand-in lacks, or one named in
``FakeNvmlLib.missing`` (an older driver), is ``NVMLError_FunctionNotFound``, as the
binding raises it when ``libnvidia-ml.so.1`` has no such symbol; the binding's unversioned
wrappers then raise its ``NVMLLibraryMismatchError``, as with a real old driver.

Per-process SM samples are kept the way NVML keeps them: a buffer of timestamped samples,
one per busy process every :data:`SAMPLE_PERIOD_S` of the lib's ``clock``, of which
``nvmlDeviceGetProcessUtilization`` returns those newer than the caller's timestamp. So a
reader that asks "since my last call" sees each sample once, as with the real library.

What a GPU holds (processes, their memory and SM utilisation, MIG instances, injected
errors) is plain data the caller changes at any time. :func:`cgroup_line` and
:class:`ProcTree` write ``/proc/<pid>/cgroup`` files the way containerd, CRI-O and the
cgroupfs driver name a container's cgroup.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pynvml

#: NVML's return codes and values the stand-in answers with: the binding's own constants, typed
#: (the binding has no type hints).
DEVICE_MIG_ENABLE: int = pynvml.NVML_DEVICE_MIG_ENABLE
ERROR_INSUFFICIENT_SIZE: int = pynvml.NVML_ERROR_INSUFFICIENT_SIZE
ERROR_INVALID_ARGUMENT: int = pynvml.NVML_ERROR_INVALID_ARGUMENT
ERROR_NOT_FOUND: int = pynvml.NVML_ERROR_NOT_FOUND
ERROR_NOT_SUPPORTED: int = pynvml.NVML_ERROR_NOT_SUPPORTED
ERROR_UNINITIALIZED: int = pynvml.NVML_ERROR_UNINITIALIZED
SUCCESS: int = pynvml.NVML_SUCCESS
VALUE_NOT_AVAILABLE: int = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value

GIB = 1 << 30
#: what the driver keeps on a GPU with no process (context-less reserve), bytes
RESERVED = 300 << 20
#: how often the stand-in's "driver" samples a busy process's SM utilisation, seconds
SAMPLE_PERIOD_S = 1.0
#: how many samples it keeps per GPU (NVML's buffer is finite too)
SAMPLE_BUFFER = 1000


@dataclass
class FakeProcess:
    pid: int
    #: None: NVML does not know (the binding's "not available" value is written)
    used_bytes: int | None
    #: SM utilisation (percent) the driver samples while it runs; 0: no sample (an idle process)
    sm_util: int = 0


@dataclass
class FakeMig:
    """One MIG instance (a GPU instance with one compute instance)."""

    uuid: str
    profile: str
    gi: int
    ci: int
    total_bytes: int
    processes: list[FakeProcess] = field(default_factory=list)


@dataclass
class FakeGpu:
    uuid: str
    name: str
    total_bytes: int
    processes: list[FakeProcess] = field(default_factory=list)
    #: None: a GPU without MIG (GetMigMode is NotSupported); a list: MIG enabled
    migs: list[FakeMig] | None = None
    max_mig: int = 7
    #: MIG devices answer NotSupported to per-process queries (read them from the parent)
    mig_processes_on_parent_only: bool = False
    #: C function name -> NVML return code this GPU's handles answer it with
    errors: dict[str, int] = field(default_factory=dict)
    #: MPS client processes (NVML lists them apart: nvmlDeviceGetMPSComputeRunningProcesses);
    #: the MPS server itself is one of ``processes``
    mps_processes: list[FakeProcess] = field(default_factory=list)
    #: the driver's sample buffer: (timestamp in µs, pid, SM %), oldest first
    samples: list[tuple[int, int, int]] = field(default_factory=list)
    sampled_until_us: int | None = None


def _set_uint(ref: Any, value: int) -> None:
    ref._obj.value = value


def _handle_value(handle: Any) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


def _set_handle(ref: Any, value: int) -> None:
    ctypes.cast(ctypes.pointer(ref._obj), ctypes.POINTER(ctypes.c_void_p)).contents.value = value


def _used(value: int | None) -> int:
    return VALUE_NOT_AVAILABLE if value is None else value


def _put_string(buf: Any, size: Any, text: str) -> int:
    data = text.encode()
    if len(data) + 1 > int(getattr(size, "value", size)):
        return ERROR_INSUFFICIENT_SIZE
    buf.value = data
    return SUCCESS


class FakeNvmlLib:
    """The C library's functions, by their C names, over ``gpus``."""

    def __init__(self, gpus: list[FakeGpu] | None = None, clock: Callable[[], float] = time.time) -> None:
        self.gpus: list[FakeGpu] = list(gpus or [])
        #: nvmlInitWithFlags answers this (e.g. NVML_ERROR_DRIVER_NOT_LOADED); 0: success
        self.init_error = 0
        self.lock = threading.Lock()
        self.calls = 0
        #: C functions this "driver" does not have (an older driver): FunctionNotFound
        self.missing: set[str] = set()
        #: the driver's clock for sample timestamps, seconds
        self.clock = clock

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("nvml") and name in object.__getattribute__(self, "missing"):
            raise AttributeError(name)  # what ctypes says for a symbol the library lacks
        return object.__getattribute__(self, name)

    # -- handles: (gpu index + 1) << 8 | (MIG slot + 1) -------------------------
    def _device(self, handle: Any) -> tuple[FakeGpu, FakeMig | None] | int:
        value = _handle_value(handle)
        gpu_index, slot = (value >> 8) - 1, (value & 0xFF) - 1
        if not 0 <= gpu_index < len(self.gpus):
            return ERROR_INVALID_ARGUMENT
        gpu = self.gpus[gpu_index]
        if slot < 0:
            return gpu, None
        if gpu.migs is None or slot >= len(gpu.migs):
            return ERROR_INVALID_ARGUMENT
        return gpu, gpu.migs[slot]

    def _on(self, name: str, handle: Any) -> tuple[FakeGpu, FakeMig | None] | int:
        self.calls += 1
        found = self._device(handle)
        if isinstance(found, int):
            return found
        code = found[0].errors.get(name, 0)
        return code or found

    # -- library ------------------------------------------------------------
    def nvmlInitWithFlags(self, flags: int) -> int:  # noqa: N802 (NVML's C names)
        return self.init_error

    def nvmlShutdown(self) -> int:  # noqa: N802
        return SUCCESS

    def nvmlDeviceGetCount_v2(self, count: Any) -> int:  # noqa: N802
        self.calls += 1
        if self.init_error:
            return ERROR_UNINITIALIZED
        _set_uint(count, len(self.gpus))
        return SUCCESS

    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, device: Any) -> int:  # noqa: N802
        self.calls += 1
        i = int(getattr(index, "value", index))
        if not 0 <= i < len(self.gpus):
            return ERROR_INVALID_ARGUMENT
        code = self.gpus[i].errors.get("nvmlDeviceGetHandleByIndex_v2", 0)
        if code:
            return code
        _set_handle(device, (i + 1) << 8)
        return SUCCESS

    # -- per device -----------------------------------------------------------
    def nvmlDeviceGetUUID(self, handle: Any, buf: Any, size: Any) -> int:  # noqa: N802
        found = self._on("nvmlDeviceGetUUID", handle)
        if isinstance(found, int):
            return found
        gpu, mig = found
        return _put_string(buf, size, mig.uuid if mig else gpu.uuid)

    def nvmlDeviceGetName(self, handle: Any, buf: Any, size: Any) -> int:  # noqa: N802
        found = self._on("nvmlDeviceGetName", handle)
        if isinstance(found, int):
            return found
        gpu, mig = found
        return _put_string(buf, size, f"{gpu.name} MIG {mig.profile}" if mig else gpu.name)

    def nvmlDeviceGetMigMode(self, handle: Any, current: Any, pending: Any) -> int:  # noqa: N802
        found = self._on("nvmlDeviceGetMigMode", handle)
        if isinstance(found, int):
            return found
        gpu, mig = found
        if gpu.migs is None or mig is not None:
            return ERROR_NOT_SUPPORTED
        _set_uint(current, DEVICE_MIG_ENABLE)
        _set_uint(pending, DEVICE_MIG_ENABLE)
        return SUCCESS

    def nvmlDeviceGetMemoryInfo(self, handle: Any, memory: Any) -> int:  # noqa: N802
        found = self._on("nvmlDeviceGetMemoryInfo", handle)
        if isinstance(found, int):
            return found
        gpu, mig = found
        if mig is not None:
            total, procs = mig.total_bytes, mig.processes
        else:
            total, procs = gpu.total_bytes, [*(p for p, _ in self._all_processes(gpu)), *gpu.mps_processes]
        used = min(total, RESERVED + sum(p.used_bytes or 0 for p in procs))
        struct = memory._obj
        struct.total, struct.used, struct.free = total, used, total - used
        return SUCCESS

    @staticmethod
    def _all_processes(gpu: FakeGpu) -> list[tuple[FakeProcess, FakeMig | None]]:
        out: list[tuple[FakeProcess, FakeMig | None]] = [(p, None) for p in gpu.processes]
        for mig in gpu.migs or []:
            out.extend((p, mig) for p in mig.processes)
        return out

    def _list_processes(self, name: str, handle: Any, count: Any, infos: Any, mps: bool = False) -> int:
        found = self._on(name, handle)
        if isinstance(found, int):
            return found
        gpu, mig = found
        if mig is not None and gpu.mig_processes_on_parent_only:
            return ERROR_NOT_SUPPORTED
        procs: list[tuple[FakeProcess, FakeMig | None]]
        if mps:
            procs = [] if mig is not None else [(p, None) for p in gpu.mps_processes]
        else:
            procs = [(p, mig) for p in mig.processes] if mig is not None else self._all_processes(gpu)
        room = count._obj.value
        _set_uint(count, len(procs))
        if not procs:
            return SUCCESS
        if infos is None or room < len(procs):
            return ERROR_INSUFFICIENT_SIZE
        for i, (p, where) in enumerate(procs):
            infos[i].pid = p.pid
            infos[i].usedGpuMemory = _used(p.used_bytes)
            # on a MIG-enabled GPU the instance IDs; otherwise NVML's "invalid" 0xFFFFFFFF
            infos[i].gpuInstanceId = where.gi if where else 0xFFFFFFFF
            infos[i].computeInstanceId = where.ci if where else 0xFFFFFFFF
        return SUCCESS

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any, count: Any, infos: Any) -> int:  # noqa: N802
        return self._list_processes("nvmlDeviceGetComputeRunningProcesses_v3", handle, count, infos)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Any, count: Any, infos: Any) -> int:  # noqa: N802
        return self._list_processes("nvmlDeviceGetComputeRunningProcesses_v2", handle, count, infos)

    def nvmlDeviceGetMPSComputeRunningProcesses_v3(self, handle: Any, count: Any, infos: Any) -> int:  # noqa: N802
        return self._list_processes("nvmlDeviceGetMPSComputeRunningProcesses_v3", handle, count, infos, mps=True)

    def nvmlDeviceGetMPSComputeRunningProcesses_v2(self, handle: Any, count: Any, infos: Any) -> int:  # noqa: N802
        return self._list_processes("nvmlDeviceGetMPSComputeRunningProcesses_v2", handle, count, infos, mps=True)

    def _sample(self, gpu: FakeGpu) -> None:
        """The driver's sampler: one sample per busy process every SAMPLE_PERIOD_S up to now."""
        now_us = int(self.clock() * 1e6)
        step = int(SAMPLE_PERIOD_S * 1e6)
        if gpu.sampled_until_us is None:
            gpu.sampled_until_us = now_us - step
        tick = gpu.sampled_until_us + step
        while tick <= now_us:
            gpu.samples.extend((tick, p.pid, p.sm_util) for p in [*gpu.processes, *gpu.mps_processes] if p.sm_util > 0)
            gpu.sampled_until_us = tick
            tick += step
        del gpu.samples[:-SAMPLE_BUFFER]

    def nvmlDeviceGetProcessUtilization(self, handle: Any, samples: Any, count: Any, since: Any) -> int:  # noqa: N802
        found = self._on("nvmlDeviceGetProcessUtilization", handle)
        if isinstance(found, int):
            return found
        gpu, mig = found
        if mig is not None or gpu.migs is not None:
            return ERROR_NOT_SUPPORTED
        self._sample(gpu)
        newer = [s for s in gpu.samples if s[0] > int(since.value)]
        if not newer:
            return ERROR_NOT_FOUND
        room = count._obj.value
        _set_uint(count, len(newer))
        if samples is None or room < len(newer):
            return ERROR_INSUFFICIENT_SIZE
        for i, (stamp, pid, sm) in enumerate(newer):
            samples[i].pid, samples[i].timeStamp, samples[i].smUtil = pid, stamp, sm
            samples[i].memUtil = samples[i].encUtil = samples[i].decUtil = 0
        return SUCCESS

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any, count: Any) -> int:  # noqa: N802
        found = self._on("nvmlDeviceGetMaxMigDeviceCount", handle)
        if isinstance(found, int):
            return found
        gpu, _ = found
        _set_uint(count, gpu.max_mig if gpu.migs is not None else 0)
        return SUCCESS

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: Any, mig: Any) -> int:  # noqa: N802
        found = self._on("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if isinstance(found, int):
            return found
        gpu, _ = found
        slot = int(getattr(index, "value", index))
        if gpu.migs is None or slot >= len(gpu.migs):
            return ERROR_NOT_FOUND
        _set_handle(mig, (self.gpus.index(gpu) + 1) << 8 | (slot + 1))
        return SUCCESS

    def _instance_id(self, name: str, handle: Any, out: Any, attr: str) -> int:
        found = self._on(name, handle)
        if isinstance(found, int):
            return found
        _, mig = found
        if mig is None:
            return ERROR_INVALID_ARGUMENT
        _set_uint(out, getattr(mig, attr))
        return SUCCESS

    def nvmlDeviceGetGpuInstanceId(self, handle: Any, out: Any) -> int:  # noqa: N802
        return self._instance_id("nvmlDeviceGetGpuInstanceId", handle, out, "gi")

    def nvmlDeviceGetComputeInstanceId(self, handle: Any, out: Any) -> int:  # noqa: N802
        return self._instance_id("nvmlDeviceGetComputeInstanceId", handle, out, "ci")


@contextmanager
def installed(lib: FakeNvmlLib, nvml: Any = pynvml) -> Iterator[ModuleType]:
    """``nvml`` (the ``pynvml`` module, whose private library handle is replaced: Any) talking to ``lib``
    instead of libnvidia-ml.so.1."""
    saved = nvml.nvmlLib, dict(nvml._nvmlGetFunctionPointer_cache)
    nvml.nvmlLib = lib
    nvml._nvmlGetFunctionPointer_cache.clear()
    try:
        yield nvml
    finally:
        nvml.nvmlLib = saved[0]
        nvml._nvmlGetFunctionPointer_cache.clear()
        nvml._nvmlGetFunctionPointer_cache.update(saved[1])


# --------------------------------------------------------------------------- /proc


def cgroup_line(pod_uid: str, container_id: str, *, runtime: str = "containerd", driver: str = "systemd", qos: str = "burstable") -> str:
    """The cgroup path of a container, as the kubelet and the runtime name it."""
    if driver == "cgroupfs":
        tier = "" if qos == "guaranteed" else f"/{qos}"
        return f"/kubepods{tier}/pod{pod_uid}/{container_id}"
    uid = pod_uid.replace("-", "_")
    prefix = {"containerd": "cri-containerd", "cri-o": "crio", "docker": "docker"}[runtime]
    if qos == "guaranteed":
        return f"/kubepods.slice/kubepods-pod{uid}.slice/{prefix}-{container_id}.scope"
    return f"/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{uid}.slice/{prefix}-{container_id}.scope"


V1_CONTROLLERS = ("12:pids", "11:memory", "10:devices", "9:cpu,cpuacct", "1:name=systemd")


class ProcTree:
    """A ``/proc`` with ``<pid>/cgroup`` files, as the probe reads the host's."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def add(self, pid: int, path: str, *, cgroup_version: int = 2, namespaced: bool = False) -> None:
        """Process ``pid`` in cgroup ``path``. ``namespaced``: as seen from a container in its
        own cgroup namespace (cgroup v2: the path climbs out of it with ``/..``)."""
        if namespaced:
            path = "/../../.." + path
        text = f"0::{path}\n" if cgroup_version == 2 else "".join(f"{c}:{path}\n" for c in V1_CONTROLLERS) + "0::/\n"
        folder = self.root / str(pid)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "cgroup").write_text(text)

    def remove(self, pid: int) -> None:
        folder = self.root / str(pid)
        (folder / "cgroup").unlink(missing_ok=True)
        folder.rmdir()
