"""Prometheus metrics in the hub's own ``/metrics`` (JupyterHub serves prometheus_client's
default registry): capacity and free units per offering, admissions and refusals by
reason, how long pods take to be scheduled, and who holds which GPU units now
(``gpuspawner_server_gpus``: the join key between dcgm-exporter's per-pod series and
users, groups and offerings, for the dashboard, the rules and ``gpuspawner report``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from gpuspawner.core.model import Offering
from gpuspawner.hub.scheduling import WaitQueue
from gpuspawner.names.vocabulary import GPU_USERS_GROUP, KUEUE_WORKLOADS_WAITING, OFFERING_PRICE, SPAWNS_WAITING, Kind, Refusal

if TYPE_CHECKING:
    from gpuspawner.capacity.index import ClusterIndex

ADMISSIONS = Counter(
    "gpuspawner_admissions", "Spawns admitted, by offering and decision (admit, warn, queue)", ["offering", "kind", "decision"]
)
REFUSALS = Counter(
    "gpuspawner_refusals",
    "Spawns refused, by offering and reason (no_capacity, quota, unschedulable, queue_timeout, invalid)",
    ["offering", "kind", "reason"],
)
TIME_TO_SCHEDULE = Histogram(
    "gpuspawner_time_to_schedule_seconds",
    "From pod creation to the pod running, by offering kind",
    ["kind"],
    buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800),
)
# Every kind's series at 0 from the hub's start, not from its first catalog: Prometheus sees no
# increase in a series it first scrapes at 1, and a hub's first spawns can finish (kwok's pods run at
# once) before the first catalog's series were ever scraped at 0.
for _kind in Kind:
    TIME_TO_SCHEDULE.labels(_kind.value)


def admitted(offering: Offering, decision: str) -> None:
    ADMISSIONS.labels(offering.slug, offering.kind.value, decision).inc()


def refused(offering: Offering | None, reason: str) -> None:
    REFUSALS.labels(offering.slug if offering else "", offering.kind.value if offering else "", reason).inc()


class _CapacityCollector:
    """Reads capacity and free units from the inventory at scrape time (no bookkeeping here)."""

    def __init__(self) -> None:
        self.source: tuple[ClusterIndex, list[Offering]] | None = None
        #: This hub's identity (``c.GPUSpawner.hub_id``; "": none): whose pods ``gpuspawner_server_gpus`` lists.
        self.hub = ""
        #: Builds the hub's catalog again (and observes it): the source's is made anew at a scrape
        #: when the discovered offerings changed since (``seen``), so the counts never keep the
        #: offerings of a moment the cluster could not be read (a hub that started in an outage,
        #: then had no page view).
        self.rebuild: Callable[[], object] | None = None
        self.seen: list[Offering] = []

    def collect(self) -> Iterable[GaugeMetricFamily]:
        capacity = GaugeMetricFamily("gpuspawner_offering_capacity", "Units of each offering the cluster has", labels=["offering", "kind"])
        free = GaugeMetricFamily("gpuspawner_offering_free", "Units of each offering free now", labels=["offering", "kind"])
        if self.source is not None and self.rebuild is not None and self.source[0].discovered() != self.seen:
            try:
                self.rebuild()
            except Exception as exc:  # (a wrong setting: every page says so; the scrape keeps the last catalog)
                logging.getLogger(__name__).debug("metrics: the catalog could not be made again: %s", exc)
        if self.source is not None:
            index, offerings = self.source
            for offering in offerings:
                avail = index.availability(offering)
                if avail.capacity is not None and avail.free is not None:  # (counted: both are)
                    capacity.add_metric([offering.slug, offering.kind.value], avail.capacity)
                    free.add_metric([offering.slug, offering.kind.value], avail.free)
        yield capacity
        yield free
        # the admin's prices, which `gpuspawner report` multiplies the held unit-hours by
        price = GaugeMetricFamily(
            OFFERING_PRICE, "What one unit of each offering costs per hour (the admin's price_per_hour)", labels=["offering", "kind", "hub"]
        )
        for offering in self.source[1] if self.source is not None else ():
            if offering.price_per_hour is not None:
                price.add_metric([offering.slug, offering.kind.value, self.hub], offering.price_per_hour)
        yield price
        # the spawns in this hub's queue per offering: the culler reclaims an idle server for them
        waiting = GaugeMetricFamily(
            SPAWNS_WAITING, "Spawns waiting in the hub's queue for each offering", labels=["offering", "kind", "name"]
        )
        for offering in self.source[1] if self.source is not None else ():
            waiting.add_metric([offering.slug, offering.kind.value, offering.display_name], WaitQueue.length(offering.slug))
        yield waiting
        # Kueue's pending workloads that wait for an offering's GPU, per ClusterQueue they wait in
        # (hub.kueuevisibility): the culler adds them to the above once per ClusterQueue
        kueue = GaugeMetricFamily(
            KUEUE_WORKLOADS_WAITING,
            "Kueue's pending workloads (any hub's spawns, batch Jobs) waiting for each offering's GPU, by the ClusterQueue they wait in",
            labels=["offering", "kind", "name", "cluster_queue"],
        )
        for labels, count in KUEUE_WAITING.items():
            kueue.add_metric(list(labels), count)
        yield kueue


#: (offering slug, kind, display name, ClusterQueue) -> Kueue's pending workloads waiting for it
#: (set by gpuspawner.hub.kueuevisibility each round).
KUEUE_WAITING: dict[tuple[str, str, str, str], int] = {}


def kueue_waiting(counts: dict[tuple[str, str], int], offerings: dict[str, Offering]) -> None:
    """Replace the Kueue waiting counts: (slug, ClusterQueue) -> how many, for ``offerings`` by slug."""
    KUEUE_WAITING.clear()
    for (slug, cluster_queue), count in counts.items():
        offering = offerings.get(slug)
        if offering is not None and count > 0:
            KUEUE_WAITING[(slug, offering.kind.value, offering.display_name, cluster_queue)] = count


CAPACITY = _CapacityCollector()
REGISTRY.register(CAPACITY)

#: user (as the pods' hub.jupyter.org/username label writes it) -> the group their GPU use
#: is reported under (the first of their groups, alphabetically, but the culler's access
#: group; "" for none). Filled as the spawner meets users (form, spawn).
USER_GROUPS: dict[str, str] = {}


def observe_groups(user: str, groups: Iterable[str]) -> None:
    USER_GROUPS[user] = min((g for g in groups if g != GPU_USERS_GROUP), default="")


class _HoldingsCollector:
    """One ``gpuspawner_server_gpus`` series per notebook pod of this hub that holds GPU units,
    read at scrape time from the cluster inventory (the live pods the API server lists, labelled
    with this hub's identity ``gpuspawner.io/hub``, or with none for a hub without one: another
    hub's pods are that hub's to export, so one Prometheus scraping several hubs sees each pod
    once), valued in units of its offering. ``namespace``/``pod`` match dcgm-exporter's labels;
    scrape the hub with honor_labels so that they are kept as they are. ``hub`` is the hub's
    identity, which GPU-hour budgets select on."""

    def collect(self) -> Iterable[GaugeMetricFamily]:
        from gpuspawner.capacity.admission import units_held

        held = GaugeMetricFamily(
            "gpuspawner_server_gpus",
            "GPU units held by each notebook pod of this hub, by user, group and offering",
            labels=["namespace", "pod", "user", "group", "offering", "kind", "hub"],
        )
        if CAPACITY.source is not None:
            index, offerings = CAPACITY.source
            catalog = {o.slug: o for o in offerings}
            for key, pod in list(index.user_pods(CAPACITY.hub).items()):
                offering = catalog.get(pod.offering or "")
                if offering is None or not offering.resources:  # (every user pod has its user)
                    continue
                namespace, _, name = key.partition("/")
                labels = [
                    namespace,
                    name,
                    pod.user or "",
                    USER_GROUPS.get(pod.user or "", ""),
                    offering.slug,
                    offering.kind.value,
                    CAPACITY.hub,
                ]
                held.add_metric(labels, units_held(offering, pod.requests))
        yield held


REGISTRY.register(_HoldingsCollector())


#: what metrics.refused() and admitted() are called with (spawner.py)
REFUSAL_REASONS = (
    Refusal.NO_CAPACITY,
    Refusal.QUOTA,
    Refusal.BUDGET,
    Refusal.WINDOW,
    Refusal.UNSCHEDULABLE,
    Refusal.QUEUE_TIMEOUT,
    Refusal.IMAGE,
    Refusal.POD_NAME_TAKEN,
)
ADMISSION_DECISIONS = ("admit", "warn", "queue")


#: (slug, kind) of every offering whose series observe_catalog has made.
_OBSERVED: set[tuple[str, str]] = set()


def observe_catalog(index: ClusterIndex, offerings: list[Offering], hub: str = "", rebuild: Callable[[], object] | None = None) -> None:
    """Remember the latest catalog (and the hub's identity ``hub``) so a scrape reports its
    offerings and this hub's pods (``rebuild``: makes the catalog again, and observes it, when the
    cluster's discovered offerings have changed by the scrape); each offering's admission and
    refusal series exist from then on at 0, so that Prometheus' increase()/rate() see the first
    event (a series born at 1 shows none; the time-to-schedule series, by kind, exist from the
    hub's start)."""
    CAPACITY.source, CAPACITY.hub = (index, list(offerings)), hub
    CAPACITY.seen = index.discovered()
    if rebuild is not None:
        CAPACITY.rebuild = rebuild
    for offering in offerings:
        if (offering.slug, offering.kind.value) in _OBSERVED:
            continue  # (its series exist already: a view builds the catalog again and again)
        _OBSERVED.add((offering.slug, offering.kind.value))
        for reason in REFUSAL_REASONS:
            REFUSALS.labels(offering.slug, offering.kind.value, reason)
        for decision in ADMISSION_DECISIONS:
            ADMISSIONS.labels(offering.slug, offering.kind.value, decision)
