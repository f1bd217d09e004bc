"""Prometheus metrics in the hub's own ``/metrics`` (JupyterHub serves prometheus_client's
default registry): capacity and free units per offering, admissions and refusals by
reason, and how long pods take to be scheduled."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from .model import Offering

if TYPE_CHECKING:
    from .index import ClusterIndex

ADMISSIONS = Counter(
    "gpuspawner_admissions", "Spawns admitted, by offering and decision (admit, warn, queue)", ["offering", "kind", "decision"]
)
REFUSALS = Counter(
    "gpuspawner_refusals", "Spawns refused, by offering and reason (no_capacity, quota, unschedulable, queue_timeout, invalid)",
    ["offering", "kind", "reason"],
)
TIME_TO_SCHEDULE = Histogram(
    "gpuspawner_time_to_schedule_seconds", "From pod creation to the pod running, by offering kind", ["kind"],
    buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800),
)


def admitted(offering: Offering, decision: str) -> None:
    ADMISSIONS.labels(offering.slug, offering.kind.value, decision).inc()


def refused(offering: Offering | None, reason: str) -> None:
    REFUSALS.labels(offering.slug if offering else "", offering.kind.value if offering else "", reason).inc()


class _CapacityCollector:
    """Reads capacity and free units from the inventory at scrape time (no bookkeeping here)."""

    def __init__(self) -> None:
        self.source: tuple[ClusterIndex, list[Offering]] | None = None

    def collect(self) -> Iterable[GaugeMetricFamily]:
        capacity = GaugeMetricFamily("gpuspawner_offering_capacity", "Units of each offering the cluster has", labels=["offering", "kind"])
        free = GaugeMetricFamily("gpuspawner_offering_free", "Units of each offering free now", labels=["offering", "kind"])
        if self.source is not None:
            index, offerings = self.source
            for offering in offerings:
                avail = index.availability(offering)
                if avail.counted:
                    capacity.add_metric([offering.slug, offering.kind.value], avail.capacity)
                    free.add_metric([offering.slug, offering.kind.value], avail.free)
        yield capacity
        yield free


CAPACITY = _CapacityCollector()
REGISTRY.register(CAPACITY)


def observe_catalog(index: ClusterIndex, offerings: list[Offering]) -> None:
    """Remember the latest catalog so a scrape reports its offerings."""
    CAPACITY.source = (index, list(offerings))
