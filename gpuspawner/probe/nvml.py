"""One pass over NVML through the ``nvidia-ml-py`` binding (``import pynvml``): every
GPU and MIG instance, its memory, the compute processes on it and, where NVML keeps
them, the processes' recent SM utilisation samples.

Nothing here raises an NVML error: every ``NVMLError`` becomes a :class:`Problem`
(which call, which device, which error class) next to what could still be read, so
a lost GPU, a driver that is not loaded, a MIG layout being changed or a call that
is "not supported" on a MIG setup never stop the other devices' numbers. A call an
older driver lacks (``FunctionNotFound``; the binding's unversioned process calls
then raise its ``NVMLLibraryMismatchError``) costs the numbers of that call only:
the process lists fall back from ``_v3`` to ``_v2``, a device without memory figures
still lists its processes, and a figure NVML does not know is None, never 0.

Per-process SM utilisation is kept in a window of fixed length (``window_s``): each
pass adds the samples NVML has taken since the newest one already kept and drops
those older than the window, and the figure is the window's highest. So what a pass
reports does not depend on when another pass ran: two scrapers, or a scraper and
someone with curl, see the same samples one scraper would. Passes are serialised
(one lock per reader).

Compute processes of MPS clients are listed apart by NVML
(``nvmlDeviceGetMPSComputeRunningProcesses``): they are read too, so a pod on an MPS
share is attributed its own processes rather than the MPS server's.
"""

from __future__ import annotations

import threading
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
    #: None where NVML could not say (the call failed, or this driver lacks it)
    total_bytes: int | None
    used_bytes: int | None
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
    #: pid -> highest SM utilisation (percent) in the samples of the window;
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


#: how long per-process SM samples are kept and reported over, seconds (docs/probe.md)
DEFAULT_WINDOW_S = 60.0

#: the process calls, newest first: an older driver lacks _v3 (FunctionNotFound)
COMPUTE_CALLS = ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2")
MPS_CALLS = ("nvmlDeviceGetMPSComputeRunningProcesses_v3", "nvmlDeviceGetMPSComputeRunningProcesses_v2")


class NvmlReader:
    """Reads NVML through ``nvml`` (the ``pynvml`` module). Keeps NVML initialised
    between passes and, per GPU, the SM samples of the last ``window_s`` seconds."""

    def __init__(self, nvml: ModuleType | None = None, clock: Callable[[], float] = time.time, window_s: float = DEFAULT_WINDOW_S) -> None:
        if nvml is None:
            import pynvml

            nvml = pynvml
        #: NVML's module: pynvml (untyped) or the tests' stand-in
        self.nvml: Any = nvml
        self.clock = clock
        self.window_s = window_s
        self.initialised = False
        #: per GPU UUID: (timestamp µs, pid, SM %) of the window, oldest first
        self._samples: dict[str, list[tuple[int, int, int]]] = {}
        self.lock = threading.Lock()
        self._errors: tuple[type[BaseException], ...] = tuple(
            e for e in (getattr(nvml, "NVMLError", None), getattr(nvml, "NVMLLibraryMismatchError", None)) if isinstance(e, type)
        )

    # -- calls -----------------------------------------------------------
    def _call(self, problems: list[Problem], where: tuple[str, str], name: str, *args: Any) -> Any:
        """``nvml.<name>(*args)``; on an NVML error record it and return the error."""
        try:
            return getattr(self.nvml, name)(*args)
        except self._errors as exc:
            return self._record(problems, where, name, exc)

    @staticmethod
    def _record(problems: list[Problem], where: tuple[str, str], name: str, exc: BaseException) -> BaseException:
        kind = type(exc).__name__
        error = "FunctionNotFound" if kind == "NVMLLibraryMismatchError" else kind.removeprefix("NVMLError_").removeprefix("NVMLError")
        problems.append(Problem(name.removesuffix("_v3").removesuffix("_v2"), error or "Unknown", str(exc), *where))
        return exc

    def _failed(self, value: Any) -> bool:
        return isinstance(value, self._errors)

    def _missing(self, value: Any) -> bool:
        return isinstance(value, self.nvml.NVMLError_FunctionNotFound)

    def _versions(self, problems: list[Problem], where: tuple[str, str], calls: tuple[str, ...], handle: Any) -> Any:
        """The first of ``calls`` this driver has (FunctionNotFound: try the next, older one)."""
        result: Any = None
        for name in calls:
            mark = len(problems)
            result = self._call(problems, where, name, handle)
            if not self._missing(result) or name == calls[-1]:
                return result
            del problems[mark:]  # an older call may answer: not a problem yet
        return result

    def shutdown(self) -> None:
        if self.initialised:
            try:
                self.nvml.nvmlShutdown()
            except self._errors:
                pass
            self.initialised = False

    # -- one pass ----------------------------------------------------------
    def read(self) -> Pass:
        with self.lock:
            return self._read()

    def _read(self) -> Pass:
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
            return []  # every series of a device is labelled by its UUID
        where = (str(index), _text(uuid))
        model = self._call(problems, where, "nvmlDeviceGetName", handle)
        model = "" if self._failed(model) else _text(model)
        mig = self._call(problems, where, "nvmlDeviceGetMigMode", handle)
        # NotSupported: a GPU without MIG (T4, A10, ...); FunctionNotFound: a driver from
        # before MIG. Neither is a problem worth a metric.
        if self._failed(mig):
            if isinstance(mig, self.nvml.NVMLError_NotSupported) or self._missing(mig):
                problems.pop()
            mig_on = False
        else:
            mig_on = mig[0] == self.nvml.NVML_DEVICE_MIG_ENABLE
        if mig_on:
            return self._mig_instances(index, _text(uuid), model, handle, problems)
        total, used = self._memory(problems, where, handle)
        device = Device(index, _text(uuid), model, total, used)
        reading = DeviceReading(device)
        procs = self._processes(problems, where, handle)
        if procs is not None:
            reading.processes = procs
            reading.sm_util = self._utilisation(handle, device.uuid, where, problems)
        return [reading]

    def _memory(self, problems: list[Problem], where: tuple[str, str], handle: Any) -> tuple[int | None, int | None]:
        memory = self._call(problems, where, "nvmlDeviceGetMemoryInfo", handle)
        if self._failed(memory):
            return None, None
        return int(memory.total), int(memory.used)

    def _processes(self, problems: list[Problem], where: tuple[str, str], handle: Any) -> list[Process] | None:
        """Compute processes and MPS client processes on ``handle`` (None: not known)."""
        procs = self._versions(problems, where, COMPUTE_CALLS, handle)
        if self._failed(procs):
            return None
        found = {int(p.pid): Process(int(p.pid), p.usedGpuMemory) for p in procs}
        mark = len(problems)
        clients = self._versions(problems, where, MPS_CALLS, handle)
        if self._failed(clients):
            if isinstance(clients, self.nvml.NVMLError_NotSupported):
                del problems[mark:]  # no MPS here
        else:
            for p in clients:
                found.setdefault(int(p.pid), Process(int(p.pid), p.usedGpuMemory))
        return list(found.values())

    def _utilisation(self, handle: Any, uuid: str, where: tuple[str, str], problems: list[Problem]) -> dict[int, int] | None:
        """Per-pid highest SM utilisation in the window's samples. New samples are asked for
        since the newest kept; NVML answers NotFound when there are none (every process idle)."""
        kept = self._samples.setdefault(uuid, [])
        since = kept[-1][0] if kept else 0
        try:
            samples = self.nvml.nvmlDeviceGetProcessUtilization(handle, since)
        except self.nvml.NVMLError_NotFound:
            samples = []
        except self.nvml.NVMLError_NotSupported:
            return None
        except self._errors as exc:
            self._record(problems, where, "nvmlDeviceGetProcessUtilization", exc)
            return None
        kept.extend(sorted((int(s.timeStamp), int(s.pid), int(s.smUtil)) for s in samples if int(s.timeStamp) > since))
        oldest = int((self.clock() - self.window_s) * 1e6)
        kept[:] = [s for s in kept if s[0] > oldest]
        util: dict[int, int] = {}
        for _, pid, sm in kept:
            util[pid] = max(util.get(pid, 0), sm)
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
            except self._errors as exc:
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
            procs = self._versions(problems, where, COMPUTE_CALLS, handle)
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
        # without these the instance cannot be labelled or its processes told apart
        for name in ("nvmlDeviceGetUUID", "nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId"):
            values[name] = self._call(problems, where, name, mig)
            if self._failed(values[name]):
                return None  # an instance being destroyed or created: next pass
        name_of = self._call(problems, where, "nvmlDeviceGetName", mig)
        total, used = self._memory(problems, where, mig)
        device = Device(
            index,
            uuid,
            model,
            total,
            used,
            mig_uuid=_text(values["nvmlDeviceGetUUID"]),
            profile="" if self._failed(name_of) else profile_of(_text(name_of)),
            gi=int(values["nvmlDeviceGetGpuInstanceId"]),
            ci=int(values["nvmlDeviceGetComputeInstanceId"]),
        )
        reading = DeviceReading(device)
        mark = len(problems)
        procs = self._versions(problems, where, COMPUTE_CALLS, mig)
        if isinstance(procs, self.nvml.NVMLError_NotSupported):
            del problems[mark:]
            return reading, True
        if self._failed(procs):
            return reading, False
        reading.processes = [Process(int(p.pid), p.usedGpuMemory) for p in procs]
        return reading, False
