"""A server that goes through Kueue (docs/kueue.md), as the hub sees it: a spawn Kueue holds
says so in its progress, in Kueue's words and with its place in the queue where Kueue's
visibility API is served; a spawn Kueue can never admit is refused in seconds with Kueue's
reason; a pod creation that Kueue's fail-closed webhooks refuse (Kueue down) is a 503 that
names the cause; a stop that Kueue's finalizer would hold forever is finished; and a server
Kueue preempts is stopped with Kueue's reason in words the home page shows.

The pod's own labels say whether it goes through Kueue (``kueue.x-k8s.io/queue-name``, set
from :class:`gpuspawner.capacity.kueuequeues.KueueRouting`); nothing here runs for one that
does not.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio.client import ApiException, CustomObjectsApi

from gpuspawner.capacity.kueuequota import condition
from gpuspawner.core import noticewords as nw
from gpuspawner.hub import spawnview
from gpuspawner.hub.scheduling import brief
from gpuspawner.hub.seam import Spawner
from gpuspawner.names.dranames import DEVICE_TAINT_EVICTION, DISRUPTION_TARGET
from gpuspawner.names.kueuenames import (
    ADMISSION_GATE,
    COND_QUOTA_RESERVED,
    GROUP,
    JOB_UID_LABEL,
    LOCAL_QUEUES,
    MANAGED_FINALIZER,
    PENDING_WORKLOADS,
    POD_WEBHOOKS,
    QUEUE_LABEL,
    REASON_INADMISSIBLE,
    TERMINATION_TARGET,
    VERSION,
    VISIBILITY_GROUP,
)

#: Kueue's visibility API (served through an APIService where the cluster has it).
VISIBILITY = f"/apis/{VISIBILITY_GROUP}/{VERSION}"
#: Seconds between two looks at a held spawn's Workload.
LOOK_EVERY = 1.0
#: Seconds the hub reads no place from the visibility API once it was not served (or not ours
#: to read, or unavailable: Kueue restarting); then it asks again.
VISIBILITY_RETRY = 60.0
#: Seconds a deleted pod may keep Kueue's finalizer before the hub removes it (Kueue removes it
#: within a second when it runs).
FINALIZER_GRACE = 30.0

#: The parts of Kueue's "couldn't assign flavors" message that say waiting cannot help: the
#: request is more than the ClusterQueue could ever give, or a resource it does not cover.
_NEVER = re.compile(r"> maximum capacity|unavailable in ClusterQueue|flavor \S+ not found")
_WAITING_HELPS = "insufficient unused quota"


def queue_of(pod_labels: Mapping[str, str] | None) -> str:
    """The LocalQueue a pod goes through ("" for none)."""
    return (pod_labels or {}).get(QUEUE_LABEL, "")


def gated(pod: Mapping[str, Any]) -> bool:
    """Whether Kueue still holds ``pod`` (its admission gate is on: it holds no GPU yet)."""
    return any(g.get("name") == ADMISSION_GATE for g in (pod.get("spec") or {}).get("schedulingGates") or ())


def _pod(spawner: Spawner) -> Mapping[str, Any] | None:
    """The server's pod as KubeSpawner's reflector last saw it (the watch's own JSON), or None."""
    reflector = spawner.pod_reflector
    return reflector.pods.get(f"{spawner.namespace}/{spawner.pod_name}") if reflector is not None else None


@dataclass(frozen=True)
class Place:
    """A held spawn's place among the pending workloads Kueue lists (1-based, and how many wait).

    ``cluster_queue``: the ClusterQueue whose order ``position``/``of`` are ("" where only the
    LocalQueue's view could be read); ``local``: the place among its own LocalQueue's workloads
    in that order, where it differs (another LocalQueue's workload, another team's Job or
    another hub's spawn, waits ahead in the same ClusterQueue)."""

    position: int
    of: int
    cluster_queue: str = ""
    local: tuple[int, int] | None = None

    def words(self, queue: str) -> str:
        """ "(position 3 of 3 in ClusterQueue gpus; 2 of 2 in queue ml-course)", or "(position 2 of 2)"."""
        return nw.place_words(self.position, self.of, self.cluster_queue, self.local, queue)


def held_words(workload: Mapping[str, Any] | None, queue: str, place: Place | None = None) -> tuple[str, str | None]:
    """What the spawn's progress says while Kueue holds it, and the refusal when Kueue can
    never admit it (None while waiting may help)."""
    where = f"in queue {queue}" + (f" {place.words(queue)}" if place else "")
    reserved = condition(workload or {}, COND_QUOTA_RESERVED)
    if workload is None or reserved is None:
        return nw.kueue_waiting(where), None
    message = str(reserved.get("message") or "")
    if reserved.get("status") == "True":
        return nw.kueue_reserved(where), None
    if reserved.get("reason") == REASON_INADMISSIBLE:
        return "", nw.kueue_inadmissible(queue, message)
    if _NEVER.search(message) and _WAITING_HELPS not in message:
        return "", nw.kueue_never(queue, message)
    return nw.kueue_waiting(where, message), None


def _items(summary: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    return list((summary or {}).get("items") or [])


def _key(item: Mapping[str, Any]) -> tuple[str, str]:
    meta = item.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def cluster_queue_place(summary: Mapping[str, Any] | None, namespace: str, workload_name: str, cluster_queue: str) -> Place | None:
    """The place of workload ``namespace/workload_name`` in a ClusterQueue's pending workloads
    (the visibility API's ``PendingWorkloadsSummary`` of ``clusterqueues/<cq>/pendingworkloads``,
    in queue order), and in its LocalQueue's, counted here by (namespace, LocalQueue): Kueue up
    to v0.18.5 and v0.19.1 counts ``positionInLocalQueue`` of that list by the LocalQueue's name
    alone, so same-named LocalQueues of other namespaces share one count (kubernetes-sigs/kueue
    #14431, fixed in v0.18.6 and v0.19.2). None when it is not listed."""
    items = _items(summary)
    mine = next((i for i, item in enumerate(items) if _key(item) == (namespace, workload_name)), None)
    if mine is None:
        return None
    queue = (namespace, str(items[mine].get("localQueueName") or ""))
    same = [i for i, item in enumerate(items) if (_key(item)[0], str(item.get("localQueueName") or "")) == queue]
    local = (same.index(mine) + 1, len(same))
    return Place(int(items[mine].get("positionInClusterQueue", mine)) + 1, len(items), cluster_queue, local)


def local_queue_place(summary: Mapping[str, Any] | None, namespace: str, workload_name: str) -> Place | None:
    """The place of ``workload_name`` in a LocalQueue's pending workloads (the visibility API's
    ``localqueues/<lq>/pendingworkloads``), counting only those of ``namespace``: Kueue v0.17.0
    and v0.17.1 list there the workloads of same-named LocalQueues in every namespace, and count
    their ``positionInLocalQueue`` together (kubernetes-sigs/kueue #10672, fixed in v0.17.2 and
    v0.18.0). None when it is not listed."""
    names = [_key(item)[1] for item in _items(summary) if _key(item)[0] in (namespace, "")]
    return Place(names.index(workload_name) + 1, len(names)) if workload_name in names else None


class KueueReader:
    """The hub's reads of Kueue's objects for one spawn (through the spawner's API client)."""

    #: Until when (time.monotonic()) this process does not ask the visibility API, which was not
    #: served when it last asked (0: ask).
    unserved_until: float = 0.0
    #: Whether this process may read a ClusterQueue's pending workloads (False once the API
    #: server answered 403: the LocalQueue's are read instead, asked again after a while).
    cluster_view_until: float = 0.0

    def __init__(self, api: Any, namespace: str) -> None:
        self.api, self.namespace = api, namespace
        self.custom = CustomObjectsApi(api.api_client)
        self._cluster_queues: dict[str, str] = {}

    async def workload(self, pod_uid: str) -> dict[str, Any] | None:
        """The Workload Kueue made for the pod with ``pod_uid`` (None: not made yet)."""
        body = await self.custom.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "workloads", label_selector=f"{JOB_UID_LABEL}={pod_uid}", _request_timeout=5
        )
        items = body.get("items") or []
        return items[0] if items else None

    async def cluster_queue(self, queue: str) -> str:
        """The ClusterQueue the LocalQueue ``queue`` points to ("" when it cannot be read)."""
        if queue not in self._cluster_queues:
            try:
                local = await self.custom.get_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, LOCAL_QUEUES, queue, _request_timeout=5
                )
            except ApiException:
                return ""
            self._cluster_queues[queue] = str((local.get("spec") or {}).get("clusterQueue") or "")
        return self._cluster_queues[queue]

    async def pending(self, path: str) -> Mapping[str, Any] | None:
        """A pending-workloads summary of the visibility API (None: not listed there)."""
        response = await self.api.api_client.call_api(
            f"{VISIBILITY}/{path}/{PENDING_WORKLOADS}",
            "GET",
            header_params={"Accept": "application/json"},
            response_types_map={200: "object"},
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
            _request_timeout=5,
        )
        return response if isinstance(response, dict) else None

    async def place(self, queue: str, workload_name: str) -> Place | None:
        """The Workload's place in its ClusterQueue (with its LocalQueue's beside it) from the
        visibility API, where it is served; the LocalQueue's alone where the hub may not read the
        ClusterQueue's (an older chart's RBAC)."""
        if time.monotonic() < KueueReader.unserved_until:
            return None
        try:
            cluster_queue = await self.cluster_queue(queue) if time.monotonic() >= KueueReader.cluster_view_until else ""
            if cluster_queue:
                try:
                    summary = await self.pending(f"clusterqueues/{cluster_queue}")
                    return cluster_queue_place(summary, self.namespace, workload_name, cluster_queue)
                except ApiException as exc:
                    if exc.status != 403:
                        raise
                    KueueReader.cluster_view_until = time.monotonic() + VISIBILITY_RETRY
            summary = await self.pending(f"namespaces/{self.namespace}/localqueues/{queue}")
            return local_queue_place(summary, self.namespace, workload_name)
        except ApiException as exc:
            if exc.status == 404 and _details(exc).get("group") == VISIBILITY_GROUP:
                return None  # served, and the queue is not (yet) in Kueue's queues
            if exc.status in (403, 404, 503):
                # not served here (or not ours to read, or Kueue restarting): the conditions say
                # enough; asked again after a while
                KueueReader.unserved_until = time.monotonic() + VISIBILITY_RETRY
            return None


def _details(exc: ApiException) -> Mapping[str, Any]:
    """The ``details`` of the API's Status in ``exc`` ({} when it has none)."""
    try:
        details = json.loads(exc.body or "").get("details")
    except (ValueError, AttributeError, TypeError):
        return {}
    return details if isinstance(details, dict) else {}


async def held(spawner: Spawner) -> str:
    """While Kueue holds the spawn's pod, say so in its progress (updated as Kueue's words or
    the place change); return the refusal as soon as Kueue says it can never admit it, or once
    Kueue stops the pod before the server started (preempted, or not ready within its
    ``waitForPodsReady`` timeout). Never returns for a pod that does not go through Kueue, nor
    for one that starts (the scheduler's watch decides the rest)."""
    state = spawner.spawn_state
    await state.decided.wait()
    queue = queue_of(state.pod_changes.labels if state.pod_changes is not None else None)
    if not queue:
        await asyncio.Future()
    reader, said, failures = KueueReader(spawner.api, spawner.namespace), "", 0
    while True:
        pod = _pod(spawner)
        ended = take_ended(spawner)
        if ended is not None:
            stopped = nw.stopped_before_start(stop_notice(*ended)["why"])
            spawner.log.info("%s: stopped by Kueue while starting: %s", spawner.log_name, stopped)
            return stopped
        if pod is not None and not gated(pod):
            say_admitted(state)  # (then only Kueue's stop of the pod is looked for, in the reflector)
        elif pod is not None:
            if not said:
                # A gated pod holds no GPU yet: the node units reserved for it go back, so the page
                # and other spawns count them free while Kueue holds this one (once admitted, the
                # scheduler places it where there is room, or refuses it with its reason).
                spawnview.release_reservation(spawner)
            try:
                workload = await reader.workload(pod["metadata"]["uid"])
                place = await reader.place(queue, workload["metadata"]["name"]) if workload else None
            except (TimeoutError, ApiException, OSError) as exc:
                failures += 1
                if failures == 1:
                    spawner.log.warning("%s: cannot read Kueue's Workload (%s); the progress says less", spawner.log_name, brief(exc))
                workload, place = None, None
            words, refusal = held_words(workload, queue, place)
            if refusal:
                spawner.log.info("%s: refused by Kueue: %s", spawner.log_name, refusal)
                return refusal
            if words != said:
                state.messages.append(words)
                state.held_in, said = queue, words
        await asyncio.sleep(LOOK_EVERY)


def say_admitted(state: Any) -> None:
    """Say once in the spawn's progress that Kueue admitted it, if it said Kueue held it (from
    the watch above, or from the start that finished first)."""
    if state.held_in:
        state.messages.append(nw.kueue_admitted(state.held_in))
        state.held_in = None


def webhook_refusal(exc: BaseException) -> str | None:
    """The user's words when the API server refused a pod because an admission webhook could
    not be called (Kueue's fail closed: Kueue is down), else None."""
    if not isinstance(exc, ApiException) or (exc.status or 0) < 500:
        return None
    body = str(exc.body or "")
    try:
        body = str(json.loads(body).get("message") or body)
    except (ValueError, AttributeError):
        pass
    match = re.search(r'failed calling webhook \\?"([^"\\]+)', body)
    if match is None:
        return None
    if match.group(1) in POD_WEBHOOKS:
        return nw.kueue_webhook_down(match.group(1))
    return nw.webhook_down(match.group(1))


async def release_finalizer(spawner: Spawner, grace: float | None = None) -> None:
    """Once the server's pod has been deleted for ``grace`` seconds and still carries only
    Kueue's finalizer (Kueue is gone and cannot remove it), remove it so the stop finishes;
    logged. Runs beside KubeSpawner's stop; returns when the pod is gone or released."""
    grace = FINALIZER_GRACE if grace is None else grace
    key = f"{spawner.namespace}/{spawner.pod_name}"
    deleted_seen: float | None = None
    while True:
        pod = _pod(spawner)
        if pod is None and deleted_seen is not None:
            return
        meta = (pod or {}).get("metadata") or {}
        deleting = bool(meta.get("deletionTimestamp"))
        if deleting and deleted_seen is None:
            deleted_seen = time.monotonic()
        finalizers = meta.get("finalizers") or []
        if deleted_seen is not None and time.monotonic() - deleted_seen >= grace and finalizers == [MANAGED_FINALIZER]:
            patch = [{"op": "test", "path": "/metadata/finalizers", "value": finalizers}, {"op": "remove", "path": "/metadata/finalizers"}]
            try:
                # Through pods/status: Kueue's validating webhook takes every update of "pods" (and
                # fails closed while Kueue is down), not of "pods/status"; the API server keeps a
                # status update's finalizers (podStatusStrategy.PrepareForUpdate resets spec, not them).
                await spawner.api.patch_namespaced_pod_status(
                    spawner.pod_name, spawner.namespace, patch, _content_type="application/json-patch+json", _request_timeout=5
                )
            except ApiException as exc:
                if exc.status == 403:
                    spawner.log.error(
                        "%s: pod %s keeps Kueue's finalizer %s (is Kueue running?), and the hub may not remove it: grant"
                        " 'patch' on pods/status in this namespace (the chart's kueue.enabled does), or remove it by hand",
                        spawner.log_name,
                        key,
                        MANAGED_FINALIZER,
                    )
                    return
                if exc.status != 404:
                    spawner.log.warning("%s: could not remove Kueue's finalizer (%s); trying again", spawner.log_name, brief(exc))
                    await asyncio.sleep(5)
                    continue
            spawner.log.warning(
                "%s: pod %s kept Kueue's finalizer %s for %.0f s after its deletion (is Kueue running?); removed it so the stop"
                " can finish. Kueue counts the pod's quota as released when it sees the pod gone.",
                spawner.log_name,
                key,
                MANAGED_FINALIZER,
                grace,
            )
            return
        await asyncio.sleep(1.0)


def stop_notice(stopped: Mapping[str, Any], queue: str) -> dict[str, str]:
    """What the home page says about a server Kueue stopped (its pod's ``TerminationTarget``
    condition): {"time": ISO, "why": words}."""
    when = stopped.get("lastTransitionTime") or datetime.now(UTC).isoformat()
    return {"time": str(when), "why": nw.kueue_stop_words(stopped, queue)}


def take_ended(spawner: Spawner) -> tuple[Mapping[str, Any], str] | None:
    """Kueue's stop of the server's pod as KubeSpawner's reflector saw it go by (its
    ``TerminationTarget`` condition and the pod's queue), taken: it is explained once."""
    ended: dict[str, tuple[Mapping[str, Any], str]] = getattr(spawner.pod_reflector, "ended", {})
    return ended.pop(f"{spawner.namespace}/{spawner.pod_name}", None)


def home_notice(ended: tuple[Mapping[str, Any], str], server_name: str) -> dict[str, str]:
    """The home page's notice of a server Kueue stopped ({"time", "text"}), kept in the server's
    saved state: "Your server 'train' was stopped at Nov 27 14:02 UTC to make room for a
    higher-priority job in queue research." """
    notice = stop_notice(*ended)
    return nw.server_notice(server_name, notice["time"], nw.kueue_stopped_says(notice["time"], notice["why"]))


def ended_by_kueue(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """Kueue's ``TerminationTarget`` condition on a pod it is stopping, else None; or the device
    taint eviction's ``DisruptionTarget`` (a NoExecute taint on the pod's DRA device), whose
    words the same home notice carries."""
    cond = condition(pod, TERMINATION_TARGET)
    if cond is None:
        cond = condition(pod, DISRUPTION_TARGET)
        cond = cond if cond is not None and cond.get("reason") == DEVICE_TAINT_EVICTION else None
    return cond if cond is not None and cond.get("status") == "True" else None


def managed(spawner: Spawner) -> bool:
    """Whether the server's pod, as KubeSpawner's reflector last saw it, carries Kueue's finalizer."""
    return MANAGED_FINALIZER in (((_pod(spawner) or {}).get("metadata") or {}).get("finalizers") or ())
