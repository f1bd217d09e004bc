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
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from gpuspawner.capacity.kueuequota import condition
from gpuspawner.core.noticewords import pod_gone_says, pod_gone_words, server_notice
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


def home_notice(gone: Mapping[str, str] | None, node_gone: bool, server_name: str, now: datetime) -> dict[str, str]:
    """The home page's notice of a server whose pod left behind the hub's back ({"time", "text"}):
    "Your server 'train' was stopped at Nov 28 14:02 UTC because its pod was evicted through the
    Kubernetes eviction API (a node drain, or an administrator). Please start it again." """
    when = (gone or {}).get("time") or now.astimezone(UTC).isoformat()
    return server_notice(server_name, when, pod_gone_says(when, pod_gone_words(gone, node_gone)))


def gone_at(gone: Mapping[str, str] | None) -> datetime | None:
    """When the pod's deletion began, if the cluster said (None otherwise)."""
    try:
        return datetime.fromisoformat((gone or {}).get("time", "").replace("Z", "+00:00"))
    except ValueError:
        return None
