"""The probe's Prometheus metrics: one NVML pass per scrape, each process mapped to its
pod and container through its cgroup, summed per container and device.

Device labels are dcgm-exporter's (``Hostname``, ``gpu``, ``UUID``, ``modelName``,
``GPU_I_PROFILE``, ``GPU_I_ID``) plus ``GPU_CI_ID``, so a probe series and the
exporter's series of the same device join on the same labels (the culler does).
Pod labels are ``namespace``, ``pod``, ``container`` and ``pod_uid``; a pod the probe
cannot name (outside the namespaces it may list) keeps its UID only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuspawner.names.vocabulary import PROBE_DEVICE_TOTAL, PROBE_POD_MEMORY, PROBE_POD_SM_UTIL
from gpuspawner.probe.cgroup import PodRef, pod_of
from gpuspawner.probe.nvml import Device, NvmlReader, Pass, Problem
from gpuspawner.probe.pods import PodDirectory

log = logging.getLogger("gpuspawner.probe")

PREFIX = "gpuspawner_probe_"
POD_MEMORY = PROBE_POD_MEMORY
POD_PROCESSES = PREFIX + "pod_gpu_processes"
POD_SM_UTIL = PROBE_POD_SM_UTIL
DEVICE_TOTAL = PROBE_DEVICE_TOTAL
DEVICE_USED = PREFIX + "device_memory_used_bytes"
DEVICE_UNATTRIBUTED = PREFIX + "device_unattributed_memory_bytes"
NVML_UP = PREFIX + "nvml_up"
NVML_ERRORS = PREFIX + "nvml_errors"  # _total added by prometheus_client
PASS_SECONDS = PREFIX + "pass_seconds"

DEVICE_LABELS = ("Hostname", "gpu", "UUID", "modelName", "GPU_I_PROFILE", "GPU_I_ID", "GPU_CI_ID")
POD_LABELS = ("namespace", "pod", "container", "pod_uid")


def device_labels(node: str, d: Device) -> list[str]:
    gi = "" if d.gi is None else str(d.gi)
    ci = "" if d.ci is None else str(d.ci)
    return [node, str(d.index), d.uuid, d.model, d.profile, gi, ci]


@dataclass
class _Usage:
    #: None once one of the processes' memory is unknown to NVML: the sum would be too low
    memory: int | None = 0
    processes: int = 0
    #: highest SM utilisation (percent) of the container's processes; None: not known
    util: int | None = None


class ProcReader:
    """Reads ``<root>/<pid>/cgroup`` (``/proc``, or the host's mounted elsewhere)."""

    def __init__(self, root: Path | str = "/proc") -> None:
        self.root = Path(root)

    def pod_of(self, pid: int) -> PodRef | None:
        try:
            return pod_of((self.root / str(pid) / "cgroup").read_text())
        except OSError:  # gone since NVML listed it, or not visible here
            return None


class ProbeCollector(Collector):
    def __init__(self, reader: NvmlReader, procs: ProcReader, pods: PodDirectory | None, node: str) -> None:
        self.reader = reader
        self.procs = procs
        self.pods = pods
        self.node = node
        self.errors: dict[tuple[str, str, str, str], int] = defaultdict(int)
        self._problems_seen: set[tuple[str, str, str, str]] = set()
        self.last: Pass | None = None
        #: one scrape at a time: the NVML pass, the error counts and the log lines
        self.lock = threading.Lock()

    def describe(self) -> list[Metric]:
        return []  # collected on demand: registering must not touch NVML

    def _note(self, problems: list[Problem]) -> None:
        """Count every NVML error; log each kind once when it starts and once when it clears."""
        now = set()
        for p in problems:
            key = (p.gpu, p.uuid, p.call, p.error)
            self.errors[key] += 1
            now.add(key)
            if key not in self._problems_seen:
                where = f"GPU {p.gpu} ({p.uuid})" if p.gpu else "NVML"
                log.warning("%s: %s failed: %s (%s); its numbers are missing until it succeeds", where, p.call, p.error, p.message)
        for key in self._problems_seen - now:
            log.info("GPU %s (%s): %s succeeds again", key[0], key[1], key[2])
        self._problems_seen = now

    def _pod_labels(self, ref: PodRef) -> list[str]:
        name = self.pods.lookup(ref.pod_uid) if self.pods is not None else None
        if name is None:
            return ["", "", "", ref.pod_uid]
        return [name.namespace, name.name, name.containers.get(ref.container_id, ""), ref.pod_uid]

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        with self.lock:
            result = self.reader.read()
            self.last = result
            self._note(result.problems)
            counted = sorted(self.errors.items())
        dl = list(DEVICE_LABELS)
        memory = GaugeMetricFamily(
            POD_MEMORY, "GPU memory used by the pod's processes on this device (NVML), bytes", labels=dl + list(POD_LABELS)
        )
        procs = GaugeMetricFamily(POD_PROCESSES, "Compute processes of the pod on this device (NVML)", labels=dl + list(POD_LABELS))
        util = GaugeMetricFamily(
            POD_SM_UTIL,
            "Highest SM utilisation of the pod's processes on this device over the probe's sample window (NVML process "
            "samples; 0: no sample, idle); absent where NVML keeps none (MIG instances)",
            labels=dl + list(POD_LABELS),
        )
        total = GaugeMetricFamily(DEVICE_TOTAL, "GPU or MIG instance memory, bytes (NVML)", labels=dl)
        used = GaugeMetricFamily(DEVICE_USED, "GPU or MIG instance memory in use, bytes (NVML)", labels=dl)
        unattributed = GaugeMetricFamily(
            DEVICE_UNATTRIBUTED, "Memory of processes on this device that are in no pod (host processes, or gone), bytes", labels=dl
        )
        for reading in result.readings:
            labels = device_labels(self.node, reading.device)
            if reading.device.total_bytes is not None:
                total.add_metric(labels, reading.device.total_bytes)
            if reading.device.used_bytes is not None:
                used.add_metric(labels, reading.device.used_bytes)
            per_container: dict[tuple[str, ...], _Usage] = {}
            outside = _Usage()
            for p in reading.processes:
                ref = self.procs.pod_of(p.pid)
                usage = outside if ref is None else per_container.setdefault(tuple(self._pod_labels(ref)), _Usage())
                usage.memory = None if usage.memory is None or p.used_bytes is None else usage.memory + p.used_bytes
                usage.processes += 1
                if ref is not None and reading.sm_util is not None:
                    usage.util = max(usage.util or 0, reading.sm_util.get(p.pid, 0))
            if outside.memory is not None:
                unattributed.add_metric(labels, outside.memory)
            for pod, usage in per_container.items():
                if usage.memory is not None:  # NVML did not say: absent, never 0
                    memory.add_metric(labels + list(pod), usage.memory)
                procs.add_metric(labels + list(pod), usage.processes)
                if usage.util is not None:
                    util.add_metric(labels + list(pod), usage.util / 100.0)
        yield from (memory, procs, util, total, used, unattributed)
        up = GaugeMetricFamily(NVML_UP, "1 when NVML answered this scrape (driver loaded, library found)")
        up.add_metric([], 1 if result.up else 0)
        yield up
        errors = CounterMetricFamily(
            NVML_ERRORS, "NVML calls that failed, by device, call and error", labels=["gpu", "UUID", "call", "error"]
        )
        for key, n in counted:
            errors.add_metric(list(key), n)
        yield errors
        seconds = GaugeMetricFamily(PASS_SECONDS, "How long this scrape's NVML pass and attribution took, seconds")
        seconds.add_metric([], time.perf_counter() - started)
        yield seconds
