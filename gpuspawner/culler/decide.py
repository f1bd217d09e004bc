"""Pure decisions, each with its reasons. No I/O here: plain data in, plain data out.

Per server, in order:

1. pending or not ready: keep. Then a GPU server running for its kind's GPU
   lease (``gpu_leases``): **stop**, whatever else is true -- the hard maximum
   nothing vetoes. (A server whose pod missed the cycle's deadline is judged by
   :func:`decide_unresponsive` instead.)
2. **stop** (free the device) when inactive (hub activity, the server's own
   ``/api/status``, every kernel's ``last_activity``) for longer than the
   offering's timeout, or older than ``max_age`` -- unless

   * a kernel is busy (execution_state "busy"): keep;
   * the GPU was active in the window: keep;
   * the server holds a GPU and its GPU view is unknown (Prometheus down, too few
     samples, no series): held back -- unknown never justifies a cull;
   * its kernel view was needed and could not be read: held back.
3. **stop** a GPU server whose GPU telemetry has shown it idle, continuously, for
   longer than the offering's ``gpu_idle_limit`` -- whatever its pod says. Busy
   kernels, kernel and ``/api/status`` activity, a kernel API that fails, and the
   hub's ``last_activity`` (reported by the pod's own jupyterhub-singleuser, or
   traffic the user sends through the proxy) are all the user's word; the GPU's
   telemetry is not. Real GPU activity still always keeps the server.
4. otherwise **reclaim** (keep the server, free GPU memory) on kinds listed in
   ``reclaim_kinds``: shut down kernels idle longer than the kernel timeout while
   the pod holds GPU memory -- held back when memory or activity is unknown, and
   not while the GPU is active (by default).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from jupyterhub_idle_culler import format_td

from gpuspawner.culler.contract import ServerOffering
from gpuspawner.culler.gpu_metrics import PodGpuView
from gpuspawner.culler.records import GPU_IDLE_LIMIT, GPU_LEASE, IDLE, MAX_AGE, UNRESPONSIVE, KernelView, ServerRecord
from gpuspawner.names.vocabulary import Kind

DEFAULT_KIND_TIMEOUTS: Mapping[str, int] = {
    Kind.FULL.value: 30 * 60,
    Kind.MIG.value: 60 * 60,
    Kind.SHARED.value: 2 * 60 * 60,
    Kind.VGPU.value: 60 * 60,
    Kind.CUSTOM.value: 60 * 60,
    Kind.CPU.value: 8 * 60 * 60,
}
#: Kinds whose GPU memory other users share: their idle kernels are shut down to reclaim it.
DEFAULT_RECLAIM_KINDS: tuple[str, ...] = (Kind.SHARED.value, Kind.CUSTOM.value)

STOP, RECLAIM, KEEP, HELD_BACK = "stop", "reclaim", "keep", "held_back"
#: what a user cannot prevent by any activity but GPU use (gpu_idle_limit) or at all
#: (gpu_lease, unresponsive): no "Keep" is offered for them
NOT_KEEPABLE: frozenset[str] = frozenset({GPU_IDLE_LIMIT, GPU_LEASE, UNRESPONSIVE})
#: the longest a GPU server may run, per GPU kind (seconds): its GPU lease
DEFAULT_GPU_LEASES: Mapping[str, int] = {
    Kind.FULL.value: 24 * 60 * 60,
    Kind.MIG.value: 24 * 60 * 60,
    Kind.SHARED.value: 24 * 60 * 60,
    Kind.VGPU.value: 24 * 60 * 60,
    Kind.CUSTOM.value: 24 * 60 * 60,
}
DEFAULT_GPU_IDLE_LIMIT = 4 * 60 * 60
#: kernels of one server shut down in one cycle, at most (the rest: next cycle)
DEFAULT_KERNEL_SHUTDOWNS_PER_CYCLE = 20
#: consecutive cycles a server's pod may miss its deadline before telemetry alone judges it
DEFAULT_STALLS_BEFORE_TELEMETRY = 3


@dataclass(frozen=True)
class Policy:
    """What the admin configured, as plain data. Timeouts in seconds; a timeout of
    0 or less disables that action for that kind or offering."""

    kind_timeouts: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_KIND_TIMEOUTS))
    #: used for kinds absent from ``kind_timeouts``
    default_timeout: int = 8 * 60 * 60
    #: per offering slug; wins over the kind
    offering_timeouts: Mapping[str, int] = field(default_factory=dict)
    kernel_timeout: int = 30 * 60
    offering_kernel_timeouts: Mapping[str, int] = field(default_factory=dict)
    reclaim_kinds: frozenset[str] = frozenset(DEFAULT_RECLAIM_KINDS)
    stop_kinds: frozenset[str] = frozenset(k.value for k in Kind)
    max_age: int = 0
    #: a pod "holds GPU memory" from this many MiB (FB_USED) on
    memory_held_mib: float = 64.0
    require_kernel_view: bool = True
    reclaim_connected_kernels: bool = True
    gpu_activity_blocks_kernel_reclaim: bool = True
    cull_default_servers: bool = True
    cull_named_servers: bool = True
    #: seconds of continuous, telemetry-known GPU idleness after which a GPU
    #: server is stopped whatever its pod claims; 0 or less: off
    gpu_idle_limit: int = DEFAULT_GPU_IDLE_LIMIT
    #: per offering slug; wins over ``gpu_idle_limit``
    offering_gpu_idle_limits: Mapping[str, int] = field(default_factory=dict)
    #: kernels of one server shut down per cycle, at most; 0 or less: no cap
    kernel_shutdowns_per_cycle: int = DEFAULT_KERNEL_SHUTDOWNS_PER_CYCLE
    #: consecutive cycles whose deadline a server's pod missed, after which the
    #: server is judged by GPU telemetry alone (:func:`decide_unresponsive`)
    stalls_before_telemetry: int = DEFAULT_STALLS_BEFORE_TELEMETRY
    #: per GPU kind, the longest (seconds) a server may hold its GPU, whatever it does;
    #: a kind absent or at 0 has none (:meth:`gpu_lease_for`)
    gpu_leases: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_GPU_LEASES))

    def timeout_for(self, offering: ServerOffering) -> int:
        if offering.slug and offering.slug in self.offering_timeouts:
            return int(self.offering_timeouts[offering.slug])
        return int(self.kind_timeouts.get(offering.kind, self.default_timeout))

    def kernel_timeout_for(self, offering: ServerOffering) -> int:
        if offering.slug and offering.slug in self.offering_kernel_timeouts:
            return int(self.offering_kernel_timeouts[offering.slug])
        return int(self.kernel_timeout)

    def gpu_lease_for(self, offering: ServerOffering) -> int:
        """The server's GPU lease in seconds (0: none): how long it may hold its GPU from
        its start, whatever it does. One place decides it, so that a per-server lease
        (granted in turns, say) can replace the per-kind one here."""
        if not offering.is_gpu:
            return 0
        return max(0, int(self.gpu_leases.get(offering.kind, 0)))

    def gpu_idle_limit_for(self, offering: ServerOffering) -> int:
        """The bound after which GPU idleness wins, in seconds; 0: none. Never
        shorter than the offering's idle timeout, and none where that timeout
        is off (the admin said "never stop this for idleness")."""
        if not offering.is_gpu:
            return 0
        if offering.slug and offering.slug in self.offering_gpu_idle_limits:
            limit = int(self.offering_gpu_idle_limits[offering.slug])
        else:
            limit = int(self.gpu_idle_limit)
        timeout = self.timeout_for(offering)
        if limit <= 0 or timeout <= 0:
            return 0
        return max(limit, timeout)


@dataclass(frozen=True)
class KernelAction:
    kernel_id: str
    reason: str
    #: how long the kernel had been idle, and its kernel timeout (for the user's words)
    idle_for: timedelta | None = None
    limit_s: int | None = None


@dataclass(frozen=True)
class Decision:
    action: str
    #: "idle" or "max_age" when action is stop
    stop_reason: str | None = None
    shutdown: tuple[KernelAction, ...] = ()
    reasons: tuple[str, ...] = ()
    held_back: tuple[str, ...] = ()
    memory_mib: float | None = None
    inactive: timedelta | None = None
    #: with stop_reason "gpu_idle_limit": what the pod claimed, overruled
    overruled: tuple[str, ...] = ()
    #: with stop_reason "gpu_idle_limit": how long telemetry has shown the GPU idle
    gpu_idle_for: timedelta | None = None

    def summary(self) -> str:
        parts = list(self.reasons)
        if self.held_back:
            parts.append("held back: " + "; ".join(self.held_back))
        return "; ".join(parts)


def last_seen(server: ServerRecord, kernels: KernelView | None, gpu_last_active: datetime | None = None) -> datetime | None:
    """Latest sign of life: hub activity (or start), the server's own status,
    every kernel's activity, the last cycle that saw its GPU active."""
    times = [server.last_activity or server.started, gpu_last_active]
    if kernels is not None and kernels.ok:
        times.append(kernels.server_last_activity)
        times.extend(k.last_activity for k in kernels.kernels)
    known = [t for t in times if t is not None]
    return max(known) if known else None


def _stop_allowed(server: ServerRecord, policy: Policy) -> str | None:
    """Why stopping this server is switched off by config, or None."""
    if server.offering.kind not in policy.stop_kinds:
        return f"stopping kind {server.offering.kind!r} is disabled (stop_kinds)"
    if server.name and not policy.cull_named_servers:
        return "culling named servers is disabled (cull_named_servers)"
    if not server.name and not policy.cull_default_servers:
        return "culling default servers is disabled (cull_default_servers)"
    return None


def _aged(server: ServerRecord, policy: Policy, now: datetime) -> bool:
    return bool(policy.max_age > 0 and server.started is not None and (now - server.started).total_seconds() >= policy.max_age)


def lease_over(server: ServerRecord, policy: Policy, now: datetime) -> timedelta | None:
    """How long the server has run, once that reaches its GPU lease; else None."""
    lease = policy.gpu_lease_for(server.offering)
    if lease <= 0 or server.started is None:
        return None
    age = now - server.started
    return age if age.total_seconds() >= lease else None


def _lease_decision(server: ServerRecord, policy: Policy, age: timedelta, reasons: list[str], memory: float | None) -> Decision:
    lease = format_td(timedelta(seconds=policy.gpu_lease_for(server.offering)))
    return Decision(
        STOP,
        stop_reason=GPU_LEASE,
        reasons=tuple([*reasons, f"running for {format_td(age)}: its GPU lease ({lease}, gpu_leases) is over"]),
        memory_mib=memory,
    )


def _memory_held(gpu: PodGpuView | None, policy: Policy) -> bool:
    return gpu is not None and gpu.memory_mib is not None and gpu.memory_mib >= policy.memory_held_mib


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
    timeout = policy.timeout_for(offering)
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
    if gpu_idle_past_limit(server, gpu, policy, now, gpu_idle_since) is not None and _stop_allowed(server, policy) is None:
        return KernelAsk(True, True)
    if lease_over(server, policy, now) is not None and _stop_allowed(server, policy) is None:
        return KernelAsk(True, True)  # stopped whatever they say; read for the warning's sake
    timeout = policy.timeout_for(o)
    seen = last_seen(server, None, gpu_last_active)
    hub_idle = timeout > 0 and seen is not None and (now - seen).total_seconds() >= timeout
    if memo is not None and now < memo.earliest_stop:
        hub_idle = False
    aged = _aged(server, policy, now)
    could_stop = (hub_idle or aged) and _stop_allowed(server, policy) is None and (not o.is_gpu or (gpu is not None and gpu.idle))
    could_reclaim = (
        o.kind in policy.reclaim_kinds
        and policy.kernel_timeout_for(o) > 0
        and _memory_held(gpu, policy)
        and (gpu is not None and (gpu.idle or not policy.gpu_activity_blocks_kernel_reclaim))
        and (memo is None or (memo.earliest_reclaim is not None and now >= memo.earliest_reclaim))
    )
    return KernelAsk(kernels=bool(could_stop or could_reclaim), status=bool(could_stop))


def _kernel_words(kv: KernelView) -> str:
    if not kv.kernels:
        return "no kernels"
    busy = kv.busy_kernels
    if busy:
        desc = ", ".join(f"{k.id[:8]} {k.execution_state}" for k in busy)
        return f"{len(busy)} of {len(kv.kernels)} kernels busy ({desc})"
    return f"{len(kv.kernels)} kernels, none busy"


def _claims(
    kernels: KernelView | None,
    inactive: timedelta | None,
    timeout: int,
    arbiter_idle: bool | None,
) -> tuple[str, ...]:
    """What kept a server whose GPU has been idle past its bound: all of it
    comes from the pod (its kernels, its status, the activity it reported)."""
    out = []
    if kernels is not None and kernels.ok and kernels.busy_kernels:
        out.append(_kernel_words(kernels))
    if kernels is not None and not kernels.ok:
        out.append(f"kernel view unavailable ({kernels.error})")
    if inactive is None:
        out.append("no activity time known")
    elif inactive < timedelta(0):
        out.append(f"activity {format_td(-inactive)} in the future")
    elif timeout > 0 and inactive.total_seconds() < timeout:
        out.append(f"activity {format_td(inactive)} ago (hub, server status or kernels)")
    if arbiter_idle is False:
        out.append("cull_arbiter_hook said not idle")
    return tuple(out) or ("nothing",)


def decide(
    server: ServerRecord,
    kernels: KernelView | None,
    gpu: PodGpuView | None,
    policy: Policy,
    now: datetime,
    arbiter_idle: bool | None = None,
    gpu_last_active: datetime | None = None,
    gpu_idle_since: datetime | None = None,
) -> Decision:
    """Decide what to do with one server. ``gpu`` is None for servers without a
    GPU; ``kernels`` None when they were not asked (see :func:`plan_kernel_view`);
    ``arbiter_idle`` is a custom ``cull_arbiter_hook``'s answer, if one is set;
    ``gpu_last_active`` the last time an earlier cycle saw the pod's GPU active
    (so that activity older than the window still counts for the timeout);
    ``gpu_idle_since`` the start of the pod's GPU idle streak
    (:func:`track_gpu_idle`)."""
    o = server.offering
    if server.pending:
        return Decision(KEEP, reasons=(f"pending {server.pending}",))
    if not server.ready:
        return Decision(KEEP, reasons=("not ready",))

    timeout = policy.timeout_for(o)
    seen = last_seen(server, kernels, gpu_last_active)
    inactive = now - seen if seen is not None else None
    what = f"offering {o.slug!r}, kind {o.kind}" if o.slug else f"kind {o.kind}"
    limit = format_td(timedelta(seconds=timeout)) if timeout > 0 else "never"
    if inactive is not None and inactive < timedelta(0):  # only a pod's claim can say so
        idle_words = f"activity claimed {format_td(-inactive)} in the future"
    else:
        idle_words = f"inactive for {format_td(inactive)}"
    reasons = [f"{idle_words} (timeout {limit}, {what})"]
    held: list[str] = []
    vetoes: list[str] = []

    if kernels is None:
        reasons.append("kernels not asked" if o.url else "no kernel view (no direct url)")
    elif kernels.ok:
        reasons.append(_kernel_words(kernels))
        if kernels.busy_kernels:
            vetoes.append("a kernel is busy")
    else:
        reasons.append(f"kernel view unavailable ({kernels.error})")

    memory = gpu.memory_mib if gpu is not None else None
    if o.is_gpu:
        if gpu is None:
            gpu_words = "GPU view not asked"
        else:
            gpu_words = f"GPU {gpu.state}: {gpu.reason}"
        reasons.append(gpu_words)
        reasons.append(f"GPU memory held {memory:.0f} MiB" if memory is not None else "GPU memory held unknown")
        if gpu is not None and gpu.active:
            vetoes.append("GPU active in the window")

    # --- the GPU lease: the hard maximum, which nothing vetoes -------------
    age = lease_over(server, policy, now)
    if age is not None and _stop_allowed(server, policy) is None:
        return _lease_decision(server, policy, age, reasons, memory)

    # --- free the device: stop the server ---------------------------------
    if arbiter_idle is not None:
        time_idle = bool(arbiter_idle)
    else:
        time_idle = timeout > 0 and inactive is not None and inactive.total_seconds() >= timeout
    aged = _aged(server, policy, now)
    blocked = _stop_allowed(server, policy)
    if time_idle or aged:
        stop_reason = IDLE if time_idle else MAX_AGE
        if aged and not time_idle:
            reasons.append(f"older than max_age {format_td(timedelta(seconds=policy.max_age))}")
        if vetoes:
            pass  # a keep; the vetoes are in the reasons
        elif blocked:
            reasons.append(blocked)
        elif o.is_gpu and (gpu is None or not gpu.idle):
            held.append("no GPU-based cull without a known-idle GPU view")
        elif o.url and policy.require_kernel_view and not (kernels is not None and kernels.ok):
            held.append("no cull without the server's kernel view (require_kernel_view)")
        else:
            return Decision(
                STOP,
                stop_reason=stop_reason,
                reasons=tuple(reasons),
                memory_mib=memory,
                inactive=inactive,
            )

    # --- the pod's word against the GPU's telemetry -------------------------
    gpu_idle_for = gpu_idle_past_limit(server, gpu, policy, now, gpu_idle_since)
    if gpu_idle_for is not None and blocked is None:
        limit = format_td(timedelta(seconds=policy.gpu_idle_limit_for(o)))
        return Decision(
            STOP,
            stop_reason=GPU_IDLE_LIMIT,
            reasons=tuple(reasons + [f"GPU idle for {format_td(gpu_idle_for)} (gpu_idle_limit {limit})"]),
            memory_mib=memory,
            inactive=inactive,
            overruled=_claims(kernels, inactive, timeout, arbiter_idle),
            gpu_idle_for=gpu_idle_for,
        )

    # --- reclaim memory, keep the server ----------------------------------
    ktimeout = policy.kernel_timeout_for(o)
    if o.kind in policy.reclaim_kinds and ktimeout > 0 and kernels is not None and kernels.ok:
        idle_kernels = []
        for k in kernels.kernels:
            if not k.reclaimable or k.last_activity is None:
                continue
            idle_for = now - k.last_activity
            if idle_for.total_seconds() < ktimeout:
                continue
            if k.connections and not policy.reclaim_connected_kernels:
                continue
            idle_kernels.append(
                KernelAction(
                    k.id,
                    f"kernel {k.id[:8]} ({k.name}) idle for {format_td(idle_for)} "
                    f"(kernel timeout {format_td(timedelta(seconds=ktimeout))}, "
                    f"{k.connections} connections)",
                    idle_for,
                    ktimeout,
                )
            )
        if policy.kernel_shutdowns_per_cycle > 0 and len(idle_kernels) > policy.kernel_shutdowns_per_cycle:
            later = len(idle_kernels) - policy.kernel_shutdowns_per_cycle
            idle_kernels = idle_kernels[: policy.kernel_shutdowns_per_cycle]
            reasons.append(f"{later} more idle kernel(s) wait for later cycles (kernel_shutdowns_per_cycle)")
        if idle_kernels:
            blocks = policy.gpu_activity_blocks_kernel_reclaim
            if memory is None:
                held.append("no kernel shutdown while GPU memory held is unknown")
            elif memory < policy.memory_held_mib:
                reasons.append(f"idle kernels hold no GPU memory worth reclaiming ({memory:.0f} < {policy.memory_held_mib:g} MiB)")
            elif blocks and gpu is not None and gpu.active:
                reasons.append("idle kernels kept: GPU active in the window")
            elif blocks and (gpu is None or not gpu.idle):
                held.append("no kernel shutdown while GPU activity is unknown")
            else:
                return Decision(
                    RECLAIM,
                    shutdown=tuple(idle_kernels),
                    reasons=tuple(reasons + [a.reason for a in idle_kernels]),
                    held_back=tuple(held),
                    memory_mib=memory,
                    inactive=inactive,
                )

    return Decision(
        HELD_BACK if held else KEEP,
        reasons=tuple(reasons),
        held_back=tuple(held),
        memory_mib=memory,
        inactive=inactive,
    )


def decide_unresponsive(
    server: ServerRecord,
    gpu: PodGpuView | None,
    policy: Policy,
    now: datetime,
    gpu_idle_since: datetime | None,
    stalls: int,
) -> Decision:
    """A server whose pod has missed the cycle's deadline ``stalls`` cycles in a row
    (its work still carried over): nothing it answers is waited for any more. Once
    the stalls reach ``stalls_before_telemetry``, a GPU server whose telemetry is
    known idle now, and has been idle for at least the offering's idle timeout, is
    stopped (reason ``unresponsive``); otherwise it is held back until its pod
    finishes. Real GPU activity keeps it, as always."""
    o = server.offering
    timeout = policy.timeout_for(o)
    words = f"its pod missed the cycle's deadline {stalls} cycle(s) in a row; its work is carried over"
    reasons = [words]
    memory = gpu.memory_mib if gpu is not None else None
    if gpu is not None:
        reasons.append(f"GPU {gpu.state}: {gpu.reason}")
    held = "waiting for its pod to answer"
    age = lease_over(server, policy, now)
    if age is not None and _stop_allowed(server, policy) is None:
        return _lease_decision(server, policy, age, reasons, memory)
    if stalls < policy.stalls_before_telemetry:
        return Decision(HELD_BACK, reasons=tuple(reasons), held_back=(held,), memory_mib=memory)
    blocked = _stop_allowed(server, policy)
    if not o.is_gpu or timeout <= 0 or blocked:
        reasons.append(blocked or ("no GPU telemetry to judge it by" if not o.is_gpu else "its timeout is 0 (never stopped for idleness)"))
        return Decision(HELD_BACK, reasons=tuple(reasons), held_back=(held,), memory_mib=memory)
    if gpu is None or not gpu.idle or gpu_idle_since is None:
        return Decision(
            KEEP if gpu is not None and gpu.active else HELD_BACK,
            reasons=tuple(reasons),
            held_back=() if gpu is not None and gpu.active else (held + "; its GPU is not known idle",),
            memory_mib=memory,
        )
    idle_for = now - gpu_idle_since
    if idle_for.total_seconds() < timeout:
        reasons.append(f"GPU idle for {format_td(idle_for)} of its timeout {format_td(timedelta(seconds=timeout))}")
        return Decision(HELD_BACK, reasons=tuple(reasons), held_back=(held,), memory_mib=memory)
    reasons.append(f"GPU idle for {format_td(idle_for)} (timeout {format_td(timedelta(seconds=timeout))})")
    return Decision(
        STOP,
        stop_reason=UNRESPONSIVE,
        reasons=tuple(reasons),
        memory_mib=memory,
        overruled=(f"no answer within the deadline for {stalls} cycles",),
        gpu_idle_for=idle_for,
    )


@dataclass(frozen=True)
class Upcoming:
    """An action :func:`decide` will take at ``at`` if nothing changes (no activity,
    the same GPU view): what the culler warns the user about."""

    action: str
    at: datetime
    decision: Decision


def upcoming(
    server: ServerRecord,
    kernels: KernelView | None,
    gpu: PodGpuView | None,
    policy: Policy,
    now: datetime,
    horizon_s: int,
    gpu_last_active: datetime | None = None,
    gpu_idle_since: datetime | None = None,
) -> Upcoming | None:
    """The stop or reclaim that :func:`decide` would reach within ``horizon_s``
    seconds on the same views, and the first second at which it would.

    It asks :func:`decide` itself (at ``now + horizon_s``, then by bisection to
    the second), so a warning can never disagree with the decision it announces:
    a warning changes nothing that is decided, it only tells the user first.
    Everything ``decide`` weighs only grows with time on fixed views (idle time,
    age, GPU idle streak), which is what makes the bisection sound.
    """
    if horizon_s <= 0:
        return None

    def at(seconds: int) -> Decision:
        return decide(
            server,
            kernels,
            gpu,
            policy,
            now + timedelta(seconds=seconds),
            None,
            gpu_last_active,
            gpu_idle_since,
        )

    later = at(horizon_s)
    if later.action not in (STOP, RECLAIM):
        return None
    lo, hi = 0, horizon_s
    if at(lo).action == later.action:
        hi = 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if at(mid).action == later.action:
            hi = mid
        else:
            lo = mid
    return Upcoming(later.action, now + timedelta(seconds=hi), at(hi))
