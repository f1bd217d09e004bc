"""Pure decisions, each with its reasons. No I/O here: plain data in, plain data out.

Per server, in order:

1. pending or not ready: keep. Then a GPU server at the end of its GPU lease
   (``gpu_leases``, with the extensions its user took): **stop**, or **reclaim** every
   kernel where the offering's lease ends so (``offering_gpu_lease_ends``), whatever else
   is true -- the hard maximum nothing vetoes; and a GPU server whose user's GPU-hour
   budget ran out: **stop** (reason ``budget``), warned first. (A server whose pod missed
   the cycle's deadline is judged by :func:`decide_unresponsive` instead.)
2. **stop** (free the device) when inactive (hub activity, the server's own
   ``/api/status``, every kernel's ``last_activity``) for longer than the
   offering's timeout, or older than ``max_age`` -- or, while spawns wait for its
   offering and it is among the longest idle of it (``Policy.in_turn``), for longer
   than ``reclaim_for_waiting_after`` (reason ``waiting``) -- unless

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

from dataclasses import dataclass
from datetime import datetime, timedelta

from jupyterhub_idle_culler import format_td

from gpuspawner.culler.gpu_metrics import PodGpuView
from gpuspawner.culler.observations import aged_out, budget_over, gpu_idle_past_limit, last_seen, lease_over, stop_allowed
from gpuspawner.culler.policy import HELD_BACK, KEEP, RECLAIM, STOP, CullDecision, KernelAction, Policy
from gpuspawner.culler.records import BUDGET, GPU_IDLE_LIMIT, GPU_LEASE, IDLE, MAX_AGE, UNRESPONSIVE, WAITING, KernelView, ServerRecord


def _lease_decision(
    server: ServerRecord, kernels: KernelView | None, policy: Policy, age: timedelta, reasons: list[str], memory: float | None
) -> CullDecision | None:
    """The end of the server's GPU lease: the server stopped, or -- where its offering's lease
    ends with a reclaim -- every kernel shut down, busy or not (its user was warned); None when
    config forbids stopping it."""
    grant = policy.lease_grant(server)
    lease = format_td(timedelta(seconds=policy.gpu_lease_for(server.offering)))
    extended = f" + {grant.extensions} extension(s)" if grant.extensions else ""
    words = f"holding its GPU for {format_td(age)}: its GPU lease ({lease}{extended}, gpu_leases) is over"
    if policy.lease_reclaims_kernels(server.offering):
        if kernels is None or not kernels.ok:
            why = kernels.error if kernels is not None else "not asked"
            return CullDecision(
                HELD_BACK,
                reasons=tuple([*reasons, words]),
                held_back=(f"its kernels are shut down once its kernel view can be read ({why})",),
                memory_mib=memory,
            )
        shutdown = tuple(KernelAction(k.id, f"kernel {k.id[:8]} ({k.name}, {k.execution_state}): {words}") for k in kernels.kernels)
        return CullDecision(
            RECLAIM,
            stop_reason=GPU_LEASE,
            shutdown=shutdown,
            reasons=tuple([*reasons, words, "offering_gpu_lease_ends: reclaim"]),
            memory_mib=memory,
        )
    if stop_allowed(server, policy) is not None:
        return None
    return CullDecision(STOP, stop_reason=GPU_LEASE, reasons=tuple([*reasons, words]), memory_mib=memory)


def _budget_decision(server: ServerRecord, policy: Policy, reasons: list[str], memory: float | None) -> CullDecision:
    stop = policy.budget_stop(server)
    assert stop is not None  # (budget_over said so)
    runway = stop[1]
    left = "" if runway.is_cost else " hours"  # (money: the site's own unit, unnamed)
    words = f"its user's {runway.name} ran out ({runway.remaining_hours:.2f}{left} left at {runway.as_of:%H:%M} UTC, spending {runway.rate_per_hour:g} per hour)"
    return CullDecision(STOP, stop_reason=BUDGET, reasons=tuple([*reasons, words]), memory_mib=memory)


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
) -> CullDecision:
    """Decide what to do with one server. ``gpu`` is None for servers without a
    GPU; ``kernels`` None when they were not asked (see :func:`plan_kernel_view`);
    ``arbiter_idle`` is a custom ``cull_arbiter_hook``'s answer, if one is set;
    ``gpu_last_active`` the last time an earlier cycle saw the pod's GPU active
    (so that activity older than the window still counts for the timeout);
    ``gpu_idle_since`` the start of the pod's GPU idle streak
    (:func:`track_gpu_idle`)."""
    o = server.offering
    if server.pending:
        return CullDecision(KEEP, reasons=(f"pending {server.pending}",))
    if not server.ready:
        return CullDecision(KEEP, reasons=("not ready",))

    timeout = policy.timeout_for(o)
    inactive, reasons, vetoes = _observed(server, kernels, gpu, policy, now, gpu_last_active)
    memory = gpu.memory_mib if gpu is not None else None
    held: list[str] = []

    # --- the GPU lease and the GPU-hour budget: hard limits nothing vetoes ----
    age = lease_over(server, policy, now)
    if age is not None and (ended := _lease_decision(server, kernels, policy, age, reasons, memory)) is not None:
        return ended
    if budget_over(server, policy, now) and stop_allowed(server, policy) is None:
        return _budget_decision(server, policy, reasons, memory)

    # --- free the device: stop the server ---------------------------------
    if arbiter_idle is not None:
        time_idle = bool(arbiter_idle)
    else:
        time_idle = timeout > 0 and inactive is not None and inactive.total_seconds() >= timeout
        ready_at = policy.turn_ready_at(o) if policy.in_turn(o) else None
        if time_idle and ready_at is not None and now < ready_at and inactive is not None:
            if inactive.total_seconds() < policy.idle_timeout_for(o):  # its user is warned first
                time_idle = False
                reasons.append(f"in turn for the waiting; reclaimed from {ready_at.isoformat(timespec='seconds')} (warned first)")
    aged = aged_out(server, policy, now)
    blocked = stop_allowed(server, policy)
    if time_idle or aged:
        stop_reason = IDLE if time_idle else MAX_AGE
        if time_idle and arbiter_idle is None and policy.in_turn(o) and inactive is not None:
            if inactive.total_seconds() < policy.idle_timeout_for(o):
                stop_reason = WAITING  # idle past the shorter bound only because someone waits
                count, name = policy.waiting[o.slug or ""]
                reasons.append(f"{count} spawn(s) waiting for {name} (reclaim_for_waiting_after)")
        if aged and not time_idle:
            reasons.append(f"older than max_age {format_td(timedelta(seconds=policy.max_age))}")
        if vetoes:
            pass  # a keep; the vetoes are in the reasons
        elif blocked:
            reasons.append(blocked)
        elif unknown := _why_not_stop(server, kernels, gpu, policy):
            held.append(unknown)
        else:
            return CullDecision(STOP, stop_reason=stop_reason, reasons=tuple(reasons), memory_mib=memory, inactive=inactive)

    # --- the pod's word against the GPU's telemetry -------------------------
    gpu_idle_for = gpu_idle_past_limit(server, gpu, policy, now, gpu_idle_since)
    if gpu_idle_for is not None and blocked is None:
        limit = format_td(timedelta(seconds=policy.gpu_idle_limit_for(o)))
        return CullDecision(
            STOP,
            stop_reason=GPU_IDLE_LIMIT,
            reasons=tuple(reasons + [f"GPU idle for {format_td(gpu_idle_for)} (gpu_idle_limit {limit})"]),
            memory_mib=memory,
            inactive=inactive,
            overruled=_claims(kernels, inactive, timeout, arbiter_idle),
            gpu_idle_for=gpu_idle_for,
        )

    # --- reclaim memory, keep the server ----------------------------------
    reclaim = _reclaim(server, kernels, gpu, policy, now, reasons, held, memory, inactive)
    if reclaim is not None:
        return reclaim

    return CullDecision(
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
) -> CullDecision:
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
    if age is not None and (ended := _lease_decision(server, None, policy, age, reasons, memory)) is not None and ended.action == STOP:
        return ended  # (a lease that ends by reclaiming kernels waits for the pod to answer)
    if budget_over(server, policy, now) and stop_allowed(server, policy) is None:
        return _budget_decision(server, policy, reasons, memory)
    if stalls < policy.stalls_before_telemetry:
        return CullDecision(HELD_BACK, reasons=tuple(reasons), held_back=(held,), memory_mib=memory)
    blocked = stop_allowed(server, policy)
    if not o.is_gpu or timeout <= 0 or blocked:
        reasons.append(blocked or ("no GPU telemetry to judge it by" if not o.is_gpu else "its timeout is 0 (never stopped for idleness)"))
        return CullDecision(HELD_BACK, reasons=tuple(reasons), held_back=(held,), memory_mib=memory)
    if gpu is None or not gpu.idle or gpu_idle_since is None:
        return CullDecision(
            KEEP if gpu is not None and gpu.active else HELD_BACK,
            reasons=tuple(reasons),
            held_back=() if gpu is not None and gpu.active else (held + "; its GPU is not known idle",),
            memory_mib=memory,
        )
    idle_for = now - gpu_idle_since
    if idle_for.total_seconds() < timeout:
        reasons.append(f"GPU idle for {format_td(idle_for)} of its timeout {format_td(timedelta(seconds=timeout))}")
        return CullDecision(HELD_BACK, reasons=tuple(reasons), held_back=(held,), memory_mib=memory)
    reasons.append(f"GPU idle for {format_td(idle_for)} (timeout {format_td(timedelta(seconds=timeout))})")
    return CullDecision(
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
    decision: CullDecision


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

    def at(seconds: int) -> CullDecision:
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


def _reclaim(
    server: ServerRecord,
    kernels: KernelView | None,
    gpu: PodGpuView | None,
    policy: Policy,
    now: datetime,
    reasons: list[str],
    held: list[str],
    memory: float | None,
    inactive: timedelta | None,
) -> CullDecision | None:
    """Reclaim (shut down idle kernels, keep the server) where the offering's kind allows it
    and the idle kernels hold GPU memory worth it; None otherwise (``reasons`` and ``held``
    get what was found)."""
    o = server.offering
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
                return CullDecision(
                    RECLAIM,
                    shutdown=tuple(idle_kernels),
                    reasons=tuple(reasons + [a.reason for a in idle_kernels]),
                    held_back=tuple(held),
                    memory_mib=memory,
                    inactive=inactive,
                )
    return None


def _observed(
    server: ServerRecord,
    kernels: KernelView | None,
    gpu: PodGpuView | None,
    policy: Policy,
    now: datetime,
    gpu_last_active: datetime | None,
) -> tuple[timedelta | None, list[str], list[str]]:
    """What this cycle saw of ``server``: how long it has been inactive, the reasons (in the
    words of the action log) and the vetoes (a busy kernel, an active GPU)."""
    o = server.offering
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
    vetoes: list[str] = []

    if kernels is None:
        reasons.append("kernels not asked" if o.url else "no kernel view (no direct url)")
    elif kernels.ok:
        reasons.append(_kernel_words(kernels))
        if kernels.busy_kernels:
            vetoes.append("a kernel is busy")
    else:
        reasons.append(f"kernel view unavailable ({kernels.error})")

    if o.is_gpu:
        if gpu is None:
            gpu_words = "GPU view not asked"
        else:
            gpu_words = f"GPU {gpu.state}: {gpu.reason}"
        reasons.append(gpu_words)
        memory = gpu.memory_mib if gpu is not None else None
        reasons.append(f"GPU memory held {memory:.0f} MiB" if memory is not None else "GPU memory held unknown")
        if gpu is not None and gpu.active:
            vetoes.append("GPU active in the window")
    return inactive, reasons, vetoes


def _why_not_stop(server: ServerRecord, kernels: KernelView | None, gpu: PodGpuView | None, policy: Policy) -> str:
    """Why an idle or aged server is held back rather than stopped ("" when nothing holds it):
    unknown never justifies a cull."""
    o = server.offering
    if o.is_gpu and (gpu is None or not gpu.idle):
        return "no GPU-based cull without a known-idle GPU view"
    if o.url and policy.require_kernel_view and not (kernels is not None and kernels.ok):
        return "no cull without the server's kernel view (require_kernel_view)"
    return ""
