"""One pass over NVML through the ``nvidia-ml-py`` binding (``import pynvml``): every
GPU and MIG instance, its memory, the compute processes on it and, where NVML keeps
them, the processes' recent SM utilisation samples.

Nothing here raises an NVML error: every ``NVMLError`` becomes a :class:`Problem`
(which call, which device, which error class) next to what could still be read, so
a lost GPU, a driver that is not loaded, a MIG layout being changed or a call that
is "not supported" on a MIG setup never stop the other devices' numbers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

MIG_NAME_MARK = " MIG "


@dataclass(frozen=True)
class Device:
    """One GPU, or one MIG instance of one (``gi`` set)."""

    index: int
    uuid: str
    model: str
    total_bytes: int
    used_bytes: int
    #: MIG instance: its own UUID ("MIG-..."), profile ("3g.40gb"), GPU and compute instance IDs
    mig_uuid: str = ""
    profile: str = ""
    gi: int | None = None
    ci: int | None = None

    @property
    def mig(self) -> bool:
        return self.gi is not None


@dataclass(frozen=True)
class Process:
    pid: int
    #: None where NVML cannot say (its "not available" value)
    used_bytes: int | None


@dataclass
class DeviceReading:
    device: Device
    processes: list[Process] = field(default_factory=list)
    #: pid -> highest SM utilisation (percent) in the samples since the last pass;
    #: None: NVML keeps no per-process samples here (MIG instances, some drivers)
    sm_util: dict[int, int] | None = None


@dataclass(frozen=True)
class Problem:
    """An NVML call that failed: ``error`` is the binding's class name less ``NVMLError_``."""

    call: str
    error: str
    message: str
    gpu: str = ""
    uuid: str = ""


@dataclass
class Pass:
    """What one pass read."""

    up: bool
    readings: list[DeviceReading] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    gpus: int = 0


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def profile_of(mig_name: str) -> str:
    """``"NVIDIA H100 80GB HBM3 MIG 3g.40gb"`` -> ``"3g.40gb"`` (NVML names a MIG
    device after its parent and profile, as ``nvidia-smi -L`` prints it)."""
    _, mark, profile = mig_name.rpartition(MIG_NAME_MARK)
    return profile.strip() if mark else ""


class NvmlReader:
    """Reads NVML through ``nvml`` (the ``pynvml`` module). Keeps NVML initialised
    between passes and, per GPU, the time of the last utilisation sample read."""

    def __init__(self, nvml: ModuleType | None = None, clock: Callable[[], float] = time.time) -> None:
        if nvml is None:
            import pynvml as nvml
        self.nvml = nvml
        self.clock = clock
        self.initialised = False
        self._last_sample: dict[str, int] = {}

    # -- calls -----------------------------------------------------------
    def _call(self, problems: list[Problem], where: tuple[str, str], name: str, *args: Any) -> Any:
        """``nvml.<name>(*args)``; on an NVML error record it and return the error."""
        try:
            return getattr(self.nvml, name)(*args)
        except self.nvml.NVMLError as exc:
            return self._record(problems, where, name, exc)

    @staticmethod
    def _record(problems: list[Problem], where: tuple[str, str], name: str, exc: Exception) -> Exception:
        error = type(exc).__name__.removeprefix("NVMLError_").removeprefix("NVMLError") or "Unknown"
        problems.append(Problem(name, error, str(exc), *where))
        return exc

    def _failed(self, value: Any) -> bool:
        return isinstance(value, self.nvml.NVMLError)

    def shutdown(self) -> None:
        if self.initialised:
            try:
                self.nvml.nvmlShutdown()
            except self.nvml.NVMLError:
                pass
            self.initialised = False

    # -- one pass ----------------------------------------------------------
    def read(self) -> Pass:
        problems: list[Problem] = []
        if not self.initialised:
            if self._failed(self._call(problems, ("", ""), "nvmlInit")):
                return Pass(up=False, problems=problems)
            self.initialised = True
        count = self._call(problems, ("", ""), "nvmlDeviceGetCount")
        if self._failed(count):
            # a driver gone since nvmlInit: start again next pass
            self.shutdown()
            return Pass(up=False, problems=problems)
        result = Pass(up=True, problems=problems, gpus=count)
        for index in range(count):
            result.readings.extend(self._gpu(index, problems))
        return result

    def _gpu(self, index: int, problems: list[Problem]) -> list[DeviceReading]:
        where = (str(index), "")
        handle = self._call(problems, where, "nvmlDeviceGetHandleByIndex", index)
        if self._failed(handle):
            return []
        uuid = self._call(problems, where, "nvmlDeviceGetUUID", handle)
        if self._failed(uuid):
            return []
        where = (str(index), _text(uuid))
        model = self._call(problems, where, "nvmlDeviceGetName", handle)
        model = "" if self._failed(model) else _text(model)
        mig = self._call(problems, where, "nvmlDeviceGetMigMode", handle)
        # NotSupported: a GPU without MIG (T4, A10, ...), not a problem worth a metric
        if self._failed(mig):
            if isinstance(mig, self.nvml.NVMLError_NotSupported):
                problems.pop()
            mig_on = False
        else:
            mig_on = mig[0] == self.nvml.NVML_DEVICE_MIG_ENABLE
        if mig_on:
            return self._mig_instances(index, _text(uuid), model, handle, problems)
        memory = self._call(problems, where, "nvmlDeviceGetMemoryInfo", handle)
        if self._failed(memory):
            return []
        device = Device(index, _text(uuid), model, int(memory.total), int(memory.used))
        reading = DeviceReading(device)
        procs = self._call(problems, where, "nvmlDeviceGetComputeRunningProcesses", handle)
        if not self._failed(procs):
            reading.processes = [Process(int(p.pid), p.usedGpuMemory) for p in procs]
            reading.sm_util = self._utilisation(handle, device.uuid, where, problems)
        return [reading]

    def _utilisation(self, handle: Any, uuid: str, where: tuple[str, str], problems: list[Problem]) -> dict[int, int] | None:
        """Per-pid highest SM utilisation in the samples newer than the last pass's;
        NVML answers NotFound when there are none (every process idle): all zero."""
        since = self._last_sample.get(uuid, 0)
        try:
            samples = self.nvml.nvmlDeviceGetProcessUtilization(handle, since)
        except self.nvml.NVMLError_NotFound:
            return {}
        except self.nvml.NVMLError_NotSupported:
            return None
        except self.nvml.NVMLError as exc:
            self._record(problems, where, "nvmlDeviceGetProcessUtilization", exc)
            return None
        util: dict[int, int] = {}
        newest = since
        for s in samples:
            util[int(s.pid)] = max(util.get(int(s.pid), 0), int(s.smUtil))
            newest = max(newest, int(s.timeStamp))
        self._last_sample[uuid] = newest
        return util

    def _mig_instances(self, index: int, uuid: str, model: str, handle: Any, problems: list[Problem]) -> list[DeviceReading]:
        where = (str(index), uuid)
        slots = self._call(problems, where, "nvmlDeviceGetMaxMigDeviceCount", handle)
        if self._failed(slots):
            return []
        readings: list[DeviceReading] = []
        ask_parent: list[DeviceReading] = []
        for slot in range(slots):
            try:
                mig = self.nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except self.nvml.NVMLError_NotFound:
                continue  # an empty slot: fewer instances than the GPU could hold
            except self.nvml.NVMLError as exc:
                self._record(problems, where, "nvmlDeviceGetMigDeviceHandleByIndex", exc)
                continue
            got = self._mig_instance(index, uuid, model, mig, problems)
            if got is not None:
                readings.append(got[0])
                if got[1]:
                    ask_parent.append(got[0])
        # per-process data: on the MIG device where NVML gives it, else from the parent
        # (which lists every instance's processes with their GPU and compute instance)
        if ask_parent:
            procs = self._call(problems, where, "nvmlDeviceGetComputeRunningProcesses", handle)
            for r in ask_parent:
                if not self._failed(procs):
                    r.processes = [
                        Process(int(p.pid), p.usedGpuMemory)
                        for p in procs
                        if (p.gpuInstanceId, p.computeInstanceId) == (r.device.gi, r.device.ci)
                    ]
        return readings

    def _mig_instance(self, index: int, uuid: str, model: str, mig: Any, problems: list[Problem]) -> tuple[DeviceReading, bool] | None:
        """The instance's reading, and whether its processes must be read from the parent."""
        where = (str(index), uuid)
        values = {}
        for name in (
            "nvmlDeviceGetUUID",
            "nvmlDeviceGetName",
            "nvmlDeviceGetGpuInstanceId",
            "nvmlDeviceGetComputeInstanceId",
            "nvmlDeviceGetMemoryInfo",
        ):
            values[name] = self._call(problems, where, name, mig)
            if self._failed(values[name]):
                return None  # an instance being destroyed or created: next pass
        memory = values["nvmlDeviceGetMemoryInfo"]
        device = Device(
            index,
            uuid,
            model,
            int(memory.total),
            int(memory.used),
            mig_uuid=_text(values["nvmlDeviceGetUUID"]),
            profile=profile_of(_text(values["nvmlDeviceGetName"])),
            gi=int(values["nvmlDeviceGetGpuInstanceId"]),
            ci=int(values["nvmlDeviceGetComputeInstanceId"]),
        )
        reading = DeviceReading(device)
        try:
            procs = self.nvml.nvmlDeviceGetComputeRunningProcesses(mig)
        except self.nvml.NVMLError_NotSupported:
            return reading, True
        except self.nvml.NVMLError as exc:
            self._record(problems, where, "nvmlDeviceGetComputeRunningProcesses", exc)
            return reading, False
        reading.processes = [Process(int(p.pid), p.usedGpuMemory) for p in procs]
        return reading, False
