"""Orphaned GPU pods: pods GPUSpawner made that no server of this hub owns any more.

JupyterHub forgets a server when its stop ends, even when the spawner could not delete
the pod (``User.stop`` clears the server in a ``finally``). GPUSpawner's ``stop`` retries
a failed deletion for ``stop_retry_timeout`` seconds first, so an outage of the API server
keeps the server "stopping" rather than "stopped"; but a stop that gives up, or a hub that
restarts in the middle of one, leaves a pod that holds a GPU, counts as used, is invisible
to the culler (which works from the hub's servers) and cannot be stopped by its user.

:class:`OrphanReconciler` finds such pods and deletes them after a grace period: it lists
the pods that carry GPUSpawner's offering label (``vocabulary.LABEL_OFFERING``) in the
spawner's namespace, and asks the hub which servers exist. A pod whose user and server
(KubeSpawner's ``hub.jupyter.org/username`` and ``hub.jupyter.org/servername``
annotations) have no server in the hub (running, starting or stopping) -- or whose server
runs under another pod name -- is an orphan once it has been one for ``grace`` seconds, at
two looks at least ``grace`` apart.

Only this hub's pods are judged (README.md, "Stop and orphans"): the reconciler lists the
pods labelled with this hub's identity (``vocabulary.LABEL_HUB``, ``c.GPUSpawner.hub_id``, derived
and kept in the hub's database where not set: :mod:`gpuspawner.hub.hubid`) and those that carry
no hub's identity but a user key (made before the hub had an identity, e.g. before an upgrade;
a hub without one lists only those, and refuses to run at all with per-user namespaces), and a
pod's owner is read from its ``vocabulary.ANNOTATION_HUB_USER``
(the user's id and creation time in the hub's database), so a renamed user's pods are
followed. A pod whose user this hub's database does not have (a database lost or replaced,
another hub's pod) is never deleted: it is not known to be this hub's. Each orphan gets one log line, and the
``gpuspawner_orphan_pods_total`` metric counts them by what was done (``deleted``,
``would_delete`` in dry-run mode, ``failed``).

The same goes for the ResourceClaimTemplates GPUSpawner makes for offerings served through
Dynamic Resource Allocation (:mod:`gpuspawner.hub.claims`): each is named after its pod and
carries the pod's labels and annotations, so it is judged exactly like a pod. Normally its pod
owns it and the garbage collector removes it with the pod; this catches the one whose pod was
never made (the hub stopped between the two).

:func:`find_orphans` is the pure decision; the reconciler around it does the I/O.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio.client.rest import ApiException
from prometheus_client import Counter

from gpuspawner.hub.claims import KIND as CLAIM_TEMPLATE_KIND
from gpuspawner.hub.claims import ClaimTemplates
from gpuspawner.hub.seam import Spawner
from gpuspawner.names.vocabulary import ANNOTATION_HUB_USER, KUBESPAWNER_SERVER_ANNOTATION, KUBESPAWNER_USER_ANNOTATION, LABEL_OFFERING
from gpuspawner.pod.podspec import hub_id_problem, hub_selector, user_key

ORPHANS = Counter(
    "gpuspawner_orphan_pods",
    "GPU pods found with no hub server behind them, by what was done (deleted, would_delete, failed)",
    ["action"],
)

#: (user, server name) -> the pod name the hub's server has, or None if not known yet.
Servers = Mapping[tuple[str, str], "str | None"]


@dataclass(frozen=True)
class HubRecords:
    """What this hub's database says now: its servers (see :data:`Servers`) and its users,
    user key (``podspec.user_key``) -> the user's name now."""

    servers: Servers
    users: Mapping[str, str]


@dataclass(frozen=True)
class PodRef:
    """One GPUSpawner pod (or an object named after its pod, e.g. its claim template) and
    the hub server it claims to belong to."""

    namespace: str
    name: str
    user: str
    server: str
    kind: str = "Pod"
    #: The user key (``vocabulary.ANNOTATION_HUB_USER``); "" on a pod made before hubs stamped it.
    hub_user: str = ""

    @property
    def key(self) -> str:
        where = f"{self.namespace}/{self.name}"
        return where if self.kind == "Pod" else f"{self.kind}:{where}"

    @property
    def what(self) -> str:
        """How the logs name it."""
        return f"GPU pod {self.namespace}/{self.name}" if self.kind == "Pod" else f"{self.kind} {self.namespace}/{self.name}"

    @property
    def label(self) -> str:
        return f"{self.user}/{self.server}" if self.server else self.user

    @classmethod
    def from_pod(cls, pod: Mapping[str, Any]) -> PodRef | None:
        """None for a pod that is already being deleted or carries no hub annotations."""
        meta = pod.get("metadata") or {}
        notes = meta.get("annotations") or {}
        if meta.get("deletionTimestamp") or KUBESPAWNER_USER_ANNOTATION not in notes:
            return None
        return cls(
            meta.get("namespace", ""),
            meta.get("name", ""),
            notes[KUBESPAWNER_USER_ANNOTATION],
            notes.get(KUBESPAWNER_SERVER_ANNOTATION, ""),
            pod.get("kind") or "Pod",
            notes.get(ANNOTATION_HUB_USER, ""),
        )


def owner(pod: PodRef, users: Mapping[str, str], names: Iterable[str]) -> tuple[str, str] | None:
    """(user name now, server name) of ``pod`` in this hub's database; None where the database
    has no such user, so the pod is not known to be this hub's. A pod with a user key is
    followed through a rename; one without (made before keys were stamped) is matched by name."""
    if pod.hub_user:
        name = users.get(pod.hub_user)
        return (name, pod.server) if name is not None else None
    return (pod.user, pod.server) if pod.user in set(names) else None


def find_orphans(
    pods: Iterable[PodRef], hub: HubRecords, first_seen: Mapping[str, float], now: float, grace: float
) -> tuple[list[PodRef], dict[str, float]]:
    """The pods orphaned for at least ``grace`` seconds, and the new ``first_seen`` map.

    ``first_seen``: pod key -> when it was first seen without a server (from the last
    call). A pod whose server is back (a new spawn) is forgotten, and so is one whose user
    this hub's database does not have (see :func:`owner`): it is never an orphan.
    """
    orphans, seen = [], {}
    servers, names = hub.servers, set(hub.users.values())
    for pod in pods:
        found = owner(pod, hub.users, names)
        if found is None or (found in servers and servers[found] in (None, pod.name)):
            continue
        seen[pod.key] = first_seen.get(pod.key, now)
        if now - seen[pod.key] >= grace:
            orphans.append(pod)
    return orphans, seen


class OrphanReconciler:
    """One per hub process: every ``interval`` seconds, delete GPU pods orphaned for ``grace`` seconds.

    ``list_pods``: coroutine returning the raw pods to consider (GPUSpawner's, in its
    namespace, and the claim templates of its pods, each with its ``kind``); ``hub_servers``:
    the hub's servers and users now (:class:`HubRecords`); ``delete(kind, namespace, name)``.
    """

    def __init__(
        self,
        list_pods: Callable[[], Awaitable[Sequence[Mapping[str, Any]]]],
        hub_servers: Callable[[], HubRecords],
        delete: Callable[[str, str, str], Awaitable[None]],
        *,
        grace: float,
        interval: float,
        dry_run: bool = False,
        log: logging.Logger | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.list_pods, self.hub_servers, self.delete = list_pods, hub_servers, delete
        self.grace, self.interval, self.dry_run = grace, interval, dry_run
        self.log = log or logging.getLogger("gpuspawner.hub.orphans")
        self.clock = clock
        self.first_seen: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.check()
                if self._failing:
                    self.log.info("orphaned GPU pods: the cluster answers again")
                self._failing = False
            except Exception as exc:  # the API server is down or refuses: try again next round
                if not self._failing:
                    self.log.warning("orphaned GPU pods: cannot list pods (%s); trying again every %ss", _short(exc), self.interval)
                self._failing = True

    async def check(self) -> list[PodRef]:
        """One look: returns the orphans acted on (deleted, or logged in dry-run mode)."""
        pods = [ref for ref in map(PodRef.from_pod, await self.list_pods()) if ref is not None]
        orphans, self.first_seen = find_orphans(pods, self.hub_servers(), self.first_seen, self.clock(), self.grace)
        for pod in orphans:
            await self._remove(pod)
        return orphans

    async def _remove(self, pod: PodRef) -> None:
        if self.dry_run:
            ORPHANS.labels("would_delete").inc()
            self.log.warning("DRY RUN: would delete orphaned %s: no server %s in the hub for %.0fs", pod.what, pod.label, self.grace)
            return
        try:
            await self.delete(pod.kind, pod.namespace, pod.name)
        except Exception as exc:
            ORPHANS.labels("failed").inc()
            self.log.error("could not delete orphaned %s (server %s): %s; trying again next round", pod.what, pod.label, _short(exc))
            return
        ORPHANS.labels("deleted").inc()
        self.first_seen.pop(pod.key, None)
        self.log.warning("deleted orphaned %s: no server %s in the hub for %.0fs", pod.what, pod.label, self.grace)


def hub_servers_from_db(db: Any) -> HubRecords:
    """The hub's servers that exist now (starting, running or stopping), with their pod
    names where KubeSpawner saved them, and every user of the database by user key.
    ``db``: the hub's own SQLAlchemy session."""
    from jupyterhub import orm

    # One query with the owners' names (not one per server), and the users as columns, not ORM
    # objects: every user of a 3,000-user hub, each check, on the hub's event loop.
    servers: dict[tuple[str, str], str | None] = {}
    rows = db.query(orm.Spawner, orm.User.name).join(orm.User, orm.Spawner.user_id == orm.User.id).filter(orm.Spawner.server_id.isnot(None))
    for spawner, user_name in rows:
        servers[(user_name, spawner.name or "")] = (spawner.state or {}).get("pod_name")
    users = {user_key(uid, created): name for uid, created, name in db.query(orm.User.id, orm.User.created, orm.User.name)}
    return HubRecords(servers, users)


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    try:  # kubernetes_asyncio's ApiException carries the API's JSON
        text = json.loads(getattr(exc, "body", "") or "{}").get("message") or text
    except (ValueError, AttributeError):
        pass
    return text.splitlines()[0][:200]


# --------------------------------------------------------------------------- the spawner's wiring


#: This hub process's orphan reconciler, started by its first spawner (:func:`start_reconciler`).
running: OrphanReconciler | None = None
#: Whether this process has said why it runs no orphan reconciler (once).
said_why_not = False


def start_reconciler(spawner: Spawner) -> None:
    """Start the hub process's orphan reconciler (:data:`running`) from one of its spawners
    (``spawner``), inside a hub (with its database and loop)."""
    global running, said_why_not
    db = getattr(spawner.user, "db", None)
    if not spawner.reconcile_orphan_pods or db is None or running is not None:
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    if not spawner.hub_id and spawner.enable_user_namespaces:
        if not said_why_not:
            said_why_not = True
            spawner.log.error(
                "GPUSpawner: the orphan reconciler does not run: with enable_user_namespaces other hubs' pods may be "
                "anywhere, and this hub has no identity to tell its own (set c.GPUSpawner.hub_id; docs/config.md)."
            )
        return
    if hub_id_problem(spawner.hub_id):
        return  # config_problems refuses every spawn and says why
    list_objects, delete_object = cluster_io(spawner)
    running = OrphanReconciler(
        list_objects,
        lambda: hub_servers_from_db(db),
        delete_object,
        grace=spawner.orphan_pod_grace_seconds,
        interval=spawner.orphan_pod_check_seconds,
        dry_run=spawner.orphan_pod_dry_run,
        log=spawner.log,
    )
    running.start()


def cluster_io(spawner: Spawner) -> tuple[Callable[[], Awaitable[list[dict[str, Any]]]], Callable[[str, str, str], Awaitable[None]]]:
    """The orphan reconciler's two calls to the cluster: list GPUSpawner's pods and the
    claim templates of its DRA pods (each with its ``kind``), and delete one of them."""
    namespace, api = spawner.namespace, spawner.api
    every_namespace, grace = spawner.enable_user_namespaces, spawner.delete_grace_period
    claims = ClaimTemplates(api.api_client, namespace, spawner.log, spawner.hub_id)
    # This hub's GPU pods only; with an identity, also those made before it had one (no hub
    # label, a user key: find_orphans keeps those of its own database's users).
    selectors = [hub_selector(spawner.hub_id, LABEL_OFFERING)] + ([hub_selector("", LABEL_OFFERING)] if spawner.hub_id else [])

    async def list_pods(selector: str) -> list[dict[str, Any]]:
        if every_namespace:
            response = await api.list_pod_for_all_namespaces(label_selector=selector, _preload_content=False)
        else:
            response = await api.list_namespaced_pod(namespace, label_selector=selector, _preload_content=False)
        return json.loads(await response.read()).get("items") or []

    async def list_objects() -> list[dict[str, Any]]:
        pods, templates = [], []
        for n, selector in enumerate(selectors):
            found = await list_pods(selector)
            try:
                made = await claims.list(selector, all_namespaces=every_namespace)
            except ApiException as exc:
                if exc.status not in (403, 404):  # 404: no DRA in this cluster; 403: the hub may not read templates
                    raise
                made = []
            if n:  # made before the identity: only what carries a user key of a database
                found, made = (
                    [o for o in objects if ANNOTATION_HUB_USER in ((o.get("metadata") or {}).get("annotations") or {})]
                    for objects in (found, made)
                )
            pods += found
            templates += made
        return pods + [{**template, "kind": CLAIM_TEMPLATE_KIND} for template in templates]

    async def delete_object(kind: str, object_namespace: str, name: str) -> None:
        try:
            if kind == CLAIM_TEMPLATE_KIND:
                await claims.delete(name, object_namespace)
            else:
                await api.delete_namespaced_pod(name, object_namespace, grace_period_seconds=grace)
        except ApiException as exc:
            if exc.status != 404:  # already gone is what we wanted
                raise

    return list_objects, delete_object
