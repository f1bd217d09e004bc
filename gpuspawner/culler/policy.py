"""The culler's settings as its decisions read them (Policy), the actions and the decision record (CullDecision), and the defaults. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from gpuspawner.culler.contract import ServerOffering
from gpuspawner.culler.records import BUDGET, GPU_IDLE_LIMIT, GPU_LEASE, UNRESPONSIVE, ServerRecord
from gpuspawner.names.vocabulary import BUDGET_COST, BUDGET_HOURS, Kind, StopReason

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
#: (gpu_lease, budget, unresponsive): no "Keep" is offered for them
NOT_KEEPABLE: frozenset[str] = frozenset({GPU_IDLE_LIMIT, GPU_LEASE, BUDGET, UNRESPONSIVE})

#: what a GPU lease ends with, per offering (``offering_gpu_lease_ends``): the server
#: stopped, or every kernel shut down (the server stays, and a new lease begins)
LEASE_ENDS_STOP, LEASE_ENDS_RECLAIM = "stop", "reclaim"

#: what one extension adds to a GPU lease, by default (seconds)
DEFAULT_LEASE_EXTENSION = 60 * 60


@dataclass(frozen=True)
class LeaseGrant:
    """What a server's GPU lease has been granted beyond its length, for one instance of the
    server (``started``: a new start is a new lease): the extensions its user took, and when
    a lease that ended by reclaiming the kernels began again."""

    started: datetime | None
    extensions: int = 0
    renewed_at: datetime | None = None


#: the two budgets a user's servers may be stopped for: GPU-hours, and money
#: (``c.GPUSpawner.user_gpu_budget``'s ``"hours"`` and ``"cost"``)
GPU_HOURS, COST = BUDGET_HOURS, BUDGET_COST


@dataclass(frozen=True)
class BudgetRunway:
    """A user's GPU-hour budget as the hub exports it (``gpuspawner_budget_*``), read this
    cycle: hours left when read, and the GPU-hours per hour their running servers spend; or,
    ``measure`` :data:`COST`, their cost budget (``gpuspawner_cost_budget_*``): money left, and
    money per hour."""

    remaining_hours: float
    rate_per_hour: float
    as_of: datetime
    measure: str = GPU_HOURS

    @property
    def is_cost(self) -> bool:
        return self.measure == COST

    @property
    def name(self) -> str:
        """What the user is told the budget is: "cost budget" or "GPU-hour budget"."""
        return "cost budget" if self.is_cost else "GPU-hour budget"

    def runs_out_at(self) -> datetime | None:
        """When the budget reaches 0 at this rate (None: it never does at this rate)."""
        if self.remaining_hours <= 0:
            return self.as_of
        if self.rate_per_hour <= 0:
            return None
        return self.as_of + timedelta(hours=self.remaining_hours / self.rate_per_hour)


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
    #: per offering slug; wins over the kind's (0: no lease for that offering)
    offering_gpu_leases: Mapping[str, int] = field(default_factory=dict)
    #: seconds of idleness after which a GPU server is reclaimed while spawns wait for its
    #: offering (far shorter than the idle timeout); 0 or less: off
    reclaim_for_waiting_after: int = 0
    #: per offering slug; wins over ``reclaim_for_waiting_after``
    offering_reclaim_for_waiting_after: Mapping[str, int] = field(default_factory=dict)
    #: this cycle's waiting spawns per offering slug: (how many, the offering's name)
    waiting: Mapping[str, tuple[int, str]] = field(default_factory=dict)
    #: this cycle's servers (pod namespace, pod name) whose turn it is to make room for a
    #: waiting spawn -- the longest idle of their offering, as many as spawns wait
    #: (:func:`gpuspawner.culler.observations.turns`) -- and when their turn began
    turns: Mapping[tuple[str, str], datetime] = field(default_factory=dict)
    #: seconds a server is in turn before it may be reclaimed for the waiting, so that its
    #: user is warned first even when it was idle long before anyone waited (the culler's
    #: ``warn_before_seconds`` where it warns; 0 where it does not)
    turn_notice: int = 0
    #: extensions a user may take of a GPU lease (while nobody waits for its offering)
    gpu_lease_extensions: int = 0
    #: per offering slug; wins over ``gpu_lease_extensions``
    offering_gpu_lease_extensions: Mapping[str, int] = field(default_factory=dict)
    #: seconds each extension adds
    gpu_lease_extension: int = DEFAULT_LEASE_EXTENSION
    #: per offering slug, what its lease ends with: ``LEASE_ENDS_STOP`` (the default) or
    #: ``LEASE_ENDS_RECLAIM`` (every kernel shut down, the server kept)
    offering_gpu_lease_ends: Mapping[str, str] = field(default_factory=dict)
    #: this cycle's lease grants per (user, server name) (:class:`LeaseGrant`)
    leases: Mapping[tuple[str, str], LeaseGrant] = field(default_factory=dict)
    #: this cycle's GPU-hour budgets per user, as the hub exports them
    budgets: Mapping[str, BudgetRunway] = field(default_factory=dict)
    #: per user, when the culler first saw their budget run out within ``turn_notice``: a
    #: server is stopped for its budget no earlier than that plus ``turn_notice`` (warned first)
    budget_noticed: Mapping[str, datetime] = field(default_factory=dict)
    #: the same two of the users' cost budgets (money left, money per hour)
    cost_budgets: Mapping[str, BudgetRunway] = field(default_factory=dict)
    cost_budget_noticed: Mapping[str, datetime] = field(default_factory=dict)

    def idle_timeout_for(self, offering: ServerOffering) -> int:
        """The offering's idle timeout as configured (0 or less: never stopped for idleness)."""
        if offering.slug and offering.slug in self.offering_timeouts:
            return int(self.offering_timeouts[offering.slug])
        return int(self.kind_timeouts.get(offering.kind, self.default_timeout))

    def waiting_bound_for(self, offering: ServerOffering) -> int:
        """``reclaim_for_waiting_after`` for the offering (0: off)."""
        if not offering.is_gpu:
            return 0
        if offering.slug and offering.slug in self.offering_reclaim_for_waiting_after:
            return max(0, int(self.offering_reclaim_for_waiting_after[offering.slug]))
        return max(0, int(self.reclaim_for_waiting_after))

    def in_turn(self, offering: ServerOffering) -> bool:
        """Whether this server makes room for a waiting spawn this cycle: spawns wait for its
        offering, it is among the longest idle of it, and the admin set a bound shorter than
        its idle timeout (a timeout of 0 means "never stopped for idleness": nor for this)."""
        bound, timeout = self.waiting_bound_for(offering), self.idle_timeout_for(offering)
        return (
            0 < bound < timeout
            and self.waiting.get(offering.slug or "", (0, ""))[0] > 0
            and (offering.namespace or "", offering.pod or "") in self.turns
        )

    def turn_ready_at(self, offering: ServerOffering) -> datetime | None:
        """The earliest time this server, in turn, may be reclaimed for the waiting: its
        turn's start plus ``turn_notice`` (None: not in turn)."""
        began = self.turns.get((offering.namespace or "", offering.pod or ""))
        return began + timedelta(seconds=max(0, self.turn_notice)) if began is not None else None

    def timeout_for(self, offering: ServerOffering) -> int:
        """The idleness after which the server is stopped this cycle: its idle timeout, or
        ``reclaim_for_waiting_after`` while it is in turn (:meth:`in_turn`)."""
        if self.in_turn(offering):
            return self.waiting_bound_for(offering)
        return self.idle_timeout_for(offering)

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
        if offering.slug and offering.slug in self.offering_gpu_leases:
            return max(0, int(self.offering_gpu_leases[offering.slug]))
        return max(0, int(self.gpu_leases.get(offering.kind, 0)))

    def lease_extensions_for(self, offering: ServerOffering) -> int:
        """How many times a user may extend the offering's GPU lease (0: never)."""
        if offering.slug and offering.slug in self.offering_gpu_lease_extensions:
            return max(0, int(self.offering_gpu_lease_extensions[offering.slug]))
        return max(0, int(self.gpu_lease_extensions))

    def lease_reclaims_kernels(self, offering: ServerOffering) -> bool:
        """Whether the offering's lease ends by shutting its kernels down (not the server)."""
        return self.offering_gpu_lease_ends.get(offering.slug or "", LEASE_ENDS_STOP) == LEASE_ENDS_RECLAIM

    def lease_grant(self, server: ServerRecord) -> LeaseGrant:
        """The server's grant (none taken: an empty one); a grant of an earlier start is moot."""
        grant = self.leases.get((server.user, server.name))
        if grant is None or grant.started != server.started:
            return LeaseGrant(server.started)
        return grant

    def lease_began(self, server: ServerRecord) -> datetime | None:
        """When the server's current lease began: its start, or the last time its lease
        ended by reclaiming its kernels."""
        grant = self.lease_grant(server)
        return grant.renewed_at or server.started

    def lease_ends_at(self, server: ServerRecord) -> datetime | None:
        """When the server's GPU lease ends, with the extensions its user took (None: no lease)."""
        length = self.gpu_lease_for(server.offering)
        began = self.lease_began(server)
        if length <= 0 or began is None:
            return None
        grant = self.lease_grant(server)
        return began + timedelta(seconds=length + grant.extensions * max(0, int(self.gpu_lease_extension)))

    def budget_stop(self, server: ServerRecord) -> tuple[datetime, BudgetRunway] | None:
        """When the server is stopped because a budget of its user's runs out, and which
        budget (the GPU-hour one or the cost one, whichever stops it first): when it reaches 0
        at the rate of their running servers, and no earlier than ``turn_notice`` after the
        culler first saw that coming (None: neither runs out, or the server costs nothing
        against the one that does)."""
        if not server.offering.is_gpu:
            return None
        stops = []
        for runways, noticed_at, per_hour in (
            (self.budgets, self.budget_noticed, server.offering.hourly_cost),
            (self.cost_budgets, self.cost_budget_noticed, server.offering.hourly_price),
        ):
            runway = runways.get(server.user)
            out = runway.runs_out_at() if runway is not None else None
            if runway is None or out is None or (per_hour is not None and per_hour <= 0):
                continue
            noticed = noticed_at.get(server.user)
            if noticed is not None:
                out = max(out, noticed + timedelta(seconds=max(0, self.turn_notice)))
            stops.append((out, runway))
        return min(stops, key=lambda stop: stop[0]) if stops else None

    def budget_stop_at(self, server: ServerRecord) -> datetime | None:
        """When the server is stopped because a budget of its user's runs out (:meth:`budget_stop`)."""
        stop = self.budget_stop(server)
        return stop[0] if stop is not None else None

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
        timeout = self.idle_timeout_for(offering)
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
class CullDecision:
    action: str
    #: why, when action is stop (or a reclaim for a waiting spawn)
    stop_reason: StopReason | None = None
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
