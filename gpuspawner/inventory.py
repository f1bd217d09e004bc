"""Live GPU inventory: one list-then-watch cache of Nodes and Pods per hub process.

Two layers:

* :class:`ClusterIndex` (pure, no I/O): the slim facts the counts need — each node's
  labels, taints, cordon and allocatable (GPUs, cpu, memory, pods); each bound
  non-terminal pod's requests (GPUs, cpu, memory, and the one pod it is) — and, per
  tracked offering, capacity and free units kept up to date *per event*: an event
  touches one node, and only that node's rows are recomputed. A page view reads ready
  numbers. The counts are the scheduler's (:mod:`gpuspawner.capacity`), for the pod the
  hub makes: :meth:`ClusterIndex.set_notebook` gives the notebook's own cpu and memory
  guarantees, selector and tolerations.
* :class:`Inventory`: feeds the index from the API server with kubernetes_asyncio
  (list, then watch from the list's resourceVersion; relist on ``410 Gone``;
  reconnect with backoff when the API server goes away). ``ready`` is true while
  both streams are synced; :attr:`Inventory.health` says, without waiting, how old
  the counts are and why when they are not live (the spawn page shows it, spawns
  are refused with it).

RBAC it needs, and nothing more: ``get``, ``list``, ``watch`` on ``nodes`` and
``list``, ``watch`` on ``pods`` (cluster-wide: pods of other namespaces use GPUs, cpu,
memory and pod slots too); charts/gpuspawner grants exactly that. Without it (a stock
zero-to-jupyterhub hub) the API server answers 403: the inventory logs one error naming
the missing permissions, says so in :attr:`Inventory.forbidden` and ``health.forbidden``
(nobody waits for counts that cannot come; pods can still be made), and tries again
every ``forbidden_retry`` seconds, quietly, so that granting them later makes the counts
live without a hub restart.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from .capacity import NO_NOTEBOOK, UNCOUNTED, Availability, Row, Tally, holds_resources, pod_requests
from .discovery import DEFAULT_VGPU_CLASS_LABELS, NodeFacts, aggregate, node_offerings
from .notebook import Notebook
from .offerings import Kind, Offering

log = logging.getLogger("gpuspawner.inventory")

#: Only pods that hold node resources matter; the API server filters the rest out.
POD_FIELD_SELECTOR = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
#: What the hub's ServiceAccount must be allowed for the counts (said in the log when it is not).
NEEDED_PERMISSIONS = "list/watch nodes, list/watch pods (cluster-wide)"
_STREAM_WHAT = {"nodes": "nodes", "pods": "pods in all namespaces"}
USER_LABEL = "hub.jupyter.org/username"
OFFERING_LABEL = "gpuspawner.io/offering"
#: Pods of a cluster ask for few distinct request sets: each is kept once.
_INTERNED: dict[tuple, Mapping[str, int]] = {}
_INTERN_LIMIT = 50_000


def _interned(requests: dict[str, int]) -> Mapping[str, int]:
    key = tuple(sorted(requests.items()))
    found = _INTERNED.get(key)
    if found is None:
        if len(_INTERNED) >= _INTERN_LIMIT:
            return requests
        found = _INTERNED[key] = requests
    return found


@dataclass(frozen=True, slots=True)
class PodFacts:
    """What the counts need of one pod (never the whole object)."""

    node: str
    requests: Mapping[str, int]
    user: str | None = None
    offering: str | None = None

    @classmethod
    def from_pod(cls, pod: Mapping[str, Any]) -> "PodFacts | None":
        if not holds_resources(pod):
            return None
        labels = (pod.get("metadata") or {}).get("labels") or {}
        return cls(node=pod["spec"]["nodeName"], requests=_interned(pod_requests(pod)),
                   user=labels.get(USER_LABEL), offering=labels.get(OFFERING_LABEL))


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


class _OfferingRows:
    """Capacity, allocated and free units of one offering, per node and in total."""

    __slots__ = ("offering", "tally", "rows", "reach", "capacity", "allocated", "free", "largest_hist", "_cached")

    def __init__(self, offering: Offering, notebook: Notebook):
        self.offering = offering
        self.tally = Tally(offering, notebook)
        self.rows: dict[str, Row] = {}
        #: node -> whether the offering's pod may land there at all (pod events do not change it)
        self.reach: dict[str, bool] = {}
        self.capacity = self.allocated = self.free = 0
        self.largest_hist: Counter[int] = Counter()
        self._cached: Availability | None = None

    def set(self, node: str, row: Row | None) -> None:
        old = self.rows.pop(node, None)
        if old == row and row is not None:
            self.rows[node] = row
            return
        self._cached = None
        if old is not None:
            self.capacity -= old[0]
            self.allocated -= old[1]
            self.free -= old[2]
            self.largest_hist[old[3]] -= 1
        if row is not None:
            self.rows[node] = row
            self.capacity += row[0]
            self.allocated += row[1]
            self.free += row[2]
            self.largest_hist[row[3]] += 1

    def availability(self) -> Availability:
        """Cached until a row changes: a page view costs nothing per node."""
        if self._cached is None:
            largest = max((f for f, n in self.largest_hist.items() if n > 0), default=0)
            self._cached = Availability(
                capacity=self.capacity, allocated=self.allocated, free=self.free,
                largest_free=largest, nodes=tuple(sorted(self.rows)),
            )
        return self._cached


class ClusterIndex:
    """The incremental, pure part of the inventory."""

    def __init__(self, vgpu_class_labels: Iterable[str] = DEFAULT_VGPU_CLASS_LABELS):
        self.class_labels = tuple(vgpu_class_labels)
        self.notebook: Notebook = NO_NOTEBOOK
        self.nodes: dict[str, NodeFacts] = {}
        self.pods: dict[str, PodFacts] = {}
        self.used: dict[str, Counter[str]] = {}
        self.reservations: dict[str, tuple[str, Mapping[str, int]]] = {}
        self.tracked: dict[str, _OfferingRows] = {}
        self._node_offers: dict[str, list[tuple[Offering, int]]] = {}
        self._discovered: list[Offering] | None = []

    # ------------------------------------------------------------------ reads

    def discovered(self) -> list[Offering]:
        """Discovered offerings of the current nodes (recomputed only after a change in them)."""
        if self._discovered is None:
            self._discovered = aggregate(self._node_offers.values())
        return self._discovered

    def availability(self, offering: Offering) -> Availability:
        """Capacity and free units of ``offering`` now (reservations count as taken)."""
        if not offering.resources:
            return UNCOUNTED
        rows = self.tracked.get(offering.slug)
        if rows is None or rows.offering != offering:
            rows = self._track(offering)
        return rows.availability()

    # ------------------------------------------------------------------ writes

    def set_notebook(self, notebook: Notebook) -> None:
        """The hub's notebook pod (cpu/memory guarantees, selector, tolerations): every count fits it beside the GPU."""
        if notebook != self.notebook:
            self.notebook = notebook
            for slug in list(self.tracked):
                self._track(self.tracked[slug].offering)

    def replace(self, nodes: Iterable[Mapping[str, Any]] | None = None, pods: Iterable[Mapping[str, Any]] | None = None) -> None:
        """A (re)list: replace all nodes and/or all pods, then recompute every row."""
        if nodes is not None:
            self.nodes = {}
            self._node_offers = {}
            for raw in nodes:
                facts = NodeFacts.from_node(raw)
                self.nodes[facts.name] = facts
                self._node_offers[facts.name] = list(node_offerings(facts, self.class_labels))
            self._discovered = None
        if pods is not None:
            self.pods = {}
            self.used = {}
            for raw in pods:
                facts = PodFacts.from_pod(raw)
                if facts is not None:
                    key = pod_key(raw)
                    self.pods[key] = facts
                    self._add_use(facts.node, facts.requests, +1)
                    self.reservations.pop(key, None)
            for node, requests in self.reservations.values():
                self._add_use(node, requests, +1)
        for slug in list(self.tracked):
            self._track(self.tracked[slug].offering)

    def node_event(self, kind: str, raw: Mapping[str, Any]) -> None:
        name = (raw.get("metadata") or {}).get("name", "")
        old_slugs = {o.slug for o, _ in self._node_offers.get(name, ())}
        if kind == "DELETED":
            self.nodes.pop(name, None)
            offers = self._node_offers.pop(name, [])
        else:
            facts = NodeFacts.from_node(raw)
            old = self.nodes.get(name)
            self.nodes[name] = facts
            if old == facts:
                return  # a status heartbeat: nothing the counts use changed
            offers = list(node_offerings(facts, self.class_labels))
            self._node_offers[name] = offers
        for rows in self.tracked.values():
            rows.reach.pop(name, None)
        new_slugs = {o.slug for o, _ in offers} if kind != "DELETED" else set()
        if new_slugs != old_slugs or any(o.kind is Kind.FULL for o, _ in offers):
            self._discovered = None
        self._refresh_node(name)

    def pod_event(self, kind: str, raw: Mapping[str, Any]) -> None:
        key = pod_key(raw)
        old = self.pods.pop(key, None)
        new = None if kind == "DELETED" else PodFacts.from_pod(raw)
        if old == new:
            if new is not None:
                self.pods[key] = new
            return
        touched = set()
        if old is not None:
            self._add_use(old.node, old.requests, -1)
            touched.add(old.node)
        if new is not None:
            self.pods[key] = new
            self._add_use(new.node, new.requests, +1)
            touched.add(new.node)
            # The pod is bound: its requests now count, so its reservation goes.
            reserved = self.reservations.pop(key, None)
            if reserved is not None:
                self._add_use(reserved[0], reserved[1], -1)
                touched.add(reserved[0])
        for node in touched:
            self._refresh_node(node)

    def reserve(self, key: str, offering: Offering, count: int) -> str | None:
        """Hold ``count`` units of ``offering`` for the pod ``key`` until it is bound (or released).

        The units (and the notebook's cpu, memory and pod slot) are taken on the node with
        the most free room for them, so every offering that shares that node sees them
        taken. Returns the node, or None if no node has room (nothing is held then).
        """
        self.release(key)
        self.availability(offering)
        rows = self.tracked[offering.slug].rows
        fits = [(largest, free, node) for node, (_cap, _alloc, free, largest) in rows.items() if largest >= count]
        if not fits:
            return None
        *_, node = max(fits)
        requests = dict(self.notebook.requests)
        for name, amount in offering.limits_for(count).items():
            requests[name] = requests.get(name, 0) + amount
        self.reservations[key] = (node, requests)
        self._add_use(node, requests, +1)
        self._refresh_node(node)
        return node

    def release(self, key: str) -> None:
        reserved = self.reservations.pop(key, None)
        if reserved is not None:
            self._add_use(reserved[0], reserved[1], -1)
            self._refresh_node(reserved[0])

    # ------------------------------------------------------------------ internals

    def _add_use(self, node: str, requests: Mapping[str, int], sign: int) -> None:
        bucket = self.used.setdefault(node, Counter())
        for name, amount in requests.items():
            bucket[name] += sign * amount
            if not bucket[name]:
                del bucket[name]

    def _row(self, rows: _OfferingRows, node: str) -> Row | None:
        facts = self.nodes.get(node)
        if facts is None:
            return None
        reached = rows.reach.get(node)
        if reached is None:
            reached = rows.reach[node] = rows.tally.reaches(facts)
        return rows.tally.row(facts, self.used.get(node, {}), reached)

    def _refresh_node(self, node: str) -> None:
        for rows in self.tracked.values():
            rows.set(node, self._row(rows, node))

    def _track(self, offering: Offering) -> _OfferingRows:
        rows = _OfferingRows(offering, self.notebook)
        for node in self.nodes:
            row = self._row(rows, node)
            if row is not None:
                rows.set(node, row)
        self.tracked[offering.slug] = rows
        return rows


class Refused(Exception):
    """The API server answered a list or watch with an HTTP error (not a stream)."""

    def __init__(self, status: int, what: str, message: str):
        super().__init__(f"{status} {what}: {message}")
        self.status = status
        self.what = what


async def _raise_for_status(resp: Any, what: str) -> None:
    """Raw (``_preload_content=False``) answers are not checked by kubernetes_asyncio: do it here."""
    status = getattr(resp, "status", 200)
    if status < 400:
        return
    try:
        message = json.loads(await resp.read()).get("message") or ""
    except (ValueError, AttributeError):
        message = ""
    finally:
        release = getattr(resp, "release", None)
        if release is not None:
            release()
    raise Refused(status, what, message[:300])


def forbidden_message(refused: Refused) -> str:
    """The one error a hub without the inventory's RBAC logs: what is missing, and the fix."""
    return (
        f"GPUSpawner cannot count free GPUs: the hub's service account may not {NEEDED_PERMISSIONS} "
        f"(the API server answered {refused.status} to {refused.what}). Install charts/gpuspawner beside "
        "zero-to-jupyterhub (see its README), or bind a ClusterRole with those permissions to the hub's "
        "service account. Until then the spawn page shows 'free count unavailable', GPU offerings are not "
        "discovered, and spawns go ahead without a capacity check."
    )


@dataclass(frozen=True)
class Health:
    """How far the counts can be trusted now. Read without waiting.

    ``ready``: both streams are synced, the counts are live. Otherwise ``answered``
    says whether the API server has answered (or failed) at all since this process
    started, ``as_of`` is the wall-clock time (``time.time()``) at which the counts
    were last live (None: never), and ``error`` the last failure, for the log.
    ``forbidden``: the API server answers, but the hub may not list/watch nodes and pods
    (its RBAC; the logged message): there are no counts, yet pods can be made.
    """

    ready: bool
    answered: bool = True
    as_of: float | None = None
    error: str = ""
    forbidden: str = ""


class Inventory:
    """Keeps a :class:`ClusterIndex` in sync with the API server (list, then watch)."""

    _instances: dict[str, "Inventory"] = {}

    def __init__(
        self,
        api: Any,
        vgpu_class_labels: Iterable[str] = DEFAULT_VGPU_CLASS_LABELS,
        page_size: int = 500,
        forbidden_retry: float = 60.0,
    ):
        self.api = api
        self.index = ClusterIndex(vgpu_class_labels)
        self.page_size = page_size
        self.forbidden_retry = forbidden_retry
        self._synced = {"nodes": False, "pods": False}
        self._tasks: list[asyncio.Task] = []
        self._ready_event = asyncio.Event()
        self._answered = asyncio.Event()  # set by the first sync or the first failure
        self._lost_at: float | None = None  # when the counts stopped being live (None: live, or never were)
        self._ever_ready = False
        self.relists = Counter()
        self.last_error: str = ""
        #: How often a stream has failed (the API server gone, say): others use it to notice outages.
        self.stream_failures = 0
        #: Why the hub may not read the cluster (its RBAC), as logged once; "" when it may.
        self.forbidden: str = ""
        self._forbidden_streams: set[str] = set()

    @classmethod
    def shared(cls, api: Any, vgpu_class_labels: Iterable[str] = DEFAULT_VGPU_CLASS_LABELS) -> "Inventory":
        """The one inventory of this process for the API server ``api`` talks to (started on first use)."""
        host = getattr(getattr(api, "api_client", None), "configuration", None)
        key = getattr(host, "host", "default")
        inventory = cls._instances.get(key)
        if inventory is None or inventory.stopped:
            inventory = cls._instances[key] = cls(api, vgpu_class_labels)
            inventory.start()
        return inventory

    @classmethod
    def running(cls, api: Any) -> "Inventory | None":
        """This process's inventory for ``api``'s API server if one runs (never starts one)."""
        host = getattr(getattr(api, "api_client", None), "configuration", None)
        inventory = cls._instances.get(getattr(host, "host", "default"))
        return inventory if inventory is not None and not inventory.stopped else None

    @property
    def ready(self) -> bool:
        return all(self._synced.values())

    @property
    def health(self) -> Health:
        if self.ready and not self.forbidden:
            return Health(ready=True)
        return Health(
            ready=False, answered=self._answered.is_set(), as_of=self._lost_at, error=self.last_error,
            forbidden=self.forbidden,
        )

    @property
    def stopped(self) -> bool:
        return bool(self._tasks) and all(t.done() for t in self._tasks)

    def start(self) -> None:
        if not self._tasks:
            self._tasks = [
                asyncio.ensure_future(self._run("nodes", self.api.list_node, {})),
                asyncio.ensure_future(
                    self._run("pods", self.api.list_pod_for_all_namespaces, {"field_selector": POD_FIELD_SELECTOR})
                ),
            ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def wait_ready(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._ready_event.wait(), timeout)
        except asyncio.TimeoutError:
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
            except asyncio.TimeoutError:
                pass
        return self.health

    def _set_synced(self, kind: str, value: bool) -> None:
        self._synced[kind] = value
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

    async def _list(self, kind: str, method, kwargs: dict) -> tuple[list[dict], str]:
        items: list[dict] = []
        cont = None
        while True:
            extra = {"_continue": cont} if cont else {}
            resp = await method(limit=self.page_size, _preload_content=False, _request_timeout=60, **kwargs, **extra)
            await _raise_for_status(resp, f"listing {_STREAM_WHAT[kind]}")
            body = json.loads(await resp.read())
            items.extend(body.get("items") or [])
            cont = (body.get("metadata") or {}).get("continue")
            if not cont:
                return items, body["metadata"]["resourceVersion"]

    async def _run(self, kind: str, method, kwargs: dict) -> None:
        apply = self.index.node_event if kind == "nodes" else self.index.pod_event
        backoff = 0.2
        while True:
            try:
                started = time.monotonic()
                items, version = await self._list(kind, method, kwargs)
                self.index.replace(**{kind: items})
                self.relists[kind] += 1
                self._set_synced(kind, True)
                log.info("inventory: listed %d %s in %.2fs", len(items), kind, time.monotonic() - started)
                backoff = 0.2
                while True:  # watch until the server ends it, then resume from the last version
                    version = await self._watch(kind, method, kwargs, version, apply)
                    if version is None:
                        break  # 410 Gone: relist
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the API server went away, refused, or answered garbage: reconnect
                self.stream_failures += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                if isinstance(exc, Refused) and exc.status == 403:
                    self._refused(kind, exc)
                    log.debug("inventory: %s refused (%s); asking again in %.0fs", kind, exc, self.forbidden_retry)
                    await asyncio.sleep(self.forbidden_retry)
                    continue
                self._set_synced(kind, False)
                log.warning("inventory: %s stream failed (%s); retrying in %.1fs", kind, self.last_error, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)

    async def _watch(self, kind: str, method, kwargs: dict, version: str, apply) -> str | None:
        resp = await method(
            watch=True, resource_version=version, allow_watch_bookmarks=True, timeout_seconds=240,
            _preload_content=False, _request_timeout=300, **kwargs,
        )
        await _raise_for_status(resp, f"watching {_STREAM_WHAT[kind]}")
        self._allowed(kind)
        buffer = b""
        try:
            async for chunk in resp.content.iter_any():
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
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
