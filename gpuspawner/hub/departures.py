"""A server whose pod left the cluster behind the hub's back (evicted, its node gone, deleted by
an administrator or another program, preempted by the scheduler), as the hub tells its user.

Kubernetes says why on the pod as it goes (pod disruption conditions, GA since 1.31): a
``DisruptionTarget`` condition whose reason is ``EvictionByEvictionAPI`` (a node drain, or
anyone's eviction), ``DeletionByPodGC`` (its node is gone from the cluster),
``DeletionByTaintManager`` (a NoExecute taint on its node, e.g. the node became unreachable),
``PreemptionByScheduler`` (a pod of higher priority) or ``TerminationByKubelet`` (the node ran
short of a resource, or shut down); a kubelet's own eviction leaves phase ``Failed`` with reason
``Evicted`` and its message. A plain delete says nothing but ``deletionTimestamp``. KubeSpawner's
pod reflector drops a pod at its DELETED event; :class:`gpuspawner.hub.reflector.VerdictPodReflector`
keeps :func:`departure` of it first, and the server's next poll (JupyterHub's, which then marks the
server stopped) turns that into the home page's notice (:func:`home_notice`, kept in the
server's saved state as ``stop_notice``, as Kueue's preemptions are: gpuspawner.hub.kueue).
Kueue's stops (``TerminationTarget``) and the device taint eviction keep their own words there.

Karpenter drains a node it removes through the eviction API, so the pod's condition says only
``EvictionByEvictionAPI``; its own event on the pod says why (:func:`karpenter_departure`;
Karpenter v1.14.1, pkg/controllers/node/termination/terminator/eviction.go and events/events.go):
``Evicted`` "Evicted pod: <the NodeClaim's DisruptionReason>" (Underutilized, Empty, Drifted) or
"Forceful Termination" (expiration, a deleted NodeClaim, a cloud's interruption), or ``Disrupted``
where its node's terminationGracePeriod ran out over the pod's ``karpenter.sh/do-not-disrupt``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from gpuspawner.capacity.kueuequota import condition
from gpuspawner.core.noticewords import karpenter_gone_words, pod_gone_says, pod_gone_words, server_notice
from gpuspawner.names.dranames import DISRUPTION_TARGET


def departure(pod: Mapping[str, Any]) -> dict[str, str]:
    """What the cluster said of ``pod`` as it left (slim, to be kept per pod): the reason and
    message of its ``DisruptionTarget`` condition (or of a kubelet's eviction), its node, and when
    its deletion began."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    cond = condition(pod, DISRUPTION_TARGET)
    cond = cond if cond is not None and cond.get("status") == "True" else None
    if cond is not None:
        reason, message = str(cond.get("reason") or ""), str(cond.get("message") or "")
    elif status.get("phase") == "Failed":
        reason, message = str(status.get("reason") or ""), str(status.get("message") or "")
    else:
        reason, message = "", ""
    when = meta.get("deletionTimestamp") or (cond or {}).get("lastTransitionTime") or ""
    return {"reason": reason, "message": message, "node": str((pod.get("spec") or {}).get("nodeName") or ""), "time": str(when)}


#: the event source Karpenter's controller publishes as
KARPENTER = "karpenter"
_EVICTED = "Evicted pod: "


def karpenter_departure(events: Iterable[Mapping[str, Any]]) -> str:
    """Karpenter's reason for draining the node of the pod whose ``events`` these are (the
    latest): "Underutilized", "Drifted", "Forceful Termination", "Disrupted", ...; "" if none."""
    said = ""
    for event in events:
        component = (event.get("source") or {}).get("component") or event.get("reportingComponent")
        if component != KARPENTER:
            continue
        message = str(event.get("message") or "")
        if event.get("reason") == "Evicted" and message.startswith(_EVICTED):
            said = message.removeprefix(_EVICTED).strip() or "Forceful Termination"
        elif event.get("reason") == "Disrupted":
            said = "Disrupted"
    return said


def home_notice(gone: Mapping[str, str] | None, node_gone: bool, server_name: str, now: datetime, karpenter: str = "") -> dict[str, str]:
    """The home page's notice of a server whose pod left behind the hub's back ({"time", "text"}):
    "Your server 'train' was stopped at Nov 28 14:02 UTC because its pod was evicted through the
    Kubernetes eviction API (a node drain, or an administrator). Please start it again."; where
    Karpenter drained its node (``karpenter``: :func:`karpenter_departure`), Karpenter's reason."""
    when = (gone or {}).get("time") or now.astimezone(UTC).isoformat()
    why = karpenter_gone_words(karpenter, (gone or {}).get("node", "")) if karpenter else pod_gone_words(gone, node_gone)
    return server_notice(server_name, when, pod_gone_says(when, why))


def gone_at(gone: Mapping[str, str] | None) -> datetime | None:
    """When the pod's deletion began, if the cluster said (None otherwise)."""
    try:
        return datetime.fromisoformat((gone or {}).get("time", "").replace("Z", "+00:00"))
    except ValueError:
        return None
