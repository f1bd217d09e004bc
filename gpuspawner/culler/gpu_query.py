"""The one PromQL query the culler sends each cycle for the GPU view: dcgm-exporter's (or the probe's) per-device series over the window, the spawns waiting per offering (the hubs' queues and Kueue's) and its users' GPU-hour and cost budgets, tagged by series and statistic. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuspawner.names.vocabulary import (
    BUDGET_COST,
    BUDGET_HOURS,
    BUDGET_REMAINING,
    BUDGET_SPEND_RATE,
    COST_BUDGET_REMAINING,
    COST_BUDGET_SPEND_RATE,
    KUEUE_WORKLOADS_WAITING,
    PROBE_DEVICE_TOTAL,
    PROBE_POD_MEMORY,
    PROBE_POD_SM_UTIL,
    SPAWNS_WAITING,
)

ENGINE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"


UTIL = "DCGM_FI_DEV_GPU_UTIL"


FB_USED = "DCGM_FI_DEV_FB_USED"


SERIES_LABEL = "gpuspawner_series"


#: a window is active when the mean engine activity over it is above 5 %
#: (GR_ENGINE_ACTIVE ratio; GPU_UTIL and the probe's SM ratio alike)
DEFAULT_ENGINE_THRESHOLD = 0.05


DEFAULT_UTIL_THRESHOLD = 5.0


@dataclass(frozen=True)
class GpuQuerySettings:
    """How the GPU view is asked for and read."""

    window_s: int = 600
    #: extra PromQL label matchers, e.g. ``exported_namespace="jhub"``
    selector: str = ""
    min_samples: int = 4
    #: GR_ENGINE_ACTIVE's mean over the window above this (ratio) is activity
    engine_threshold: float = DEFAULT_ENGINE_THRESHOLD
    #: GPU_UTIL's mean over the window above this (percent) is activity
    util_threshold: float = DEFAULT_UTIL_THRESHOLD
    #: label names that carry the notebook pod's name/namespace, in order of preference
    pod_labels: tuple[str, ...] = ("exported_pod", "pod")
    namespace_labels: tuple[str, ...] = ("exported_namespace", "namespace")


def _selector(metric: str, selector: str) -> str:
    selector = selector.strip().strip("{}").strip()
    return f"{metric}{{{selector}}}" if selector else metric


def _tag(expr: str, metric: str, stat: str) -> str:
    return f'label_replace({expr}, "{SERIES_LABEL}", "{metric}:{stat}", "", "")'


#: the hub's budget series the query reads, per budget (GPU-hours, money): left, spent per hour
BUDGETS = {BUDGET_HOURS: (BUDGET_REMAINING, BUDGET_SPEND_RATE), BUDGET_COST: (COST_BUDGET_REMAINING, COST_BUDGET_SPEND_RATE)}
BUDGET_SERIES = frozenset(name for pair in BUDGETS.values() for name in pair)


def runways(figures: Mapping[str, Mapping[str, float]], budget: str) -> dict[str, tuple[float, float]]:
    """Per user with a figure of what is left of ``budget`` (a key of :data:`BUDGETS`), read
    from the series' ``figures`` (series -> user -> value): (left, spent per hour; 0 where unread or below)."""
    left, rate = BUDGETS[budget]
    rates = figures.get(rate, {})
    return {user: (value, max(0.0, rates.get(user, 0.0))) for user, value in figures.get(left, {}).items()}


def build_query(settings: GpuQuerySettings) -> str:
    """The one PromQL expression asked each cycle."""
    w = f"{int(settings.window_s)}s"
    parts = []
    for metric in (ENGINE, UTIL):
        sel = _selector(metric, settings.selector)
        parts.append(_tag(f"avg_over_time({sel}[{w}])", metric, "avg"))
        parts.append(_tag(f"max_over_time({sel}[{w}])", metric, "max"))
        parts.append(_tag(f"count_over_time({sel}[{w}])", metric, "count"))
    sel = _selector(FB_USED, settings.selector)
    parts.append(_tag(sel, FB_USED, "last"))
    parts.append(_tag(f"count_over_time({sel}[{w}])", FB_USED, "count"))
    # the probe: one series per container; the pod's memory on a device is their sum
    sel = _selector(PROBE_POD_MEMORY, settings.selector)
    parts.append(_tag(f"sum without (container, exported_container) ({sel})", PROBE_POD_MEMORY, "last"))
    sel = _selector(PROBE_POD_SM_UTIL, settings.selector)
    parts.append(_tag(f"avg_over_time({sel}[{w}])", PROBE_POD_SM_UTIL, "avg"))
    parts.append(_tag(f"max_over_time({sel}[{w}])", PROBE_POD_SM_UTIL, "max"))
    parts.append(_tag(f"count_over_time({sel}[{w}])", PROBE_POD_SM_UTIL, "count"))
    parts.append(_tag(PROBE_DEVICE_TOTAL, PROBE_DEVICE_TOTAL, "last"))
    # the spawns waiting for an offering: each hub's own queue, summed over the hubs' series, plus
    # Kueue's pending workloads for its GPU, once per ClusterQueue they wait in (every hub whose
    # servers go through Kueue exports the same workloads: the most any of them counts)
    kueue = f"max by (offering, name, cluster_queue) ({KUEUE_WORKLOADS_WAITING})"
    parts.append(_tag(f"sum by (offering, name) ({SPAWNS_WAITING} or {kueue})", SPAWNS_WAITING, "last"))
    # the hub's GPU-hour budgets: the least left and the most spent, over the hub's replicas
    parts.append(_tag(f"min by (user, name) ({BUDGET_REMAINING})", BUDGET_REMAINING, "last"))
    parts.append(_tag(f"max by (user, name) ({BUDGET_SPEND_RATE})", BUDGET_SPEND_RATE, "last"))
    # and their cost budgets, the same way (money left, money per hour)
    parts.append(_tag(f"min by (user, name) ({COST_BUDGET_REMAINING})", COST_BUDGET_REMAINING, "last"))
    parts.append(_tag(f"max by (user, name) ({COST_BUDGET_SPEND_RATE})", COST_BUDGET_SPEND_RATE, "last"))
    return " or ".join(parts)
