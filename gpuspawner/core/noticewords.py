"""What the hub tells a user about one server of theirs, outside the spawn page's choices: the
lines of a start's progress, and the home page's notice of a server that stopped or did not
start (the cluster took its pod away, Kueue stopped it, the hub restarted while it started). Pure.

The spawn page's own words (the offerings, their badges, the notice above the choices, the
refusals) are :mod:`gpuspawner.core.wording`'s; this module is their second half, kept apart so
that each stays under 450 lines (docs/architecture.md, "Where a change goes").
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from gpuspawner.names.dranames import (
    DEVICE_TAINT_EVICTION,
    DISRUPTION_TARGET,
    EVICTION_API,
    KUBELET,
    KUBELET_EVICTED,
    POD_GC,
    PREEMPTED,
    TAINT_MANAGER,
)
from gpuspawner.names.kueuenames import STOP_EVICTED

# -- Dates and the home page's notice of one server --------------------------------------------


def when_words(iso: str, now: datetime | None = None) -> str:
    """ "14:02 UTC" today, "Nov 23 14:02 UTC" before (always with the date where there is no ``now``:
    words kept to be shown later)."""
    try:
        when = datetime.fromisoformat(iso).astimezone(UTC)
    except (TypeError, ValueError):
        return "an unknown time"
    if now is not None and when.date() == now.astimezone(UTC).date():
        return when.strftime("%H:%M UTC")
    return when.strftime("%b %d %H:%M UTC")


def server_notice(server_name: str, at: str, says: str) -> dict[str, str]:
    """A home-page notice of one server, dated ``at`` (ISO 8601): {"time", "text"}, the text
    "Your server 'train' <says>" ("Your server <says>" for the default server)."""
    server = f"Your server '{server_name}'" if server_name else "Your server"
    return {"time": at, "text": f"{server} {says}"}


# -- A pod the cluster took away (hub.departures) ------------------------------------------------


def _said(message: str) -> str:
    message = message.strip().rstrip(".")
    return f" (the cluster says: {message})" if message else ""


def pod_gone_words(gone: Mapping[str, str] | None, node_gone: bool = False) -> str:
    """Why the pod left, in words that follow "Your server was stopped at 14:02 ..." (``gone``:
    hub.departures.departure's reason, message and node)."""
    gone = gone or {}
    reason, message, node = gone.get("reason", ""), gone.get("message", ""), gone.get("node", "")
    its_node = f"its node {node}" if node else "its node"
    if reason == EVICTION_API:
        return f"because its pod was evicted through the Kubernetes eviction API (a node drain, or an administrator){_said(message)}"
    if reason == POD_GC or (not reason and node_gone):
        return f"because {its_node} is gone from the cluster"
    if reason == TAINT_MANAGER:
        return f"because {its_node} was taken out of service (a NoExecute taint: it became unreachable, or an administrator drained it)"
    if reason == PREEMPTED:
        return f"to make room for a pod of higher priority (the scheduler preempted it){_said(message)}"
    if reason in (KUBELET, KUBELET_EVICTED):
        return f"because {its_node} evicted its pod{_said(message)}"
    if reason:
        return f"because the cluster ended its pod ({reason}){_said(message)}"
    return "because its pod was deleted outside the hub (by an administrator or another program)"


#: Karpenter's reason for a node it drained (the NodeClaim's DisruptionReason, else "Forceful
#: Termination"; or "Disrupted": the pod deleted when its node's grace period ended) -> what it did
_KARPENTER_DID = {
    "Underutilized": "took its node{node} away to pack underused nodes together (consolidation)",
    "Empty": "removed its node{node} as empty",
    "Drifted": "replaced its node{node}, which no longer matched its node pool's settings (drift)",
    "Forceful Termination": "ended its node{node} (it expired, the cloud took it back, or its NodeClaim was deleted)",
    "Disrupted": "ended its node{node} when the node's grace period ran out, which overrides the notebook's protection",
}


def karpenter_gone_words(reason: str, node: str = "") -> str:
    """Why the pod left when Karpenter, the cluster's node autoscaler, drained its node
    (``reason``: hub.departures.karpenter_departure), in words that follow "Your server was stopped at 14:02 ..."."""
    did = _KARPENTER_DID.get(reason, "removed its node{node} (" + reason + ")")
    return "because Karpenter, the cluster's node autoscaler, " + did.format(node=f" {node}" if node else "")


def pod_gone_says(when: str, why: str) -> str:
    """The notice's words after "Your server 'x'" for a pod the cluster took away."""
    return f"was stopped at {when_words(when)} {why}. Please start it again."


# -- A start the hub did not finish (hub.lifecycle) ----------------------------------------------


def interrupted_start_says(at: str) -> str:
    """The hub restarted (or was stopped) while the server was starting."""
    return f"was starting when the hub restarted (at {when_words(at)}), so it did not start. Please start it again."


def refused_start_says(at: str, words: str) -> str:
    """A start refused on its way, with the refusal's words."""
    return f"did not start (at {when_words(at)}): {words}"


def unanswered_after_restart_says(at: str, http_timeout: float) -> str:
    """The restarted hub found the server but it did not answer, so the hub stopped it."""
    return (
        f"did not answer the hub when the hub restarted (at {when_words(at)}; it was probably still starting), "
        f"so the hub stopped it after waiting {http_timeout:g} s. Please start it again."
    )


# -- A start's progress ---------------------------------------------------------------------------

#: The progress line while the API server is slow to create the server's pod.
SLOW_POD_CREATION = "The cluster is answering slowly: still creating your server's pod."


def reserved_words(count: int, display_name: str) -> str:
    """The progress line once the units are reserved: "Reserved 1 x H100."."""
    return f"Reserved {count} x {display_name}."


def starting_uncounted(count: int, display_name: str) -> str:
    """The progress line of a start the hub cannot count for (it may not read the cluster)."""
    return f"Starting {count} x {display_name} (free count unavailable)."


def budget_progress(used: float, hours: float, hourly_cost: float) -> str:
    """The progress line of a start under a GPU-hour budget."""
    return f"GPU budget: {used:.2f} of {hours:g} GPU-hours used; this server costs {hourly_cost:g} per hour."


def cost_budget_progress(spent: float, budget: float, price: float) -> str:
    """The progress line of a start under a cost budget (the site's money, as ``price_per_hour``)."""
    return f"Cost budget: {spent:,.2f} of {budget:,.2f} spent; this server costs {price:,.2f} per hour."


def preparing_words(conditions: list[str]) -> str:
    """The progress step while the scheduler waits for a DRA device's binding conditions."""
    return f"Preparing the device ({', '.join(conditions)})…"


#: The progress step once the device is ready.
READY_WORDS = "The device is ready; the pod is being placed on its node."


# -- What a start that ran out of time was still waiting for (after "did not start ...: ") ------


def queue_place_waiting(position: int) -> str:
    return f"it was still number {position} in the queue for a free GPU"


def batch_queue_waiting(queue: str) -> str:
    return f"it was still waiting in the batch queue {queue} for the quota to admit it"


def pod_waiting_words(pod: Mapping[str, Any] | None) -> str:
    """What a pod (as KubeSpawner's reflector keeps it) still waits for, in the user's words."""
    if pod is None:
        return "the cluster had not confirmed its pod yet (the API server answers slowly)"
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    if not spec.get("nodeName"):
        scheduled: dict[str, Any] = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), {})
        said = f": {scheduled['message']}" if scheduled.get("message") else ""
        return f"its pod was still waiting for a node{said}"
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting")
        if waiting:
            said = f" ({waiting['message'][:200]})" if waiting.get("message") else ""
            return f"its container was still {waiting.get('reason') or 'waiting'}{said}"
    if status.get("phase") == "Running":
        return "its pod was running, but the notebook server in it had not started"
    return f"its pod was still {status.get('phase') or 'Pending'} on node {spec['nodeName']}"


# -- Kueue: a server it holds, refuses or stops (hub.kueue, docs/kueue.md) ------------------------


def sentence(text: str) -> str:
    """``text`` as a sentence: stripped, with a full stop."""
    text = text.strip()
    return text if text.endswith(".") else text + "."


def place_words(position: int, of: int, cluster_queue: str, local: tuple[int, int] | None, queue: str) -> str:
    """ "(position 3 of 3 in ClusterQueue gpus; 2 of 2 in queue ml-course)", or "(position 2 of 2)"."""
    if local is None or local == (position, of):
        return f"(position {position} of {of})"
    return f"(position {position} of {of} in ClusterQueue {cluster_queue}; {local[0]} of {local[1]} in queue {queue})"


def kueue_waiting(where: str, says: str = "") -> str:
    """The progress while Kueue holds the server ("in queue ml (position 2 of 2)"; ``says``: Kueue's message)."""
    return f"Waiting for GPU quota {where}. Kueue says: {sentence(says)}" if says else f"Waiting for GPU quota {where}."


def kueue_reserved(where: str) -> str:
    return f"Kueue has reserved GPU quota {where}."


def kueue_admitted(queue: str) -> str:
    return f"Kueue admitted the server in queue {queue}."


def kueue_inadmissible(queue: str, says: str) -> str:
    """The refusal when Kueue cannot admit the server (its queue or flavors are wrong)."""
    return f"Kueue cannot admit this server in queue {queue}: {sentence(says)} Please tell your administrator."


def kueue_never(queue: str, says: str) -> str:
    """The refusal when the choice exceeds what Kueue could ever admit in its queue."""
    return f"Kueue can never admit this server in queue {queue}: {sentence(says)} Please pick a smaller option."


def kueue_webhook_down(webhook: str) -> str:
    """The refusal while Kueue's pod webhook does not answer (Kueue fails closed)."""
    return (
        "Kueue, which admits this cluster's servers, is not answering, so no server can start now"
        f' (the cluster said: failed calling webhook "{webhook}"). Please try again in a few minutes;'
        " if it lasts, tell your administrator."
    )


def webhook_down(webhook: str) -> str:
    """The refusal while another admission webhook of the cluster does not answer."""
    return (
        f'The cluster\'s admission webhook "{webhook}" is not answering, so no server can start now.'
        " Please try again in a few minutes; if it lasts, tell your administrator."
    )


def kueue_stop_words(stopped: Mapping[str, Any], queue: str) -> str:
    """Why Kueue (or the device taint eviction) stopped a server, from its pod's condition, in
    words that follow "Your server was stopped at 14:02 ..."."""
    reason, message = str(stopped.get("reason") or ""), str(stopped.get("message") or "")
    where = f" in queue {queue}" if queue else ""
    evicted = reason.startswith(STOP_EVICTED)  # "WorkloadEvictedDueTo<the Workload's Evicted reason>"
    if stopped.get("type") == DISRUPTION_TARGET and reason == DEVICE_TAINT_EVICTION:
        return (
            "because its GPU was taken out of service: the device has a NoExecute taint its claim does not tolerate "
            "(an administrator's DeviceTaintRule or the GPU's driver), and Kubernetes evicts the pods using it"
        )
    if evicted and "prioritization in the ClusterQueue" in message:
        return f"to make room for a higher-priority job{where}"
    if evicted and "reclamation within the cohort" in message:
        return f"because another queue took back the GPU quota its queue{where} had lent"
    if evicted and reason.endswith("PodsReadyTimeout"):
        return f"by Kueue{where}: it was not ready within the time Kueue allows (its waitForPodsReady timeout)"
    if evicted and "Fair Sharing" in message:
        return f"to give other queues their fair share of the GPUs (Kueue's fair sharing){where}"
    return f"by Kueue{where}: {(message or reason or 'no reason given').strip().rstrip('.')}"


def stopped_before_start(why: str) -> str:
    """The start's end when Kueue stopped the pod before the server ran."""
    return f"The server was stopped before it started {why}."


def kueue_stopped_says(when: str, why: str) -> str:
    """The notice's words after "Your server 'x'" for a server Kueue stopped."""
    return f"was stopped at {when_words(when)} {why}."
