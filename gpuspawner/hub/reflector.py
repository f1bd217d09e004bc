"""KubeSpawner's pod reflector, telling a waiting spawn the scheduler's verdict at once.

KubeSpawner keeps the pods of its namespace in a reflector (a list-and-watch); a spawn that
wants to know whether the scheduler has refused its pod would have to read that dict over
and over. This reflector tells the spawns that wait on a pod the moment its watch sees the
pod marked Unschedulable: event-driven, and nothing polls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from kubespawner.spawner import PodReflector
from traitlets import validate

from gpuspawner.hub.departures import departure
from gpuspawner.hub.inventory import Inventory
from gpuspawner.hub.kueue import ended_by_kueue, queue_of
from gpuspawner.hub.scheduling import unschedulable_reason
from gpuspawner.hub.seam import Spawner

#: How many pods' last words (Kueue's reason for stopping them, the cluster's for deleting them) a reflector keeps, at most.
ENDED_KEPT = 1000


class _Told(dict[str, Any]):
    """The reflector's pods by ``namespace/name``; calls ``changed`` on every update and
    ``removed`` with the last pod seen when its DELETED event drops it."""

    def __init__(self, pods: dict[str, Any], changed: Callable[[str, Any], None], removed: Callable[[str, Any], None]):
        super().__init__(pods)
        self._changed, self._removed = changed, removed
        for key, pod in pods.items():
            changed(key, pod)

    def __setitem__(self, key: str, pod: Any) -> None:
        super().__setitem__(key, pod)
        self._changed(key, pod)

    def pop(self, key: str, *default: Any) -> Any:
        pod = super().pop(key, *default)
        if isinstance(pod, dict):
            self._removed(key, pod)
        return pod


class VerdictPodReflector(PodReflector):
    """A PodReflector whose updates resolve the futures of :meth:`unschedulable`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._waiters: dict[str, list[asyncio.Future[str]]] = {}
        #: Pods Kueue is stopping (preempted, evicted) by ``namespace/name``: its condition and the pod's queue.
        self.ended: dict[str, tuple[Any, str]] = {}
        #: Pods whose DELETED event went by, by ``namespace/name``: what the cluster said of each as it
        #: left (:func:`gpuspawner.hub.departures.departure`), for the home page's notice.
        self.gone: dict[str, dict[str, str]] = {}
        super().__init__(*args, **kwargs)

    @validate("resources")
    def _tell_waiters(self, proposal: Any) -> dict[str, Any]:
        """The pods a (re)list gives, told as the watch's are. KubeSpawner's reflector lists again
        each ``restart_seconds`` and replaces its pods whole: a pod deleted while its watch was
        down is missing from the list and has no DELETED event, so it is removed here, with the
        last of it seen (the cluster's reason for it leaving, if that came before)."""
        before = self._trait_values.get("resources") or {}
        fresh = proposal["value"]
        for key in before.keys() - fresh.keys():
            self._removed(key, before[key])
        return _Told(fresh, self._changed, self._removed)

    def keep_words(self, before: VerdictPodReflector) -> None:
        """Keep what the reflector this one replaces (after an outage) heard of pods that went, and
        was not yet told: Kueue's reasons and the cluster's."""
        self.ended = {**before.ended, **self.ended}
        self.gone = {**before.gone, **self.gone}

    def _removed(self, key: str, pod: Any) -> None:
        self.gone.pop(key, None)
        if len(self.gone) >= ENDED_KEPT:
            self.gone.pop(next(iter(self.gone)))
        self.gone[key] = departure(pod)

    def unschedulable(self, key: str) -> asyncio.Future[str]:
        """A future resolved with the scheduler's own words once pod ``key`` is marked
        Unschedulable (at once if it already is); cancel it when no longer needed."""
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(key, []).append(future)
        future.add_done_callback(lambda done: self._forget(key, done))
        pod = self.resources.get(key)
        if pod is not None:
            self._changed(key, pod)
        return future

    def _forget(self, key: str, future: asyncio.Future[str]) -> None:
        waiters = self._waiters.get(key, [])
        if future in waiters:
            waiters.remove(future)
        if not waiters:
            self._waiters.pop(key, None)

    def _changed(self, key: str, pod: Any) -> None:
        if self.gone:
            self.gone.pop(key, None)  # (a new pod of that name: the old one's words are not its)
        ended = ended_by_kueue(pod)
        if ended is not None and key not in self.ended:
            if len(self.ended) >= ENDED_KEPT:
                self.ended.pop(next(iter(self.ended)))
            self.ended[key] = (ended, queue_of((pod.get("metadata") or {}).get("labels")))
        waiters = self._waiters.get(key)
        reason = unschedulable_reason(pod) if waiters else None
        if reason:
            for future in list(waiters or ()):
                if not future.done():
                    future.set_result(reason)


async def scheduler_verdict(reflector_of: Callable[[], Any], key: str) -> str:
    """The scheduler's words as soon as it marks pod ``key`` Unschedulable.

    Event-driven with a :class:`VerdictPodReflector`; ``reflector_of`` gives the spawner's
    current reflector, looked at again now and then (an outage replaces it). A KubeSpawner's
    reflector in the same process is read as it is."""
    scheduler_says = None
    while not scheduler_says:
        reflector = reflector_of()
        if not isinstance(reflector, VerdictPodReflector):
            pod = reflector.pods.get(key) if reflector is not None else None
            scheduler_says = unschedulable_reason(pod) if pod else None
            await asyncio.sleep(0 if scheduler_says else 0.1)
            continue
        verdict = reflector.unschedulable(key)
        try:
            scheduler_says = await asyncio.wait_for(asyncio.shield(verdict), timeout=5)
        except TimeoutError:
            pass
        finally:
            verdict.cancel()
    return scheduler_says


def needs_restart(reflector: Any, outages: int, seen_outages: int) -> bool:
    """Whether KubeSpawner's pod reflector must be started afresh: its watch gave up (it stops
    for good after about 30 s of errors), or the inventory (which reconnects on its own) has
    seen an outage since it was started (``outages`` vs the ``seen_outages`` then)."""
    task = getattr(reflector, "watch_task", None)
    return reflector is not None and ((task is not None and task.done()) or outages != seen_outages)


#: The inventory's stream failures when the pod reflector was last (re)started (one per hub process).
_outages_at_start = 0


async def start_watching(spawner: Spawner, start_reflector: Callable[..., Awaitable[Any]], component_label: str, replace: bool) -> Any:
    """KubeSpawner's pod reflector (``start_reflector``: its ``_start_reflector``), started afresh
    after an API server outage.

    After an outage KubeSpawner's reflector may have given up (it stops for good after
    about 30 s of errors) or may resume without seeing new pods; it is replaced only
    when a stop times out, so until then every start waits out ``start_timeout`` for a
    pod it never sees, and poll reads a frozen picture. Every start, poll and stop comes
    through here first: once the inventory (which reconnects on its own) has seen an
    outage and is in sync again, the next one restarts the reflector.
    """
    global _outages_at_start
    inventory = Inventory.running(spawner.api)
    outages = inventory.stream_failures if inventory is not None and inventory.ready else _outages_at_start
    if not replace and needs_restart(spawner.pod_reflector, outages, _outages_at_start):
        spawner.log.warning("%s: restarting KubeSpawner's pod reflector after an API server outage", spawner.log_name)
        replace = True
    _outages_at_start = outages
    before = spawner.pod_reflector if replace else None
    # KubeSpawner's own call, with a reflector that tells waiting spawns the scheduler's verdict.
    reflector = await start_reflector(
        kind="pods",
        reflector_class=VerdictPodReflector,
        labels={"component": component_label},
        omit_namespace=spawner.enable_user_namespaces,
        replace=replace,
    )
    if isinstance(before, VerdictPodReflector) and before is not spawner.pod_reflector:
        spawner.pod_reflector.keep_words(before)  # why pods went, not yet told: the new one tells it
    return reflector
