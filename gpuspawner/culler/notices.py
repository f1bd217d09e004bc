"""What the culler tells users, in their words: the notice it puts to a server's
notebook extension before (and as) it acts, and the record of each action it keeps.

Pure: plain data in, plain data out. :mod:`.notify` sends the notices,
:mod:`.actionlog` keeps the records. The wire format of the notice is the
extension's ``PUT {base_url}api/gpuspawner/culler`` (docs/culler.md, "Warnings").
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from gpuspawner.culler.decide import Upcoming
from gpuspawner.culler.gpu_metrics import PodGpuView
from gpuspawner.culler.policy import NOT_KEEPABLE, RECLAIM, STOP, CullDecision, Policy
from gpuspawner.culler.records import BUDGET, GPU_IDLE_LIMIT, GPU_LEASE, MAX_AGE, UNRESPONSIVE, WAITING, ServerRecord
from gpuspawner.names.vocabulary import Kind, StopReason

#: what is held, as the user picked it on the spawn page
_THING = {
    Kind.FULL.value: "the whole GPU",
    Kind.MIG.value: "the MIG slice",
    Kind.SHARED.value: "the shared GPU",
    Kind.VGPU.value: "the vGPU",
    Kind.CUSTOM.value: "the GPU share",
    Kind.CPU.value: "the server",
}
#: the notice's "action" for each decision
NOTICE_ACTION = {STOP: "server", RECLAIM: "kernels"}
#: the action log's "action" for each decision
LOG_ACTION = {STOP: "server_stopped", RECLAIM: "kernels_shut_down"}


def thing(kind: str) -> str:
    return _THING.get(kind, "the GPU share")


def duration_words(seconds: float) -> str:
    """ "30 minutes", "1 minute", "less than a minute", "2 hours 5 minutes": how long, to a person."""
    minutes = max(0, int(seconds // 60))
    if minutes == 0:
        return "less than a minute"
    if minutes < 120:
        return "1 minute" if minutes == 1 else f"{minutes} minutes"
    hours, rest = divmod(minutes, 60)
    return f"{hours} hours" + (f" {rest} minutes" if rest else "")


def people_waiting(count: int, now: bool = True) -> str:
    """ "1 person is", "3 people were": the subject of "... waiting for MIG 3g.20gb"."""
    if count == 1:
        return "1 person is" if now else "1 person was"
    return f"{count} people {'are' if now else 'were'}"


def _idle_and_limit(idle_s: float, limit_s: float) -> str:
    """ "30 minutes (limit 30)" when both are in minutes; else both in full."""
    if idle_s < 120 * 60 and limit_s < 120 * 60:
        return f"{duration_words(idle_s)} (limit {int(limit_s // 60)})"
    return f"{duration_words(idle_s)} (limit {duration_words(limit_s)})"


def budget_words(server: ServerRecord, policy: Policy, coming: bool) -> str:
    """Why a server is (``coming``: will be) stopped for its user's budget, the GPU-hour one or
    the cost one, whichever stops it (:meth:`Policy.budget_stop`)."""
    stop = policy.budget_stop(server)
    runway = stop[1] if stop is not None else policy.budgets.get(server.user)
    cost = runway is not None and runway.is_cost
    name = runway.name if runway is not None else "GPU-hour budget"
    unit = "per hour" if cost else "GPU-hours per hour"
    spend = f" (spending {runway.rate_per_hour:g} {unit})" if runway is not None and runway.rate_per_hour > 0 else ""
    return f"your {name} {'runs' if coming else 'ran'} out{spend}; a new start is refused until it frees up"


def why_words(server: ServerRecord, decision: CullDecision, policy: Policy, earlier: timedelta = timedelta(0)) -> str:
    """Why the culler acts, e.g. "the whole GPU was idle for 30 minutes (limit
    30)" -- or, for a warning ``earlier`` than the action, why it will: "the whole
    GPU has been idle for 25 minutes (limit 30)"."""
    o = server.offering
    what = thing(o.kind)
    now = earlier > timedelta(0)

    def idle(td: timedelta | None, limit_s: float) -> str:
        return _idle_and_limit(max(timedelta(0), (td or timedelta(0)) - earlier).total_seconds(), limit_s)

    if decision.stop_reason == GPU_LEASE:
        return lease_words(server, policy, ended=not now)
    if decision.stop_reason == BUDGET:
        return budget_words(server, policy, now)
    if decision.action == RECLAIM and decision.shutdown:
        first = max(decision.shutdown, key=lambda k: k.idle_for or timedelta(0))
        n = len(decision.shutdown)
        kernels = "an idle kernel" if n == 1 else f"{n} idle kernels"
        held = f"{decision.memory_mib:.0f} MiB of {what}'s memory" if decision.memory_mib is not None else f"{what}'s memory"
        verb = ("holds" if n == 1 else "hold") if now else "held"
        return f"{kernels} {verb} {held} while idle for {idle(first.idle_for, first.limit_s or 0)}"
    was = "has been" if now else "was"
    if decision.stop_reason == GPU_IDLE_LIMIT:
        shown = "has shown" if now else "showed"
        limit = policy.gpu_idle_limit_for(o)
        return f"GPU telemetry {shown} {what} idle for {idle(decision.gpu_idle_for, limit)}, whatever the server reported" + (
            "; only GPU use counts" if now else ""
        )
    if decision.stop_reason == WAITING:
        count, name = policy.waiting.get(o.slug or "", (0, o.slug or "this offering"))
        people = people_waiting(count, now)
        bound = policy.waiting_bound_for(o)
        return f"{people} waiting for {name} and {what} {was} idle for {idle(decision.inactive, bound)}"
    if decision.stop_reason == UNRESPONSIVE:
        return (
            f"the server stopped answering the culler while GPU telemetry showed {what} idle for "
            f"{idle(decision.gpu_idle_for, policy.timeout_for(o))}"
        )
    if decision.stop_reason == MAX_AGE:
        return f"the server reached the longest time a server may run ({duration_words(policy.max_age)})"
    return f"{what} {was} idle for {idle(decision.inactive, policy.timeout_for(o))}"


def lease_seconds(server: ServerRecord, policy: Policy) -> int:
    """The server's GPU lease, with the extensions its user took (seconds)."""
    grant = policy.lease_grant(server)
    return policy.gpu_lease_for(server.offering) + grant.extensions * max(0, int(policy.gpu_lease_extension))


def lease_words(server: ServerRecord, policy: Policy, ended: bool) -> str:
    """ "the server's GPU lease ends: the whole GPU may be held for 4 hours at a time (with 1
    extension), whatever it does" -- and, where it ends with a reclaim, that the server stays."""
    o = server.offering
    grant = policy.lease_grant(server)
    extended = f" (with {grant.extensions} extension{'s' if grant.extensions != 1 else ''})" if grant.extensions else ""
    lease = duration_words(lease_seconds(server, policy))
    verb = "ended" if ended else "ends"
    if policy.lease_reclaims_kernels(o):
        return (
            f"the server's GPU lease {verb}: {thing(o.kind)} may be held for {lease}{extended} at a time, whatever it does;"
            " the server stays, and a new lease begins with new kernels"
        )
    return f"the server's GPU lease {verb}: {thing(o.kind)} may be held for {lease}{extended} at most, whatever it does"


def limit_seconds(server: ServerRecord, decision: CullDecision, policy: Policy) -> int:
    """The limit that applies to this decision."""
    if decision.stop_reason == GPU_LEASE:
        return lease_seconds(server, policy)
    if decision.action == RECLAIM and decision.shutdown:
        return int(decision.shutdown[0].limit_s or policy.kernel_timeout_for(server.offering))
    if decision.stop_reason == GPU_IDLE_LIMIT:
        return policy.gpu_idle_limit_for(server.offering)
    if decision.stop_reason == BUDGET:
        return 0
    if decision.stop_reason == WAITING:
        return policy.waiting_bound_for(server.offering)
    if decision.stop_reason == MAX_AGE:
        return int(policy.max_age)
    return policy.timeout_for(server.offering)


def keepable(decision: CullDecision) -> bool:
    """Whether the user's activity (Keep, a cell, a request) can prevent the action: not
    a stop by ``gpu_idle_limit`` (only GPU use counts), by the GPU lease or the GPU-hour
    budget (nothing does: a lease may be extended, where the admin allows it)."""
    return decision.stop_reason not in NOT_KEEPABLE


def _iso(when: datetime | None) -> str | None:
    return when.isoformat() if when is not None else None


def observed(decision: CullDecision, gpu: PodGpuView | None) -> dict[str, Any]:
    """The GPU figures the culler saw (the same in the notice, the log and the record)."""
    out: dict[str, Any] = {}
    if gpu is not None:
        out["gpu"] = gpu.state
        out["gpu_detail"] = gpu.reason
    if decision.memory_mib is not None:
        out["gpu_memory_mib"] = round(decision.memory_mib, 1)
    if decision.inactive is not None:
        out["inactive_seconds"] = int(decision.inactive.total_seconds())
    return out


def notice(
    server: ServerRecord,
    coming: Upcoming | None,
    policy: Policy,
    now: datetime,
    idle_since: datetime | None,
    gpu: PodGpuView | None,
) -> dict[str, Any]:
    """The culler's view of a server for its notebook extension: the action due
    within the warning window (``warning`` true), or none planned."""
    if coming is None:
        return {"idle_since": _iso(idle_since), "action": None, "act_at": None, "warning": False}
    d = coming.decision
    body: dict[str, Any] = {
        "idle_since": _iso(idle_since),
        "action": NOTICE_ACTION[coming.action],
        "act_at": _iso(coming.at),
        "reason": why_words(server, d, policy, earlier=coming.at - now),
        "warning": True,
        "limit_seconds": limit_seconds(server, d, policy),
        "observed": observed(d, gpu),
    }
    if not keepable(d):  # the notebook offers no Keep for it (absent: it does)
        body["keepable"] = False
    if d.stop_reason:
        body["cause"] = d.stop_reason
    return body


def acting(
    server: ServerRecord,
    decision: CullDecision,
    policy: Policy,
    now: datetime,
    idle_since: datetime | None,
    gpu: PodGpuView | None,
) -> dict[str, Any]:
    """The notice put just before the culler acts: what it does now, and (for
    kernels) which ones, so that the notebook can say "reclaimed for idleness"."""
    body: dict[str, Any] = {
        "idle_since": _iso(idle_since),
        "action": NOTICE_ACTION[decision.action],
        "act_at": _iso(now),
        "reason": why_words(server, decision, policy),
        "warning": False,
        "limit_seconds": limit_seconds(server, decision, policy),
        "observed": observed(decision, gpu),
    }
    if decision.action == RECLAIM:
        body["reclaimed"] = [k.kernel_id for k in decision.shutdown]
    if decision.stop_reason:
        body["cause"] = decision.stop_reason
    return body


def what_words(server: ServerRecord, action: str, kernels: Sequence[str], idle: bool = True) -> str:
    """The subject of the sentence the hub's pages show: "Your server 'train' was stopped"."""
    srv = f"your server '{server.name}'" if server.name else "your server"
    if action == RECLAIM:
        n = len(kernels)
        kind = "idle kernel" if idle else "kernel"
        return f"{f'An {kind}' if n == 1 else f'{n} {kind}s'} of {srv} {'was' if n == 1 else 'were'} shut down"
    return f"{srv[0].upper()}{srv[1:]} was stopped"


def gpu_nodes(gpu: PodGpuView | None) -> list[str]:
    """The nodes of the pod's devices, as dcgm-exporter names them (``Hostname``: the node's name
    where it runs as a DaemonSet with ``NODE_NAME``, the first part of each device's name); a
    scrape address (``instance``, host:port) is no node."""
    hosts = {d.device.split("/", 1)[0] for d in gpu.devices} if gpu is not None else set()
    return sorted(h for h in hosts if h and ":" not in h)


def action_record(
    server: ServerRecord,
    decision: CullDecision,
    policy: Policy,
    when: datetime,
    gpu: PodGpuView | None,
    kernels: Sequence[str] = (),
) -> dict[str, Any]:
    """One entry of the action log: user, server, what was reclaimed, why, the
    GPU figures seen, when. ``what`` + " at <time>: " + ``why`` is the sentence
    the hub's pages show (:func:`gpuspawner.hub.culleractions.sentence`)."""
    o = server.offering
    return {
        "time": when.isoformat(),
        "user": server.user,
        "server": server.name,
        "action": LOG_ACTION[decision.action],
        "reason": decision.stop_reason or StopReason.IDLE,
        "kind": o.kind,
        "offering": o.slug,
        "started": _iso(server.started),
        "kernels": list(kernels),
        "what": what_words(server, decision.action, kernels, idle=decision.stop_reason is None),
        "why": why_words(server, decision, policy),
        "limit_seconds": limit_seconds(server, decision, policy),
        "observed": observed(decision, gpu),
        "details": decision.summary(),
        # where the freed GPUs were: `gpuspawner report --nodeclaims` joins these with Karpenter's NodeClaims
        "nodes": gpu_nodes(gpu),
    }
