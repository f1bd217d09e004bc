"""Live GPU inventory: one list-then-watch of Nodes and Pods per hub process, at the edge.

:class:`Inventory` feeds a :class:`~gpuspawner.capacity.index.ClusterIndex` (the pure part, in
the core) from the API server with kubernetes_asyncio (list, then watch from the list's
resourceVersion; relist on ``410 Gone``; reconnect with backoff when the API server goes
away). ``ready`` is true while both streams are synced; :attr:`Inventory.health` says,
without waiting, how old the counts are and why when they are not live (the spawn page
shows it, spawns are refused with it).

RBAC it needs, and nothing more: ``get``, ``list``, ``watch`` on ``nodes`` and
``list``, ``watch`` on ``pods`` (cluster-wide: pods of other namespaces use GPUs, cpu,
memory and pod slots too); charts/gpuspawner grants exactly that.

Dynamic Resource Allocation's streams, and Kueue's and Karpenter's where the hub uses them, run in
the same loop but are optional (:mod:`gpuspawner.hub.optionalstreams`): a cluster that does not serve
them, or a hub that may not read them, leaves their figures unknown and never holds up the node and
pod counts. Without the nodes' and pods' permissions (a stock zero-to-jupyterhub hub) the API server
answers 403: the inventory logs one error naming the missing permissions, says so in
:attr:`Inventory.forbidden` and ``health.forbidden`` (nobody waits for counts that cannot come; pods
can still be made), and tries again every ``forbidden_retry`` seconds, quietly, so that granting them
later makes the counts live without a hub restart.

A watch can outlive the API server's will to answer: on SIGTERM kube-apiserver refuses new
connections but keeps established watches open for a while, so the streams look live while
every new request fails. :meth:`Inventory.call_failed` (the spawner calls it when a Kubernetes
call on the spawn path cannot connect or times out) makes the counts not live at once, with
that reason, until a request answers again (a probe, with backoff) or the streams relist. So
that nobody has to try a spawn first, the inventory asks one cheap question itself every
``heartbeat`` seconds while its counts look live (a one-item list of nodes from the API
server's cache): a connection that fails is the same news. A question that is only slow is not.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from functools import partial
from typing import Any

import aiohttp

from gpuspawner.capacity.index import ClusterIndex, Health
from gpuspawner.capacity.karpenterpools import STREAMS as POOL_STREAMS
from gpuspawner.capacity.kueuequota import STREAMS as KUEUE_STREAMS
from gpuspawner.hub.kubeapi import NEEDED_PERMISSIONS, ListCall, Refused, forbidden_message, raise_for_status
from gpuspawner.hub.optionalstreams import OPTIONAL_WHAT, OptionalStreams
from gpuspawner.offerings.discovery import DEFAULT_VGPU_CLASS_LABELS

log = logging.getLogger("gpuspawner.hub.inventory")

#: Only pods that hold node resources matter; the API server filters the rest out.
POD_FIELD_SELECTOR = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
_STREAM_WHAT = {"nodes": "nodes", "pods": "pods in all namespaces", **OPTIONAL_WHAT}


class Inventory(OptionalStreams):
    """Keeps a :class:`ClusterIndex` in sync with the API server (list, then watch)."""

    _instances: dict[str, Inventory] = {}

    def __init__(
        self,
        api: Any,
        vgpu_class_labels: Iterable[str] = DEFAULT_VGPU_CLASS_LABELS,
        page_size: int = 500,
        forbidden_retry: float = 60.0,
        dra_api: Any = None,
        kueue_api: Any = None,
        heartbeat: float = 5.0,
    ):
        super().__init__(api, dra_api, kueue_api)  # (DRA's, Kueue's and Karpenter's streams)
        self.api = api
        #: Seconds between the inventory's own questions while the counts look live (see the module's docstring).
        self.heartbeat = heartbeat
        self.index = ClusterIndex(vgpu_class_labels)
        self.page_size = page_size
        self.forbidden_retry = forbidden_retry
        self._synced = {"nodes": False, "pods": False}
        self._tasks: list[asyncio.Task[None]] = []
        self._ready_event = asyncio.Event()
        self._answered = asyncio.Event()  # set by the first sync or the first failure
        self._lost_at: float | None = None  # when the counts stopped being live (None: live, or never were)
        self._ever_ready = False
        self.relists: Counter[str] = Counter()
        self.last_error: str = ""
        #: How often a stream has failed (the API server gone, say): others use it to notice outages.
        self.stream_failures = 0
        #: Why the hub may not read the cluster (its RBAC), as logged once; "" when it may.
        self.forbidden: str = ""
        self._forbidden_streams: set[str] = set()
        #: Why a request on the spawn path failed to reach the API server ("" when none has, or it answers again).
        self.unreachable: str = ""
        self._probe_task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # where its streams run (set by start)

    @classmethod
    def shared(cls, api: Any, vgpu_class_labels: Iterable[str] = DEFAULT_VGPU_CLASS_LABELS) -> Inventory:
        """The one inventory of this process for the API server ``api`` talks to (started on first use)."""
        host = getattr(getattr(api, "api_client", None), "configuration", None)
        key = getattr(host, "host", "default")
        inventory = cls._instances.get(key)
        if inventory is None or not inventory.runs_here():
            inventory = cls._instances[key] = cls(api, vgpu_class_labels)
            inventory.start()
        return inventory

    @classmethod
    def running(cls, api: Any) -> Inventory | None:
        """This process's inventory for ``api``'s API server if one runs (never starts one)."""
        host = getattr(getattr(api, "api_client", None), "configuration", None)
        inventory = cls._instances.get(getattr(host, "host", "default"))
        return inventory if inventory is not None and inventory.runs_here() else None

    def runs_here(self) -> bool:
        """Whether its streams run, in the event loop that asks (an inventory started in another
        loop, one stopped since, say, never hears another event: it is not this loop's)."""
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        return not self.stopped and (self._loop is None or self._loop is here)

    @property
    def ready(self) -> bool:
        return all(self._synced.values())

    @property
    def health(self) -> Health:
        if self.ready and not self.forbidden and not self.unreachable:
            return Health(ready=True)
        return Health(
            ready=False,
            answered=self._answered.is_set(),
            as_of=self._lost_at,
            error=self.unreachable or self.last_error,
            forbidden="" if self.unreachable else self.forbidden,
        )

    #: time.monotonic() when a watch stream last brought anything (an event or a bookmark): the API
    #: server was answering then, whatever a request that timed out meanwhile suggests.
    heard_at: float = float("-inf")

    def hears_the_api_server(self, within: float = 90.0) -> bool:
        """Whether the streams are in sync and brought something in the last ``within`` seconds (the
        API server sends a bookmark on an idle watch about once a minute)."""
        return self.ready and not self.unreachable and time.monotonic() - self.heard_at < within

    def call_failed(self, reason: str, probe: Callable[[], Awaitable[Any]], retry: float = 0.5) -> None:
        """A request to the API server failed to connect or timed out (``reason``, for the log)
        while the streams may still look live: the counts are not live from now on (the page
        says so, spawns get 503) until ``probe()`` (a cheap request) answers or the streams
        relist. ``retry``: the probe's first wait, doubled up to 10 s."""
        if self.unreachable:
            return
        self.unreachable = reason
        if self._lost_at is None:
            self._lost_at = time.time()
        self._answered.set()
        log.warning("inventory: a request to the API server failed (%s); the counts are not live until it answers", reason)
        self._probe_task = asyncio.ensure_future(self._probe(probe, retry))

    async def _probe(self, probe: Callable[[], Awaitable[Any]], wait: float) -> None:
        while self.unreachable:
            await asyncio.sleep(wait)
            try:
                await probe()
            except Exception:
                wait = min(wait * 2, 10.0)
                continue
            self._answers_again()

    def _answers_again(self) -> None:
        if self.unreachable:
            self.unreachable = ""
            if self.ready:
                self._lost_at = None
            log.info("inventory: the API server answers requests again")

    @property
    def stopped(self) -> bool:
        return bool(self._tasks) and all(t.done() for t in self._tasks)

    def start(self) -> None:
        if not self._tasks:
            try:
                self._loop = asyncio.get_running_loop()
            except RuntimeError:  # (started outside a running loop: its tasks go to the current one)
                self._loop = None
            self._tasks = [
                asyncio.ensure_future(self._run("nodes", self.api.list_node, {})),
                asyncio.ensure_future(self._run("pods", self.api.list_pod_for_all_namespaces, {"field_selector": POD_FIELD_SELECTOR})),
            ]
            self._tasks += [asyncio.ensure_future(self._run(kind, method, {})) for kind, method in self._dra_methods().items()]
            self._tasks.append(asyncio.ensure_future(self._heartbeats()))

    async def _ask(self) -> None:
        """One cheap question: a node from the API server's cache (resourceVersion 0: no etcd read)."""
        resp = await self.api.list_node(limit=1, resource_version="0", _preload_content=False, _request_timeout=5)
        release = getattr(resp, "release", None)
        if release is not None:
            release()

    async def _heartbeats(self) -> None:
        """Every ``heartbeat`` seconds while the counts look live: does the API server still take a
        new connection? One that is refused or reset makes the counts not live (:meth:`call_failed`)
        before anyone tries to spawn; a slow answer is left alone (a loaded API server, not a missing one)."""
        while True:
            await asyncio.sleep(self.heartbeat)
            if not self.ready or self.unreachable or self.forbidden:
                continue  # the streams or the probe already know
            try:
                await self._ask()
            except TimeoutError:
                continue
            except (aiohttp.ClientConnectionError, ConnectionError) as exc:
                self.call_failed(f"{type(exc).__name__}: {exc}", self._ask)
            except Exception as exc:  # an HTTP error is an answer: the API server is there
                log.debug("inventory: heartbeat answered %s", exc)

    async def stop(self) -> None:
        if self._probe_task is not None:
            self._probe_task.cancel()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def wait_ready(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._ready_event.wait(), timeout)
        except TimeoutError:
            return False
        return self.ready

    async def wait_answered(self, timeout: float) -> Health:
        """Wait (at most ``timeout`` s) until the API server has answered once, then say how things are.

        Returns at once after the first sync or the first failure: a cluster that cannot
        be reached never makes a caller wait longer than it takes to find that out.
        """
        if not self._answered.is_set():
            try:
                await asyncio.wait_for(self._answered.wait(), timeout)
            except TimeoutError:
                pass
        return self.health

    def _set_synced(self, kind: str, value: bool) -> None:
        if self._optional_synced(kind, value):
            return
        self._synced[kind] = value
        if value:
            self._answers_again()  # a list was answered
        if self.ready:
            self._ever_ready = True
            self._lost_at = None
            self._ready_event.set()
            self._answered.set()
        else:
            if self._ever_ready and self._lost_at is None:
                self._lost_at = time.time()
            self._ready_event.clear()
            if not value:
                self._answered.set()

    def _allowed(self, kind: str) -> None:
        """The ``kind`` stream's watch was accepted: it may read what it needs (again)."""
        if kind in self._forbidden_streams:
            self._forbidden_streams.discard(kind)
            if not self._forbidden_streams:
                self.forbidden = ""
                log.info("inventory: the hub may %s now; free counts are live", NEEDED_PERMISSIONS)

    def _refused(self, kind: str, refused: Refused) -> None:
        """A 403: say it once (one error for both streams), and let nobody wait."""
        self._forbidden_streams.add(kind)
        if not self.forbidden:
            self.forbidden = forbidden_message(refused)
            log.error("%s", self.forbidden)
        self._set_synced(kind, False)

    async def _list(
        self, kind: str, method: ListCall, kwargs: dict[str, Any], page: Callable[[list[dict[str, Any]]], None]
    ) -> tuple[int, str]:
        """List ``kind`` page by page, handing each page's items to ``page`` as it comes (nothing
        here keeps them): how many there were, and the list's resourceVersion."""
        count = 0
        cont = None
        while True:
            extra: dict[str, Any] = {"_continue": cont} if cont else {}
            resp = await method(limit=self.page_size, _preload_content=False, _request_timeout=60, **kwargs, **extra)
            await raise_for_status(resp, f"listing {_STREAM_WHAT[kind]}")
            body = json.loads(await resp.read())
            items = body.get("items") or []
            count += len(items)
            page(items)
            cont = (body.get("metadata") or {}).get("continue")
            if not cont:
                return count, body["metadata"]["resourceVersion"]

    async def _relist(self, kind: str, method: ListCall, kwargs: dict[str, Any]) -> tuple[int, str]:
        """A (re)list of ``kind`` put in the index. The pods (the most, and the largest, objects of a
        cluster) go in page by page as slim facts, the raw pages dropped at once; the relist still
        replaces them all at its end (a pod gone between two lists is gone; a list that fails part
        way leaves the index as it was)."""
        if kind == "pods":
            self.index.begin_pods()
            count, version = await self._list(kind, method, kwargs, self.index.add_pods)
            self.index.end_pods()
            return count, version
        items: list[dict[str, Any]] = []
        count, version = await self._list(kind, method, kwargs, items.extend)
        self._replace(kind, items)
        return count, version

    def _apply(self, kind: str) -> Callable[[str, Mapping[str, Any]], None]:
        if kind in ("nodes", "pods"):  # (the index says itself when one changed a count: ClusterIndex.changes)
            return {"nodes": self.index.node_event, "pods": self.index.pod_event}[kind]
        dra = self.index.dra
        apply = (
            partial(self.index.pools.event, kind)
            if kind in POOL_STREAMS
            else self.index.kueue.event(kind)
            if kind in KUEUE_STREAMS
            else {"slices": dra.slice_event, "classes": dra.class_event, "claims": dra.claim_event, "rules": dra.rule_event}[kind]
        )
        changed = self.index.changed

        def applied(event: str, obj: Mapping[str, Any]) -> None:
            apply(event, obj)
            changed()  # a DRA or Kueue figure the page shows may have moved

        return applied

    def _replace(self, kind: str, items: list[dict[str, Any]]) -> None:
        if kind in ("nodes", "pods"):
            self.index.replace(**{kind: items})
        elif kind in KUEUE_STREAMS:
            self.index.kueue.replace(kind, items)
        elif kind in POOL_STREAMS:
            self.index.pools.replace(kind, items)
        else:
            self.index.dra.replace(**{kind: items})
        self.index.changed()

    async def _run(self, kind: str, method: ListCall, kwargs: dict[str, Any]) -> None:
        apply = self._apply(kind)
        backoff = 0.2
        listed_before: set[str] = set()
        while True:
            try:
                started = time.monotonic()
                count, version = await self._relist(kind, method, kwargs)
                self.relists[kind] += 1
                listed_before.add(kind)
                self._set_synced(kind, True)
                log.info("inventory: listed %d %s in %.2fs", count, kind, time.monotonic() - started)
                backoff = 0.2
                while True:  # watch until the server ends it, then resume from the last version
                    resumed = await self._watch(kind, method, kwargs, version, apply)
                    if resumed is None:
                        break  # 410 Gone: relist
                    version = resumed
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the API server went away, refused, or answered garbage: reconnect
                # A stream that was served before and is refused now most likely meets an API server that
                # is starting (its APIs and authorizer not all ready yet): asked again as after a failure,
                # not after forbidden_retry, so its counts do not stay unknown a minute after an outage.
                refusal_wait = min(backoff, self.forbidden_retry) if kind in listed_before else self.forbidden_retry
                optional = await self._optional_failed(kind, exc, backoff, refusal_wait)
                if optional is not None:  # (DRA's, Kueue's, Karpenter's: hub.optionalstreams)
                    backoff = optional
                    continue
                self.stream_failures += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                if isinstance(exc, Refused) and exc.status == 403:
                    self._refused(kind, exc)
                    log.debug("inventory: %s refused (%s); asking again in %.0fs", kind, exc, refusal_wait)
                    await asyncio.sleep(refusal_wait)
                    backoff = min(backoff * 2, 10.0)
                    continue
                self._set_synced(kind, False)
                log.warning("inventory: %s stream failed (%s); retrying in %.1fs", kind, self.last_error, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)

    async def _watch(
        self, kind: str, method: ListCall, kwargs: dict[str, Any], version: str, apply: Callable[[str, Mapping[str, Any]], None]
    ) -> str | None:
        resp = await method(
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=240,
            _preload_content=False,
            _request_timeout=300,
            **kwargs,
        )
        await raise_for_status(resp, f"watching {_STREAM_WHAT[kind]}")
        if not self._optional_allowed(kind):
            self._allowed(kind)
        # One event may come in many chunks (a large object on a slow link): the bytes are appended in
        # place and split only when a chunk ends a line, so a long event or a long burst costs linear time.
        buffer = bytearray()
        try:
            async for chunk in resp.content.iter_any():
                self.heard_at = time.monotonic()
                buffer += chunk
                if b"\n" not in chunk:
                    continue
                *lines, rest = buffer.split(b"\n")
                buffer = bytearray(rest)
                for line in lines:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    obj = event.get("object") or {}
                    kind = event.get("type")
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            return None
                        raise RuntimeError(f"watch error: {obj.get('message')}")
                    version = (obj.get("metadata") or {}).get("resourceVersion") or version
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        apply(kind, obj)
        finally:
            resp.release()
        return version
