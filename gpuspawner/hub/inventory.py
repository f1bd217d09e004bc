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

Dynamic Resource Allocation adds three more streams (``resource.k8s.io/v1``:
``resourceslices``, ``deviceclasses`` and ``resourceclaims`` in all namespaces, ``list`` and
``watch``). They never hold up the node and pod counts: a cluster that does not serve the
API (404) or a hub that may not read it (403) has DRA offerings without free counts, said
once in the log, and the streams are asked again every ``forbidden_retry`` seconds. Without it (a stock
zero-to-jupyterhub hub) the API server answers 403: the inventory logs one error naming
the missing permissions, says so in :attr:`Inventory.forbidden` and ``health.forbidden``
(nobody waits for counts that cannot come; pods can still be made), and tries again
every ``forbidden_retry`` seconds, quietly, so that granting them later makes the counts
live without a hub restart.

Where ``c.GPUSpawner.kueue_queues`` sends servers through Kueue, :meth:`Inventory.watch_kueue`
adds four more (``kueue.x-k8s.io/v1beta2``: ``localqueues`` in the hub's namespace, or in all
namespaces with user namespaces; ``clusterqueues``, ``resourceflavors`` and ``cohorts``, which
borrowing within a cohort reads; ``list`` and ``watch``), kept in :attr:`ClusterIndex.kueue` (:mod:`gpuspawner.capacity.kueuequota`) so the
spawn page reads what each queue still admits without a request. Like DRA's they are
optional: Kueue not installed (404) or not readable (403) leaves each queue's limit unknown
(the page says so, the nodes' counts stand), said once in the log and asked again every
``forbidden_retry`` seconds.

Where ``discover_offerings`` is on, :meth:`Inventory.watch_pools` adds two more: Karpenter's
NodePools and NodeClaims (``karpenter.sh/v1``, ``list`` and ``watch``), kept in
:attr:`ClusterIndex.pools` (:mod:`gpuspawner.capacity.karpenterpools`): a pool with no node yet has its
offering. Optional too: not served (404) or not readable (403), discovery is as without them, said
in one log line, and asked again every ``forbidden_retry`` seconds; a stream that fails otherwise
keeps what it last read.

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
from gpuspawner.capacity.karpenterpools import GROUP as POOL_GROUP
from gpuspawner.capacity.karpenterpools import NODECLAIMS, NODEPOOLS
from gpuspawner.capacity.karpenterpools import STREAMS as POOL_STREAMS
from gpuspawner.capacity.karpenterpools import VERSION as POOL_VERSION
from gpuspawner.capacity.kueuequota import STREAMS as KUEUE_STREAMS
from gpuspawner.names.kueuenames import CLUSTER_QUEUES, COHORTS, GROUP, LOCAL_QUEUES, RESOURCE_FLAVORS, VERSION
from gpuspawner.offerings.discovery import DEFAULT_VGPU_CLASS_LABELS

log = logging.getLogger("gpuspawner.hub.inventory")

#: A list (or, with ``watch=True``, watch) call of kubernetes_asyncio's API clients, made with
#: ``_preload_content=False``: it answers the raw response, which the client's hints do not say.
ListCall = Callable[..., Awaitable[Any]]

#: Only pods that hold node resources matter; the API server filters the rest out.
POD_FIELD_SELECTOR = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
#: What the hub's ServiceAccount must be allowed for the counts (said in the log when it is not).
NEEDED_PERMISSIONS = "list/watch nodes, list/watch pods (cluster-wide)"
_STREAM_WHAT = {
    "nodes": "nodes",
    "pods": "pods in all namespaces",
    "slices": "resourceslices",
    "classes": "deviceclasses",
    "claims": "resourceclaims in all namespaces",
    "rules": "devicetaintrules",
    LOCAL_QUEUES: f"{LOCAL_QUEUES}.{GROUP}",
    CLUSTER_QUEUES: f"{CLUSTER_QUEUES}.{GROUP}",
    RESOURCE_FLAVORS: f"{RESOURCE_FLAVORS}.{GROUP}",
    COHORTS: f"{COHORTS}.{GROUP}",
    NODEPOOLS: f"{NODEPOOLS}.{POOL_GROUP}",
    NODECLAIMS: f"{NODECLAIMS}.{POOL_GROUP}",
}
#: The Dynamic Resource Allocation streams (optional: see the module's docstring).
DRA_STREAMS = ("slices", "classes", "claims", "rules")
#: DeviceTaintRules (resource.k8s.io/v1 from Kubernetes 1.37): a cluster that does not serve them (404) or a
#: hub that may not read them (403) has none as far as the counts go; the other DRA streams count as before.
TAINT_RULES_PATH = "/apis/resource.k8s.io/v1/devicetaintrules"
NEEDED_DRA_PERMISSIONS = "list/watch resourceslices, deviceclasses and resourceclaims (resource.k8s.io/v1, cluster-wide)"
NEEDED_KUEUE_PERMISSIONS = f"list/watch {LOCAL_QUEUES}, {CLUSTER_QUEUES}, {RESOURCE_FLAVORS} and {COHORTS} ({GROUP}/{VERSION})"
#: Why a queue's limit is unknown where Kueue's API is not served (404) or may not be read (403).
KUEUE_NOT_SERVED = f"Kueue is not installed (the API server does not serve {GROUP}/{VERSION})"
KUEUE_FORBIDDEN = f"the hub may not read Kueue's queues ({NEEDED_KUEUE_PERMISSIONS})"
#: Why Karpenter's pools are not read: not served (404) or not readable (403).
POOLS_NOT_SERVED = f"the API server does not serve {POOL_GROUP}/{POOL_VERSION} (Karpenter is not installed)"
POOLS_FORBIDDEN = (
    f"the hub may not list/watch {NODEPOOLS} and {NODECLAIMS} ({POOL_GROUP}; the gpuspawner chart grants it with karpenter.enabled=true)"
)


def custom_api(api: Any) -> Any:
    """Kubernetes' custom objects API on the same connection as ``api`` (None for a stand-in without one)."""
    client = getattr(api, "api_client", None)
    if client is None:
        return None
    from kubernetes_asyncio.client import CustomObjectsApi

    return CustomObjectsApi(client)


def _resource_api(api: Any) -> Any:
    """``resource.k8s.io/v1`` on the same connection as ``api`` (None for a stand-in without one)."""
    client = getattr(api, "api_client", None)
    if client is None:
        return None
    from kubernetes_asyncio.client import ResourceV1Api

    return ResourceV1Api(client)


def _taint_rules_lister(dra_api: Any) -> Any:
    """A list/watch method for ``resource.k8s.io/v1`` DeviceTaintRules, in the generated methods' shape
    (kubernetes_asyncio's ResourceV1Api predates them); None for a stand-in that has neither."""
    own = getattr(dra_api, "list_device_taint_rule", None)
    client = getattr(dra_api, "api_client", None)
    if own is not None or client is None:
        return own
    names = {
        "limit": "limit",
        "_continue": "continue",
        "watch": "watch",
        "resource_version": "resourceVersion",
        "allow_watch_bookmarks": "allowWatchBookmarks",
        "timeout_seconds": "timeoutSeconds",
    }

    async def list_device_taint_rule(**kwargs: Any) -> Any:
        query = [(wire, kwargs[name]) for name, wire in names.items() if kwargs.get(name) is not None]
        return await client.call_api(
            TAINT_RULES_PATH,
            "GET",
            {},
            query,
            {"Accept": "application/json"},
            auth_settings=["BearerToken"],
            response_types_map={},
            _preload_content=False,
            _request_timeout=kwargs.get("_request_timeout"),
        )

    return list_device_taint_rule


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


class Inventory:
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
        self.api = api
        #: Seconds between the inventory's own questions while the counts look live (see the module's docstring).
        self.heartbeat = heartbeat
        #: Kubernetes' custom objects API for Kueue's kinds (None: a stand-in without one).
        self.kueue_api = kueue_api if kueue_api is not None else custom_api(api)
        self._kueue_started = False
        self._kueue_refusals: dict[str, str] = {}  # stream -> why it may not be read
        self._pools_started = False
        self._pools_said: set[str] = set()  # why Karpenter's pools are not read, as logged (each once)
        #: The resource.k8s.io/v1 API (None: no DRA streams; DRA offerings then have no counts).
        self.dra_api = dra_api if dra_api is not None else _resource_api(api)
        self._dra_synced = dict.fromkeys(DRA_STREAMS, False)
        self._dra_unavailable = ""
        self._rules_said = False
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
        #: How often an optional stream was refused (403, 404): Karpenter's, by stream.
        self.refusals: Counter[str] = Counter()
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
            if self.dra_api is not None:
                methods = {
                    "slices": self.dra_api.list_resource_slice,
                    "classes": self.dra_api.list_device_class,
                    "claims": self.dra_api.list_resource_claim_for_all_namespaces,
                }
                rules = _taint_rules_lister(self.dra_api)
                if rules is not None:
                    methods["rules"] = rules
                else:
                    self._set_synced("rules", True)  # a stand-in without them: no rules
                self._tasks += [asyncio.ensure_future(self._run(kind, method, {})) for kind, method in methods.items()]
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

    def watch_kueue(self, namespace: str | None) -> None:
        """Start watching Kueue's LocalQueues (in ``namespace``; None: all namespaces), ClusterQueues,
        ResourceFlavors and Cohorts, once (the spawner calls it where ``kueue_queues`` is set)."""
        if self._kueue_started or self.kueue_api is None or not self._tasks:
            return
        self._kueue_started = True
        custom = self.kueue_api
        if namespace:
            local = partial(custom.list_namespaced_custom_object, GROUP, VERSION, namespace, LOCAL_QUEUES)
        else:
            local = partial(custom.list_cluster_custom_object, GROUP, VERSION, LOCAL_QUEUES)
        methods = {
            LOCAL_QUEUES: local,
            CLUSTER_QUEUES: partial(custom.list_cluster_custom_object, GROUP, VERSION, CLUSTER_QUEUES),
            RESOURCE_FLAVORS: partial(custom.list_cluster_custom_object, GROUP, VERSION, RESOURCE_FLAVORS),
            COHORTS: partial(custom.list_cluster_custom_object, GROUP, VERSION, COHORTS),
        }
        self._tasks += [asyncio.ensure_future(self._run(kind, method, {})) for kind, method in methods.items()]

    def watch_pools(self) -> None:
        """Start watching Karpenter's NodePools and NodeClaims, once (the catalog calls it where
        ``discover_offerings`` is on): a pool with no node yet has its offering (capacity.karpenterpools)."""
        if self._pools_started or self.kueue_api is None or not self._tasks:
            return
        self._pools_started = True
        list_all = self.kueue_api.list_cluster_custom_object
        self._tasks += [
            asyncio.ensure_future(self._run(kind, partial(list_all, POOL_GROUP, POOL_VERSION, kind), {})) for kind in POOL_STREAMS
        ]

    def _pools_refused(self, kind: str, refused: Refused) -> None:
        """Karpenter's CRDs absent (404) or not readable (403): discovery is as without them (its
        NodeClaims alone: the pools' nodes are counted from the nodes). One log line per reason."""
        self.index.pools.synced[kind] = False
        self.refusals[kind] += 1
        why = POOLS_NOT_SERVED if refused.status == 404 else POOLS_FORBIDDEN
        self.index.pools.unavailable = why
        self.index.changed()
        if why not in self._pools_said:
            self._pools_said.add(why)
            log.warning("inventory: Karpenter's pools are not read: %s; offerings come from the nodes and the settings as before", why)

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
        if kind in POOL_STREAMS:
            if value:  # (a stream that fails keeps what it last read: a pool does not vanish in a blip)
                self.index.pools.synced[kind] = True
                self.index.pools.unavailable = ""
                self.index.changed()
            return
        if kind in KUEUE_STREAMS:
            self.index.kueue.synced[kind] = value
            return
        if kind in DRA_STREAMS:
            self._dra_synced[kind] = value
            self.index.dra.synced = all(self._dra_synced.values())
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
            await _raise_for_status(resp, f"listing {_STREAM_WHAT[kind]}")
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

    def _dra_refused(self, kind: str, refused: Refused) -> None:
        """DRA not served (404) or not readable (403): DRA offerings go uncounted; the rest is untouched."""
        self._set_synced(kind, False)
        if not self._dra_unavailable:
            if refused.status == 404:
                self._dra_unavailable = "the API server does not serve resource.k8s.io/v1 (Kubernetes 1.34+ does)"
                log.info("inventory: %s; no DRA offerings are counted", self._dra_unavailable)
            else:
                self._dra_unavailable = f"the hub's service account may not {NEEDED_DRA_PERMISSIONS}"
                log.warning(
                    "GPUSpawner cannot count DRA devices: %s (the API server answered %d to %s). "
                    "Grant those permissions (the gpuspawner Helm chart's ClusterRole has them); until then DRA offerings show no free count.",
                    self._dra_unavailable,
                    refused.status,
                    refused.what,
                )

    def _rules_refused(self, refused: Refused) -> None:
        """DeviceTaintRules not served (before 1.37, or DRADeviceTaintRules off) or not readable: the counts
        go on without them (a device an admin's rule taints then looks free; the scheduler still refuses)."""
        if not self._rules_said:
            self._rules_said = True
            if refused.status == 404:
                log.info("inventory: the API server does not serve %s; device taints are read from ResourceSlices only", TAINT_RULES_PATH)
            else:
                log.warning(
                    "GPUSpawner cannot read DeviceTaintRules (the API server answered %d to %s): devices an admin's rule "
                    "taints are counted free. Grant list/watch on devicetaintrules (resource.k8s.io/v1, the gpuspawner chart's ClusterRole).",
                    refused.status,
                    refused.what,
                )
        self.index.dra.replace(rules=[])
        self._set_synced("rules", True)

    def _kueue_refused(self, kind: str, refused: Refused) -> None:
        """Kueue not served (404) or not readable (403): each queue's limit is unknown; the rest is
        untouched. Said once in the log until that stream may be read again."""
        self._set_synced(kind, False)
        why = KUEUE_NOT_SERVED if refused.status == 404 else KUEUE_FORBIDDEN
        said = self._kueue_refusals.get(kind)
        self._kueue_refusals[kind] = why
        self.index.kueue.unavailable = next(iter(self._kueue_refusals.values()))
        if said == why or why in [w for k, w in self._kueue_refusals.items() if k != kind]:
            return
        if refused.status == 404:
            log.warning("inventory: %s; the spawn page says each queue's limit is unknown", why)
        else:
            log.warning(
                "GPUSpawner cannot read Kueue's queues: %s (the API server answered %d to %s). Grant those "
                "permissions; until then the spawn page counts the nodes only and says each queue's limit is unknown.",
                why,
                refused.status,
                refused.what,
            )

    def _kueue_allowed(self, kind: str) -> None:
        """The ``kind`` stream's watch was accepted."""
        if self._kueue_refusals.pop(kind, None) is not None:
            self.index.kueue.unavailable = next(iter(self._kueue_refusals.values()), "")

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
                if kind == "rules" and isinstance(exc, Refused) and exc.status in (403, 404):
                    self._rules_refused(exc)
                    await asyncio.sleep(refusal_wait)
                    backoff = min(backoff * 2, 10.0)
                    continue
                if kind in DRA_STREAMS and isinstance(exc, Refused) and exc.status in (403, 404):
                    self._dra_refused(kind, exc)
                    await asyncio.sleep(refusal_wait)
                    backoff = min(backoff * 2, 10.0)
                    continue
                if kind in POOL_STREAMS and isinstance(exc, Refused) and exc.status in (403, 404):
                    self._pools_refused(kind, exc)
                    await asyncio.sleep(refusal_wait)
                    continue
                if kind in KUEUE_STREAMS or kind in POOL_STREAMS:  # these streams never touch the nodes' health or the outage count
                    if isinstance(exc, Refused) and exc.status in (403, 404):
                        self._kueue_refused(kind, exc)
                        await asyncio.sleep(refusal_wait)
                        backoff = min(backoff * 2, 10.0)
                        continue
                    self._set_synced(kind, False)
                    log.warning("inventory: %s stream failed (%s: %s); retrying in %.1fs", kind, type(exc).__name__, exc, backoff)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 10.0)
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
        await _raise_for_status(resp, f"watching {_STREAM_WHAT[kind]}")
        if kind in DRA_STREAMS:
            self._dra_unavailable = ""
        elif kind in KUEUE_STREAMS:
            self._kueue_allowed(kind)
        elif kind not in POOL_STREAMS:
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
