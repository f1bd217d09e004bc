"""GPU view: one PromQL instant query per cycle over dcgm-exporter metrics, and the
pure parsing of Prometheus' JSON answer into per-pod activity and memory.

The query asks, for every notebook GPU series, in ONE expression:

* ``avg_over_time``, ``max_over_time`` and ``count_over_time`` of ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``
  (ratio 0-1; the only activity metric dcgm-exporter reports for MIG instances),
* the same for ``DCGM_FI_DEV_GPU_UTIL`` (percent 0-100; whole GPUs only: it reads 0
  on MIG instances, so it is never read as idleness there),
* ``DCGM_FI_DEV_FB_USED`` now (MiB; instant selector, so a pod that is gone has no
  series) and its ``count_over_time``.

Each part is tagged with a ``gpuspawner_series="<metric>:<stat>"`` label through
``label_replace(v, "gpuspawner_series", "...", "", "")`` so the parts stay distinct
after the ``*_over_time`` functions drop the metric name, and they are joined with
``or``.

and, when the per-pod GPU probe (``gpuspawner probe``, docs/probe.md) is scraped too:

* ``gpuspawner_probe_pod_gpu_memory_bytes`` now, summed over the pod's containers:
  the memory the pod's own processes hold on each device;
* ``max_over_time`` and ``count_over_time`` of ``gpuspawner_probe_pod_sm_utilization_ratio``:
  the pod's own processes' SM activity (time-sliced and whole GPUs; NVML samples no
  processes on MIG instances);
* ``gpuspawner_probe_device_memory_total_bytes``: which devices the probe covers (a pod
  with no probe row on a covered device holds no memory there).

Probe and exporter series of one device share dcgm-exporter's device labels, so they
meet in one :class:`DeviceReading`. A pod's memory is the probe's where the probe covers
the device, else dcgm-exporter's ``FB_USED`` (on a shared GPU: the whole GPU's). Its
activity on a *shared* device (time-slicing, MPS, a fractional resource: every pod there
sees the same device numbers) is its own processes' activity where the probe samples it:
a busy neighbour no longer keeps an idle pod's memory; elsewhere the device's.

Rules (see docs/culler.md):

* a window is active when its MEAN activity is above the threshold, however few
  samples (a tiny kernel a minute is no use of a GPU; the max is shown, not judged);
* idleness needs at least ``min_samples`` samples in the window; otherwise the
  device is *unknown*, and unknown never justifies a cull;
* a pod is idle only when every one of its devices is known idle.

A pod whose GPUs came through Dynamic Resource Allocation is found by its devices instead
of its name (:meth:`GpuView.for_devices`): the spawner records, from the claim's allocation
and the driver's ResourceSlice, each GPU's UUID (a MIG device: its parent's, and its
profile), and these are dcgm-exporter's ``UUID`` and ``GPU_I_PROFILE`` labels, present
whether or not the exporter could tell which pod holds the device.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuspawner.culler.gpu_query import BUDGET_SERIES, ENGINE, FB_USED, SERIES_LABEL, UTIL, GpuQuerySettings, runways
from gpuspawner.names.vocabulary import (
    DEVICE_MIG_PROFILE,
    DEVICE_NAME,
    DEVICE_POOL,
    DEVICE_UUID,
    PROBE_DEVICE_TOTAL,
    PROBE_POD_MEMORY,
    PROBE_POD_SM_UTIL,
    SPAWNS_WAITING,
)

ACTIVE, IDLE, UNKNOWN = "active", "idle", "unknown"


@dataclass
class DeviceReading:
    """What the window says about one device (GPU or MIG instance) of one pod."""

    device: str
    mig: bool
    engine_max: float | None = None
    engine_samples: int = 0
    util_max: float | None = None
    util_samples: int = 0
    #: means over the window: what activity is judged on (None: not in the answer; the max is then)
    engine_avg: float | None = None
    util_avg: float | None = None
    probe_util_avg: float | None = None
    memory_mib: float | None = None
    memory_samples: int = 0
    #: the probe's: the pod's own processes' memory (MiB) and SM activity (ratio)
    probe_memory_mib: float | None = None
    probe_util_max: float | None = None
    probe_util_samples: int = 0
    #: the probe covers this device (a pod without a probe row there holds no memory)
    probed: bool = False

    def update(self, metric: str, stat: str, value: float) -> None:
        # duplicates (HA Prometheus pairs, several containers of one pod on one
        # device) are merged with max: never invent activity, never hide it
        def mx(old: float | None) -> float:
            return value if old is None else max(old, value)

        if metric == ENGINE and stat == "avg":
            self.engine_avg = mx(self.engine_avg)
        elif metric == UTIL and stat == "avg":
            self.util_avg = mx(self.util_avg)
        elif metric == PROBE_POD_SM_UTIL and stat == "avg":
            self.probe_util_avg = mx(self.probe_util_avg)
        elif metric == ENGINE and stat == "max":
            self.engine_max = mx(self.engine_max)
        elif metric == ENGINE and stat == "count":
            self.engine_samples = max(self.engine_samples, int(value))
        elif metric == UTIL and stat == "max":
            self.util_max = mx(self.util_max)
        elif metric == UTIL and stat == "count":
            self.util_samples = max(self.util_samples, int(value))
        elif metric == FB_USED and stat == "last":
            self.memory_mib = mx(self.memory_mib)
        elif metric == FB_USED and stat == "count":
            self.memory_samples = max(self.memory_samples, int(value))
        elif metric == PROBE_POD_MEMORY:
            mib = value / 2**20  # the probe counts bytes, dcgm-exporter MiB
            self.probe_memory_mib = mib if self.probe_memory_mib is None else max(self.probe_memory_mib, mib)
            self.probed = True
        elif metric == PROBE_POD_SM_UTIL and stat == "max":
            self.probe_util_max = mx(self.probe_util_max)
        elif metric == PROBE_POD_SM_UTIL and stat == "count":
            self.probe_util_samples = max(self.probe_util_samples, int(value))

    def classify(self, s: GpuQuerySettings, shared: bool = False) -> tuple[str, str]:
        """(state, reason) for this device. ``shared``: other pods use the device too, so
        where the probe samples the pod's own processes, their activity is the pod's."""
        probe_mean = _mean(self.probe_util_avg, self.probe_util_max)
        if probe_mean is not None and probe_mean > s.engine_threshold:
            return ACTIVE, (
                f"{self.device}: the pod's processes' SM utilisation max {self.probe_util_max or 0:.2f}, mean {probe_mean:.2f} (probe)"
            )
        if shared and self.probe_util_samples > 0:
            if self.probe_util_samples >= s.min_samples:
                return IDLE, (
                    f"{self.device}: the pod's processes idle (probe, {self.probe_util_samples} samples; "
                    "the shared GPU's own activity is its other users' too)"
                )
            return UNKNOWN, f"{self.device}: too few probe samples ({self.probe_util_samples}/{s.min_samples})"
        use_util = not self.mig
        engine = _mean(self.engine_avg, self.engine_max)
        util = _mean(self.util_avg, self.util_max)
        if engine is not None and engine > s.engine_threshold:
            return ACTIVE, f"{self.device}: GR_ENGINE_ACTIVE max {self.engine_max or 0:.2f}, mean {engine:.2f}"
        if use_util and util is not None and util > s.util_threshold:
            return ACTIVE, f"{self.device}: GPU_UTIL max {self.util_max or 0:g}%, mean {util:.1f}%"
        below = f" below gpu_engine_threshold {s.engine_threshold:g}" if self.engine_max and self.engine_max > s.engine_threshold else ""
        if engine is not None and self.engine_samples >= s.min_samples:
            return IDLE, (
                f"{self.device}: GR_ENGINE_ACTIVE max {self.engine_max or 0:.2f}, mean {engine:.2f}{below} ({self.engine_samples} samples)"
            )
        below = f" below gpu_util_threshold {s.util_threshold:g}" if self.util_max and self.util_max > s.util_threshold else ""
        if use_util and util is not None and self.util_samples >= s.min_samples:
            return IDLE, (f"{self.device}: GPU_UTIL max {self.util_max or 0:g}%, mean {util:.1f}%{below} ({self.util_samples} samples)")
        seen = f"GR_ENGINE_ACTIVE {self.engine_samples}/{s.min_samples} samples"
        if use_util:
            seen += f", GPU_UTIL {self.util_samples}/{s.min_samples}"
        else:
            seen += " (GPU_UTIL is not read on MIG instances)"
        return UNKNOWN, f"{self.device}: too few samples ({seen})"

    @property
    def memory_known(self) -> bool:
        return self.probed or (self.memory_mib is not None and self.memory_samples > 0)

    @property
    def pod_memory_mib(self) -> float | None:
        """The pod's memory on this device: the probe's where it covers the device (0 with
        no process of the pod there), else dcgm-exporter's FB_USED."""
        if self.probed:
            return self.probe_memory_mib or 0.0
        return self.memory_mib if self.memory_known else None


@dataclass(frozen=True)
class PodGpuView:
    """Activity and memory of one pod's GPUs over the window."""

    state: str
    reason: str
    #: sum of FB_USED over the pod's devices that report it (MiB), None if none do
    memory_mib: float | None = None
    devices: tuple[DeviceReading, ...] = ()

    @property
    def active(self) -> bool:
        return self.state == ACTIVE

    @property
    def idle(self) -> bool:
        return self.state == IDLE


@dataclass(frozen=True)
class GpuView:
    """The whole cycle's GPU view: per (namespace, pod)."""

    available: bool
    error: str | None = None
    pods: Mapping[tuple[str, str], PodGpuView] = field(default_factory=dict)
    window_s: int = 600
    #: Every device's readings, whoever holds it: (UUID, GPU_I_ID or "", GPU_I_PROFILE or "") -> reading.
    by_device: Mapping[tuple[str, str, str], DeviceReading] = field(default_factory=dict)
    #: The settings the view was read with (for judging readings found by device).
    settings: GpuQuerySettings = field(default_factory=GpuQuerySettings)

    #: the same pods read as sharing their devices (see :meth:`DeviceReading.classify`)
    shared_pods: Mapping[tuple[str, str], PodGpuView] = field(default_factory=dict)
    #: the per-pod probe's series were in the answer
    probe: bool = False
    #: spawns waiting in the hub's queue per offering slug: (how many, the offering's name)
    waiting: Mapping[str, tuple[int, str]] = field(default_factory=dict)
    #: the hub's GPU-hour budgets per user: (hours left, GPU-hours per hour being spent)
    budgets: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    #: the same of their cost budgets: (money left, money per hour being spent)
    cost_budgets: Mapping[str, tuple[float, float]] = field(default_factory=dict)

    def for_devices(self, devices: Iterable[Mapping[str, str]]) -> PodGpuView:
        """The view of a pod's DRA devices (``vocabulary.RECORD_DEVICES`` entries), decided
        exactly as :meth:`for_pod` decides for a pod's series.

        A whole GPU is the series of its UUID without a MIG instance; a MIG device is the
        instance of its profile on its parent's UUID. Where the GPU holds several instances of
        that profile (the claim names a placement, dcgm-exporter a GPU instance id), the device
        is one of them: it is active if any of them is, idle only if all are, and known only
        as far as the least-sampled one is (:func:`merge_candidates`).
        """
        devices = list(devices)
        if not self.available:
            return PodGpuView(UNKNOWN, f"GPU view unavailable ({self.error})")
        readings, missing = [], []
        for device in devices:
            where = f"{device.get(DEVICE_POOL, '?')}/{device.get(DEVICE_NAME, '?')}"
            uuid, profile = device.get(DEVICE_UUID), device.get(DEVICE_MIG_PROFILE, "")
            if not uuid:
                missing.append(f"{where}: its GPU's UUID is not known")
                continue
            candidates = [
                reading
                for (series_uuid, gi, series_profile), reading in sorted(self.by_device.items())
                if series_uuid == uuid and (gi and series_profile == profile if profile else not gi)
            ]
            if not candidates:
                missing.append(f"{where}: no dcgm-exporter series for {uuid}{' MIG ' + profile if profile else ''}")
            else:
                readings.append(candidates[0] if len(candidates) == 1 else merge_candidates(candidates))
        if not readings:
            return PodGpuView(UNKNOWN, "; ".join(missing) or "the server's record names no device")
        view = summarize_pod(readings, self.settings)
        if missing and not view.active:
            return PodGpuView(UNKNOWN, "; ".join([*missing, view.reason]), view.memory_mib, view.devices)
        return view

    def for_pod(self, namespace: str | None, pod: str | None, shared: bool = False) -> PodGpuView:
        if not self.available:
            return PodGpuView(UNKNOWN, f"GPU view unavailable ({self.error})")
        if not pod:
            return PodGpuView(UNKNOWN, "the server's contract names no pod")
        pods = self.shared_pods if shared else self.pods
        if namespace:
            view = pods.get((namespace, pod)) or pods.get(("", pod))
        else:
            matches = [v for (ns, p), v in pods.items() if p == pod]
            view = matches[0] if len(matches) == 1 else None
        if view is None:
            where = f"{namespace}/{pod}" if namespace else pod
            return PodGpuView(UNKNOWN, f"no dcgm-exporter series for pod {where}")
        return view


def expect_devices(view: PodGpuView, expected: int | None) -> PodGpuView:
    """A pod that should have ``expected`` devices but shows fewer is unknown (a
    GPU whose series are missing could be busy), unless what it shows is active."""
    if expected is None or view.active or not view.devices or len(view.devices) >= expected:
        return view
    return PodGpuView(
        UNKNOWN,
        f"series for {len(view.devices)} of its {expected} devices; {view.reason}",
        view.memory_mib,
        view.devices,
    )


def unavailable(error: str, window_s: int = 600) -> GpuView:
    return GpuView(available=False, error=error, window_s=window_s)


def _first(labels: Mapping[str, str], names: Iterable[str]) -> str:
    for name in names:
        value = labels.get(name)
        if value:
            return value
    return ""


def device_name(labels: Mapping[str, str]) -> tuple[str, bool]:
    """A stable, readable device key and whether it is a MIG instance."""
    host = labels.get("Hostname") or labels.get("hostname") or labels.get("instance", "")
    # the index and the UUID together: UUIDs can be redacted or missing, and
    # indexes repeat across nodes
    parts = [host]
    if labels.get("gpu"):
        parts.append(f"gpu{labels['gpu']}")
    parts.append(labels.get("UUID") or labels.get("pci_bus_id") or labels.get("device", "?"))
    gi = labels.get("GPU_I_ID")
    if gi:
        profile = labels.get("GPU_I_PROFILE", "")
        parts.append(f"mig{gi}{'(' + profile + ')' if profile else ''}")
    return "/".join(parts), bool(gi)


def _mean(avg: float | None, peak: float | None) -> float | None:
    """The window's mean, or -- from an answer without it -- its max (never hide activity)."""
    return avg if avg is not None else peak


def merge_candidates(candidates: list[DeviceReading]) -> DeviceReading:
    """One device that is one of ``candidates``: the highest activity any of them shows
    (never hide activity), the fewest samples any has (never call it known on another's)."""

    def most(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return max(known) if known else None

    names = ", ".join(c.device for c in candidates)
    merged = DeviceReading(device=f"one of {names}", mig=any(c.mig for c in candidates))
    merged.engine_max = most([c.engine_max for c in candidates])
    merged.engine_avg = most([c.engine_avg for c in candidates])
    merged.util_avg = most([c.util_avg for c in candidates])
    merged.util_max = most([c.util_max for c in candidates])
    merged.memory_mib = most([c.memory_mib for c in candidates])
    merged.engine_samples = min(c.engine_samples for c in candidates)
    merged.util_samples = min(c.util_samples for c in candidates)
    merged.memory_samples = min(c.memory_samples for c in candidates)
    return merged


def summarize_pod(devices: list[DeviceReading], s: GpuQuerySettings, shared: bool = False) -> PodGpuView:
    states = [d.classify(s, shared) for d in devices]
    known_mem = [d.pod_memory_mib for d in devices if d.memory_known]
    memory = sum(known_mem) if known_mem else None  # type: ignore[arg-type]
    active = [r for st, r in states if st == ACTIVE]
    unknown = [r for st, r in states if st == UNKNOWN]
    if active:
        return PodGpuView(ACTIVE, "; ".join(active), memory, tuple(devices))
    if unknown:
        return PodGpuView(UNKNOWN, "; ".join(unknown), memory, tuple(devices))
    return PodGpuView(IDLE, "; ".join(r for _, r in states), memory, tuple(devices))


def _finite(item: Mapping[str, Any]) -> float | None:
    """A sample's value (None where it is not a finite number)."""
    try:
        value = float(item["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _count(item: Mapping[str, Any]) -> int:
    """A sample's value as a count (0 where it is not one)."""
    try:
        value = float(item["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return 0
    return int(value) if math.isfinite(value) and value > 0 else 0


def parse_query_response(body: Any, settings: GpuQuerySettings) -> GpuView:
    """Read Prometheus' ``/api/v1/query`` JSON answer to :func:`build_query`."""
    if not isinstance(body, Mapping):
        return unavailable("answer is not a JSON object", settings.window_s)
    if body.get("status") != "success":
        return unavailable(
            f"prometheus said {body.get('errorType', 'error')}: {body.get('error', body)}",
            settings.window_s,
        )
    data = body.get("data") or {}
    if data.get("resultType") != "vector":
        return unavailable(f"expected a vector result, got {data.get('resultType')!r}", settings.window_s)
    per_pod: dict[tuple[str, str], dict[str, DeviceReading]] = {}
    by_device: dict[tuple[str, str, str], DeviceReading] = {}
    probed: set[str] = set()
    waiting: dict[str, tuple[int, str]] = {}
    figures: dict[str, dict[str, float]] = {}  # the hub's budget series: user -> figure, per series
    for item in data.get("result") or []:
        labels = item.get("metric") or {}
        tag = labels.get(SERIES_LABEL, "")
        metric, _, stat = tag.partition(":")
        if metric == PROBE_DEVICE_TOTAL:
            probed.add(device_name(labels)[0])
            continue
        if metric == SPAWNS_WAITING:
            count = _count(item)
            if count and labels.get("offering"):
                waiting[labels["offering"]] = (count, labels.get("name") or labels["offering"])
            continue
        if metric in BUDGET_SERIES:
            figure = _finite(item)
            who = labels.get("name") or labels.get("user")  # the hub's user name (older hubs: the label)
            if figure is not None and who:
                figures.setdefault(metric, {})[who] = figure
            continue
        if not stat:
            continue  # a series that is not ours
        try:
            value = float(item["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        if math.isnan(value):
            continue
        name, mig = device_name(labels)
        if labels.get("UUID") and metric not in (
            PROBE_POD_MEMORY,
            PROBE_POD_SM_UTIL,
        ):  # found by device (DRA pods), whichever pod dcgm-exporter names, if any
            device_key = (labels["UUID"], labels.get("GPU_I_ID", ""), labels.get("GPU_I_PROFILE", ""))
            found = by_device.get(device_key)
            if found is None:  # (not setdefault: a reading built for every series cost a tenth of a second at 3,000 pods)
                found = by_device[device_key] = DeviceReading(device=name, mig=mig)
            found.update(metric, stat, value)
        pod = _first(labels, settings.pod_labels)
        if not pod:
            continue  # an unallocated device (or one whose pod the exporter cannot tell)
        key = (_first(labels, settings.namespace_labels), pod)
        devices = per_pod.setdefault(key, {})
        reading = devices.get(name)
        if reading is None:
            reading = devices[name] = DeviceReading(device=name, mig=mig)
        reading.update(metric, stat, value)
    for devs in per_pod.values():
        for name, reading in devs.items():
            reading.probed = reading.probed or name in probed
    pods = {key: summarize_pod(list(devs.values()), settings) for key, devs in per_pod.items()}
    shared = {key: summarize_pod(list(devs.values()), settings, shared=True) for key, devs in per_pod.items()}
    return GpuView(
        available=True,
        pods=pods,
        window_s=settings.window_s,
        shared_pods=shared,
        probe=bool(probed),
        waiting=waiting,
        budgets=runways(figures, "hours"),
        cost_budgets=runways(figures, "cost"),
        by_device=by_device,
        settings=settings,
    )
