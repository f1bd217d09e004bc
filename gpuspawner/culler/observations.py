"""What the culler remembers between cycles and plans before it asks: a pod's GPU idle streak, a server's kernel view kept for a while, and which servers' kernels to ask this cycle. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from gpuspawner.culler.contract import ServerOffering
from gpuspawner.culler.gpu_metrics import PodGpuView
from gpuspawner.culler.policy import Policy
from gpuspawner.culler.records import KernelView, ServerRecord


@dataclass(frozen=True)
class GpuIdleStreak:
    """A pod's GPU seen idle by every GPU view from ``since`` to ``last_idle``."""

    since: datetime
    last_idle: datetime


def track_gpu_idle(prev: GpuIdleStreak | None, gpu: PodGpuView | None, now: datetime, window_s: int) -> GpuIdleStreak | None:
    """Carry a pod's GPU idle streak over one more cycle's GPU view.

    Activity ends the streak. An unknown view neither ends nor extends it. An
    idle view extends it when the previous idle view is at most one query window
    old -- each idle answer vouches for the window before it, so together they
    cover the whole time -- and starts a new one otherwise (a gap no answer
    covers, e.g. Prometheus down longer than the window). A streak starts at the
    first cycle that saw the GPU idle: the bound is counted from there, not from
    the start of that cycle's window, and from scratch after a culler restart.
    """
    if gpu is None or gpu.active:
        return None
    if not gpu.idle:
        return prev
    if prev is None or (now - prev.last_idle).total_seconds() > window_s:
        return GpuIdleStreak(now, now)
    return GpuIdleStreak(prev.since, now)


def gpu_idle_past_limit(
    server: ServerRecord,
    gpu: PodGpuView | None,
    policy: Policy,
    now: datetime,
    gpu_idle_since: datetime | None,
) -> timedelta | None:
    """How long the GPU has been idle, when that is past the offering's
    ``gpu_idle_limit`` and the GPU view says idle *now*; else None."""
    limit = policy.gpu_idle_limit_for(server.offering)
    if limit <= 0 or gpu is None or not gpu.idle or gpu_idle_since is None:
        return None
    idle_for = now - gpu_idle_since
    return idle_for if idle_for.total_seconds() >= limit else None


@dataclass(frozen=True)
class KernelMemo:
    """What a server's kernel view said, reduced to the earliest times at which
    asking again could lead to an action. Sound because activity only moves
    forward: a kernel seen with last_activity L cannot be idle for T before L + T;
    a kernel started later, not before ``checked_at`` + T; a busy kernel updates
    its last_activity when it finishes."""

    checked_at: datetime
    #: None: no reclaim is possible on this server
    earliest_reclaim: datetime | None
    earliest_stop: datetime


def kernel_memo(kv: KernelView, checked_at: datetime, policy: Policy, offering: ServerOffering) -> KernelMemo | None:
    if not kv.ok:
        return None
    earliest_reclaim = None
    ktimeout = policy.kernel_timeout_for(offering)
    if offering.kind in policy.reclaim_kinds and ktimeout > 0:
        oldest = min([checked_at] + [k.last_activity or checked_at for k in kv.kernels])
        earliest_reclaim = oldest + timedelta(seconds=ktimeout)
    seen = [k.last_activity for k in kv.kernels if k.last_activity is not None]
    if kv.server_last_activity is not None:
        seen.append(kv.server_last_activity)
    if kv.busy_kernels:
        seen.append(checked_at)
    # the shortest idleness that can stop it: spawns may start waiting for it at any time
    timeout = policy.idle_timeout_for(offering)
    if 0 < policy.waiting_bound_for(offering) < timeout:
        timeout = policy.waiting_bound_for(offering)
    if seen and timeout > 0:
        earliest_stop = max(seen) + timedelta(seconds=timeout)
    else:
        earliest_stop = checked_at  # nothing known: no deferral
    return KernelMemo(checked_at, earliest_reclaim, earliest_stop)


@dataclass(frozen=True)
class KernelAsk:
    """Which of a server's APIs to ask this cycle."""

    kernels: bool = False
    #: /api/status as well: only when a stop is possible (it adds the server's
    #: non-kernel activity, which only a stop decision needs)
    status: bool = False


def plan_kernel_view(
    server: ServerRecord,
    gpu: PodGpuView | None,
    policy: Policy,
    now: datetime,
    *,
    custom_arbiter: bool = False,
    gpu_last_active: datetime | None = None,
    memo: KernelMemo | None = None,
    gpu_idle_since: datetime | None = None,
    horizon_s: int = 0,
) -> KernelAsk:
    """Whether asking the server's kernels could change this cycle's decision.

    Hub activity is only ever *older* than the kernel view's, so a server that the
    hub already shows active within its timeout cannot be stopped, whatever its
    kernels say; a GPU server whose GPU view is active or unknown cannot be
    stopped either. Kernels are then asked only when a reclaim is possible.
    A :class:`KernelMemo` from an earlier cycle defers asking until an action
    could be due. A GPU idle past its ``gpu_idle_limit`` stops the server
    whatever the kernels say; they are asked only so that the log can name
    what the pod claimed.

    ``horizon_s`` asks as if it were that much later: the kernels of a server
    whose action falls within the warning window (:func:`upcoming`) are read
    early enough to warn its user. Asking earlier never changes a decision
    (every sign of life only moves activity later).
    """
    o = server.offering
    if not o.url or not server.ready or server.pending:
        return KernelAsk()
    now = now + timedelta(seconds=max(0, horizon_s))
    if custom_arbiter:
        return KernelAsk(True, True)
    if gpu_idle_past_limit(server, gpu, policy, now, gpu_idle_since) is not None and stop_allowed(server, policy) is None:
        return KernelAsk(True, True)
    if lease_over(server, policy, now) is not None and (policy.lease_reclaims_kernels(o) or stop_allowed(server, policy) is None):
        return KernelAsk(True, True)  # its lease ends whatever they say; read for the warning's (and the kernels') sake
    if budget_over(server, policy, now) and stop_allowed(server, policy) is None:
        return KernelAsk(True, True)  # stopped whatever they say; read for the warning's sake
    timeout = policy.timeout_for(o)
    seen = last_seen(server, None, gpu_last_active)
    hub_idle = timeout > 0 and seen is not None and (now - seen).total_seconds() >= timeout
    if memo is not None and now < memo.earliest_stop:
        hub_idle = False
    aged = aged_out(server, policy, now)
    could_stop = (hub_idle or aged) and stop_allowed(server, policy) is None and (not o.is_gpu or (gpu is not None and gpu.idle))
    could_reclaim = (
        o.kind in policy.reclaim_kinds
        and policy.kernel_timeout_for(o) > 0
        and memory_held(gpu, policy)
        and (gpu is not None and (gpu.idle or not policy.gpu_activity_blocks_kernel_reclaim))
        and (memo is None or (memo.earliest_reclaim is not None and now >= memo.earliest_reclaim))
    )
    return KernelAsk(kernels=bool(could_stop or could_reclaim), status=bool(could_stop))


def last_seen(server: ServerRecord, kernels: KernelView | None, gpu_last_active: datetime | None = None) -> datetime | None:
    """Latest sign of life: hub activity (or start), the server's own status,
    every kernel's activity, the last cycle that saw its GPU active."""
    times = [server.last_activity or server.started, gpu_last_active]
    if kernels is not None and kernels.ok:
        times.append(kernels.server_last_activity)
        times.extend(k.last_activity for k in kernels.kernels)
    known = [t for t in times if t is not None]
    return max(known) if known else None


def stop_allowed(server: ServerRecord, policy: Policy) -> str | None:
    """Why stopping this server is switched off by config, or None."""
    if server.offering.kind not in policy.stop_kinds:
        return f"stopping kind {server.offering.kind!r} is disabled (stop_kinds)"
    if server.name and not policy.cull_named_servers:
        return "culling named servers is disabled (cull_named_servers)"
    if not server.name and not policy.cull_default_servers:
        return "culling default servers is disabled (cull_default_servers)"
    return None


def aged_out(server: ServerRecord, policy: Policy, now: datetime) -> bool:
    return bool(policy.max_age > 0 and server.started is not None and (now - server.started).total_seconds() >= policy.max_age)


def lease_over(server: ServerRecord, policy: Policy, now: datetime) -> timedelta | None:
    """How long the server has held its GPU in this lease, once the lease (with the extensions
    its user took) has ended; else None."""
    ends = policy.lease_ends_at(server)
    began = policy.lease_began(server)
    if ends is None or began is None or now < ends:
        return None
    return now - began


def budget_over(server: ServerRecord, policy: Policy, now: datetime) -> bool:
    """Whether the server is stopped now because a budget of its user's (GPU-hours or cost) ran out."""
    at = policy.budget_stop_at(server)
    return at is not None and now >= at


def memory_held(gpu: PodGpuView | None, policy: Policy) -> bool:
    return gpu is not None and gpu.memory_mib is not None and gpu.memory_mib >= policy.memory_held_mib


def waiting_ranking(candidates: Iterable[tuple[ServerOffering, timedelta | None, bool]]) -> dict[str, list[tuple[str, str]]]:
    """Per offering slug, its GPU servers' pods (namespace, pod) from the longest idle down:
    who makes room first when spawns wait for the offering. ``candidates`` are a cycle's
    servers: (offering, inactive, whether a kernel was busy). A busy server, or one whose
    idleness is unknown, is never ranked (it could never be reclaimed, and would hold up the
    next in line)."""
    ranked: dict[str, list[tuple[timedelta, tuple[str, str]]]] = {}
    for offering, inactive, busy in candidates:
        if not offering.is_gpu or not offering.slug or not offering.pod or inactive is None or busy:
            continue
        ranked.setdefault(offering.slug, []).append((inactive, (offering.namespace or "", offering.pod)))
    return {slug: [pod for _, pod in sorted(rows, key=lambda r: r[0], reverse=True)] for slug, rows in ranked.items()}


def turns(
    ranking: Mapping[str, Sequence[tuple[str, str]]],
    waiting: Mapping[str, tuple[int, str]],
    before: Mapping[tuple[str, str], datetime],
    now: datetime,
) -> dict[tuple[str, str], datetime]:
    """The pods whose turn it is to make room, and since when: per offering, as many of the
    longest idle as spawns wait for it (one server per waiting spawn); a pod already in turn
    (``before``) keeps the time its turn began, a new one begins ``now``."""
    pods = (pod for slug, (count, _) in waiting.items() for pod in list(ranking.get(slug, ()))[:count])
    return {pod: before.get(pod, now) for pod in pods}
