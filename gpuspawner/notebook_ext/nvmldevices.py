"""GPU memory and utilisation of the devices this container sees, through NVML.

NVML (``nvidia-ml-py``, imported as ``pynvml``) answers for exactly the devices the
device plugin gave the container: a whole GPU, or on a MIG node the parent GPU with only
this container's MIG device under it. A MIG device is reported on its own (its memory is
the slice's); NVML reports no utilisation for MIG devices, so theirs is ``None``.

Without NVML (no ``nvidia-ml-py``, no ``libnvidia-ml.so.1`` in the image, no driver, a CPU
offering) the answer is :class:`Unavailable` with the reason in words, never an error:
the notebook then shows the offering and the culler's view without GPU figures.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

#: Seconds before a failed NVML start is tried again (a driver may come up after the pod).
RETRY_SECONDS = 60.0


@dataclass(frozen=True)
class Device:
    """One device's figures, as ``GET .../status`` lists them."""

    index: int
    name: str
    uuid: str
    memory_used_bytes: int
    memory_total_bytes: int
    utilization_percent: int | None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Unavailable:
    """Why there are no GPU figures."""

    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"unavailable": self.reason}


class Devices:
    """Reads NVML; starts it once (again at most every :data:`RETRY_SECONDS` after a failure).

    Calls are short blocking C calls: the handler runs :meth:`read` in a thread, and a lock
    keeps two reads from starting NVML twice.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._started = False
        self._failed_at: float | None = None
        self._failure = ""

    def read(self) -> list[Device] | Unavailable:
        """The devices' figures now, or why there are none."""
        try:
            import pynvml
        except ImportError:
            return Unavailable("nvidia-ml-py is not installed in this image (pip install 'gpuspawner[notebook]')")
        with self._lock:
            problem = self._start(pynvml)
            if problem:
                return Unavailable(problem)
            try:
                return _devices(pynvml)
            except pynvml.NVMLError as e:
                return Unavailable(f"NVML could not read the GPU: {e}")

    def _start(self, pynvml: Any) -> str:
        if self._started:
            return ""
        if self._failed_at is not None and time.monotonic() - self._failed_at < RETRY_SECONDS:
            return self._failure
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound:
            self._failure = "NVIDIA's management library (libnvidia-ml.so.1) is not in this container: no GPU driver here"
        except pynvml.NVMLError as e:
            self._failure = f"NVML did not start: {e}"
        else:
            self._started = True
            return ""
        self._failed_at = time.monotonic()
        return self._failure


def _devices(pynvml: Any) -> list[Device]:
    out: list[Device] = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(i)
        migs = _mig_devices(pynvml, handle)
        if migs:
            out.extend(_figures(pynvml, len(out), mig, utilization=False) for mig in migs)
        else:
            out.append(_figures(pynvml, len(out), handle, utilization=True))
    return out


def _mig_devices(pynvml: Any, handle: Any) -> list[Any]:
    """The MIG devices under ``handle`` this container sees; [] when MIG is off or unsupported."""
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError_NotSupported:
        return []
    if current != pynvml.NVML_DEVICE_MIG_ENABLE:
        return []
    found = []
    for j in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            found.append(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, j))
        except pynvml.NVMLError_NotFound:
            continue  # an empty slot, or another container's slice
    return found


def _figures(pynvml: Any, index: int, handle: Any, utilization: bool) -> Device:
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    percent: int | None = None
    if utilization:
        try:
            percent = int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except pynvml.NVMLError_NotSupported:
            percent = None
    return Device(
        index=index,
        name=_text(pynvml.nvmlDeviceGetName(handle)),
        uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
        memory_used_bytes=int(memory.used),
        memory_total_bytes=int(memory.total),
        utilization_percent=percent,
    )


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value
