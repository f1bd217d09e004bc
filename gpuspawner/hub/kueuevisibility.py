"""Who waits in Kueue for this hub's GPUs, for fair turns (docs/fair-turns.md, docs/kueue.md).

Where ``c.GPUSpawner.kueue_queues`` sends servers through Kueue, one task per hub process reads,
every :data:`EVERY` seconds, the pending workloads of the ClusterQueues behind the hub's
LocalQueues and of the ClusterQueues in their cohort trees, from Kueue's visibility API
(``clusterqueues/<cq>/pendingworkloads``: every LocalQueue's, every namespace's: other hubs'
spawns, batch Jobs, this hub's own held spawns), and each one's Workload (its pod sets, read
once and again every :data:`WORKLOAD_TTL` seconds while it waits). Which of them wait for
which offering is :mod:`gpuspawner.capacity.kueuewaiting`'s; the counts go out on the hub's
``/metrics`` as ``gpuspawner_kueue_workloads_waiting{offering, kind, name, cluster_queue}``,
which the culler adds to the hub's own queue (``gpuspawner_spawns_waiting``) per offering,
once per ClusterQueue however many hubs export it.

A workload Kueue says it can never admit (the words :func:`gpuspawner.hub.kueue.held_words`
refuses with) does not count: reclaiming a GPU would not let it in. Nothing of this is on a
spawn's path: a visibility API not served (404), not readable (403) or Kueue restarting (503)
leaves the counts empty, said once in the log, asked again on the next round.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any

from kubernetes_asyncio.client import ApiException

from gpuspawner.capacity.kueuequeues import KueueRouting
from gpuspawner.capacity.kueuewaiting import PendingWorkload, related_queues, waiting
from gpuspawner.core.model import Offering
from gpuspawner.hub import metrics
from gpuspawner.hub.inventory import Inventory
from gpuspawner.hub.kueue import KueueReader, held_words
from gpuspawner.hub.scheduling import brief
from gpuspawner.names.kueuenames import GROUP, VERSION

log = logging.getLogger("gpuspawner.hub.kueuevisibility")

#: Seconds between two reads of Kueue's pending workloads.
EVERY = 5.0
#: Seconds a pending Workload as read is trusted before it is read again (its conditions: can it
#: ever be admitted).
WORKLOAD_TTL = 60.0


class KueueWaiting:
    """The one reader of Kueue's pending workloads per hub process and API server."""

    _instances: dict[str, KueueWaiting] = {}

    def __init__(self, api: Any, inventory: Inventory, namespace: str | None) -> None:
        self.api, self.inventory, self.namespace = api, inventory, namespace
        self.reader = KueueReader(api, namespace or "")
        #: the latest catalog's offerings that go through Kueue, and the LocalQueues their servers go to
        self.offerings: list[Offering] = []
        self.local_queues: dict[str, set[str]] = {}
        #: (namespace, name) -> (when read, the workload as it waits, or None: it can never be admitted)
        self._workloads: dict[tuple[str, str], tuple[float, PendingWorkload | None]] = {}
        self._task: asyncio.Task[None] | None = None
        self._said = ""
        #: rounds read (tests wait for one more)
        self.rounds = 0

    @classmethod
    def shared(
        cls, api: Any, inventory: Inventory, namespace: str | None, routing: KueueRouting, catalog: Iterable[Offering]
    ) -> KueueWaiting:
        """This process's reader (started on first use, reading Kueue's objects in ``namespace``,
        None: all), told the catalog a spawner built and the LocalQueues ``routing`` sends its servers to."""
        host = getattr(getattr(api, "api_client", None), "configuration", None)
        key = getattr(host, "host", "default")
        found = cls._instances.get(key)
        if found is None or found._task is None or found._task.done():
            found = cls._instances[key] = cls(api, inventory, namespace)
            inventory.watch_kueue(namespace)
            found._task = asyncio.ensure_future(found._run())
        queues: dict[str, set[str]] = {}
        for offering in catalog:
            named = {routing.queue_for(offering, ()), *(routing.queue_for(offering, [g]) for g in routing.groups)} - {""}
            if named:
                queues[offering.slug] = named
        found.offerings = [o for o in catalog if o.slug in queues]
        found.local_queues = queues
        return found

    async def _run(self) -> None:
        while True:
            try:
                await self.read_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # never let the loop die: the counts stay as they were (said once)
                self._say(f"cannot be read ({brief(exc)})")
            self.rounds += 1
            await asyncio.sleep(EVERY)

    async def read_once(self) -> dict[tuple[str, str], int]:
        """One round: read, count, and publish the counts (the metric's series); returns them."""
        state = self.inventory.index.kueue
        if not self.offerings or not all(state.synced.values()):
            return {}
        names = set().union(*self.local_queues.values())
        behind = {lq.cluster_queue for (ns, name), lq in state.local.items() if name in names and self.namespace in (None, ns)}
        queues = set().union(*(related_queues(state, cq) for cq in behind)) if behind else set()
        pending: list[PendingWorkload] = []
        listed: set[tuple[str, str]] = set()
        for cluster_queue in sorted(queues):
            try:
                summary = await self.reader.pending(f"clusterqueues/{cluster_queue}")
            except ApiException as exc:
                self._say(f"the visibility API answered {exc.status} for ClusterQueue {cluster_queue}'s pending workloads")
                if exc.status == 404:
                    continue  # (not in Kueue's queues yet, or the API not served)
                metrics.kueue_waiting({}, {})
                return {}
            for item in (summary or {}).get("items") or ():
                meta = item.get("metadata") or {}
                key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
                listed.add(key)
                workload = await self._workload(key, cluster_queue)
                if workload is not None:
                    pending.append(workload)
        self._workloads = {k: v for k, v in self._workloads.items() if k in listed}
        counts = waiting(self.offerings, self.local_queues, self.namespace, state, self.inventory.index.notebook, pending)
        metrics.kueue_waiting(counts, {o.slug: o for o in self.offerings})
        self._said = ""
        return counts

    async def _workload(self, key: tuple[str, str], cluster_queue: str) -> PendingWorkload | None:
        found = self._workloads.get(key)
        now = time.monotonic()
        if found is not None and now - found[0] < WORKLOAD_TTL and (found[1] is None or found[1].cluster_queue == cluster_queue):
            return found[1]
        try:
            obj = await self.reader.custom.get_namespaced_custom_object(GROUP, VERSION, key[0], "workloads", key[1], _request_timeout=5)
        except ApiException as exc:
            if exc.status != 404:
                self._say(f"the API server answered {exc.status} for Workload {key[0]}/{key[1]}")
            return None
        never = held_words(obj, "")[1] is not None
        workload = None if never else PendingWorkload.from_object(obj, cluster_queue)
        self._workloads[key] = (now, workload)
        return workload

    def _say(self, why: str) -> None:
        if why != self._said:
            self._said = why
            log.warning("Kueue's pending workloads: %s; fair turns count the hub's own queue only until it answers", why)
