"""Admission: may this spawn go ahead now? Pure.

Per offering, when nothing is free: ``block`` refuses at once, ``warn`` starts
anyway and says it may wait, ``queue`` waits for capacity up to a time limit.
An offering on an autoscaled pool (``scalable_nodes``) is never refused for
lack of nodes: the pool grows when the pod asks; unless discovery read the pool's
limit and it is reached (``Offering.pool``): then it is refused at once. Quotas cap what a user (across
all their named servers) and a group (all its members together) hold at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from gpuspawner.capacity.counts import units
from gpuspawner.core import wording
from gpuspawner.core.model import Availability, Offering
from gpuspawner.core.wording import queue_words
from gpuspawner.names.vocabulary import AdmissionPolicy, Kind, Refusal

#: The decision's action. ``warn`` and ``queue`` are also the names of the admin's
#: :class:`~gpuspawner.names.vocabulary.AdmissionPolicy` that leads to them; ``block`` leads to ``refuse``.
ADMIT, WARN, QUEUE, REFUSE = "admit", "warn", "queue", "refuse"
#: Quota keys: "total" counts every GPU unit, a kind name counts that kind only.
QUOTA_KEYS = ("total", *(k.value for k in Kind if k is not Kind.CPU))


@dataclass(frozen=True)
class Decision:
    action: str
    message: str = ""
    #: The Kueue LocalQueue whose quota, not the nodes, refused or delayed it ("" otherwise).
    queue: str = ""


@dataclass(frozen=True)
class Held:
    """GPU units one server holds (or has been granted): its offering's kind, how many
    units, and whose they are (the user's pod-label form, ``hub.jupyter.org/username``)."""

    kind: str
    units: int
    user: str = ""


def units_held(offering: Offering, requests: Mapping[str, int]) -> int:
    """How many units of ``offering`` a pod with ``requests`` holds (at least 1 for a GPU pod).

    A DRA pod requests no extended resource: its devices are in its claim, which the pod's
    requests do not show, so a bound DRA pod counts as 1 unit (this hub process's own grant,
    with the true count, overlays it while the pod runs; see :class:`QuotaLedger`)."""
    return max(units(offering, requests), 1) if offering.takes_units else 0


def alternatives(options: Iterable[tuple[Offering, Availability]], exclude: str, limit: int = 4) -> str:
    """ "MIG 1g.5gb (2), T4 1/4 share (3)": free GPU offerings the user may take instead."""
    free = [f"{o.display_name} ({a.free})" for o, a in options if o.slug != exclude and o.is_gpu and not o.hidden and (a.free or 0) > 0]
    return ", ".join(free[:limit])


def admit(
    offering: Offering,
    count: int,
    avail: Availability,
    default_policy: AdmissionPolicy | str,
    others: Iterable[tuple[Offering, Availability]] = (),
) -> Decision:
    """The decision for ``count`` units of ``offering`` given its availability now."""
    if not offering.takes_units or not avail.counted:
        return Decision(ADMIT)
    if (avail.largest_free or 0) >= count:
        return Decision(ADMIT)
    what = offering.display_name if count == 1 else f"{count} x {offering.display_name} on one node"
    instead = alternatives(others, offering.slug)
    room = avail.queue
    by_queue = room.queue if room is not None and room.known and (room.largest or 0) < count else ""
    if room is not None and by_queue:  # Kueue's quota alone refuses it
        why = wording.none_free_queue_words(
            what, queue_words(room.queue, room.largest or 0, avail.node_free or 0, room.borrowed, room.cohort)
        )
    elif offering.pool is not None and offering.pool.at_limit:  # no node can come: at once, whatever the policy
        return Decision(REFUSE, wording.pool_at_limit_refusal(what, offering.pool.limit) + wording.free_instead_words(instead))
    elif offering.scalable_nodes:
        return Decision(WARN, wording.scale_up_warning(what, offering.scale_up_minutes))
    else:
        why = wording.none_free_words(what, avail.free, avail.capacity)
    refusal = why + wording.free_instead_words(instead)
    policy = offering.admission or default_policy
    if policy == AdmissionPolicy.WARN:
        return Decision(WARN, wording.wait_warning(what, refusal), by_queue)
    if policy == AdmissionPolicy.QUEUE:
        return Decision(QUEUE, wording.queued_message(what), by_queue)
    return Decision(REFUSE, refusal, by_queue)


@dataclass(frozen=True)
class Quotas:
    """``user``: {key: max units}; ``groups``: group -> {key: max units for all members together}."""

    user: Mapping[str, int] = field(default_factory=dict)
    groups: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


def _over(limits: Mapping[str, int], held: Iterable[Held], kind: str, count: int) -> tuple[str, int, int] | None:
    held = list(held)
    for key, limit in limits.items():
        if key != "total" and key != kind:
            continue
        now = sum(h.units for h in held if key == "total" or h.kind == key)
        if now + count > limit:
            return key, now, limit
    return None


def check_quota(
    offering: Offering,
    count: int,
    quotas: Quotas,
    user_held: Iterable[Held],
    group_held: Mapping[str, Iterable[Held]],
) -> Decision:
    """Refuse when this spawn would take a user or one of their groups over quota."""
    if not offering.is_gpu or not offering.takes_units:
        return Decision(ADMIT)
    kind = offering.kind.value
    over = _over(quotas.user, user_held, kind, count)
    if over:
        key, now, limit = over
        return Decision(REFUSE, wording.over_user_quota(limit, key, now))
    for group, held in group_held.items():
        limits = quotas.groups.get(group) or {}
        over = _over(limits, held, kind, count)
        if over:
            key, now, limit = over
            return Decision(REFUSE, wording.over_group_quota(group, limit, key, now))
    return Decision(ADMIT)


def validate_quota(value: object, where: str) -> dict[str, int]:
    """Check one quota dict from config; raises ValueError naming ``where``."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} must be a dict like {{'total': 2, 'full': 1}}, got {value!r}")
    for key, limit in value.items():
        if key not in QUOTA_KEYS:
            raise ValueError(f"{where}: unknown key {key!r}; use one of {list(QUOTA_KEYS)}")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"{where}[{key!r}] must be a whole number >= 0, got {limit!r}")
    return dict(value)


@dataclass(frozen=True)
class QuotaRequest:
    """One server's quota question: ``count`` units of ``offering`` for ``user``'s server ``key``.

    ``group_members``: the user's groups that have a quota -> their member users;
    ``bound``: what bound pods hold now, by server key (the ledger adds its grants)."""

    key: str
    offering: Offering
    count: int
    user: str
    quotas: Quotas
    group_members: Mapping[str, Iterable[str]] = field(default_factory=dict)
    bound: Mapping[str, Held] = field(default_factory=dict)


class QuotaLedger:
    """The GPU units this hub process has granted and not yet taken back, by server.

    What a user holds is what the cluster says runs: the bound pods of this hub
    (:meth:`holdings`' ``bound``, from the live index), plus what the hub has granted and the
    cluster does not show yet. Between admission and the scheduler binding the pod (and the
    inventory seeing it) a spawn is visible nowhere else, so each grant is recorded under the
    server's key (the pod's ``namespace/name``); while its pod is bound the grant stands for it
    (with the true count: a DRA pod's devices are not in its requests), and it is taken back
    when :meth:`pod_event` says the pod it was made for has left the cluster (deleted behind the
    hub's back: an eviction, its node gone, an admin's delete, a preemption), or at
    :meth:`release` (the server stopped, its start failed, or the hub found its pod gone).
    A pod that existed before the grant (the same server's old pod, still going) never takes
    a new grant with it: only a pod seen bound *after* the grant does.

    :meth:`grant` checks and records in one synchronous step: under asyncio nothing can
    run between the check and the record, so concurrent spawns of one user or group are
    granted exactly up to the quota, in whatever order they interleave.

    A hub that restarts with servers running starts with no grants; :meth:`restore` gives it
    back what each running server's saved record says it holds (its kind and true count: a
    DRA server's devices, a pod not bound yet), so a quota is the same before and after.
    """

    def __init__(self) -> None:
        self.grants: dict[str, Held] = {}
        #: The grants whose pod has been seen bound since they were made: its leaving ends them.
        self.seen: set[str] = set()
        #: Whether :meth:`restore` has run in this process.
        self.restored = False

    def restore(self, saved: Mapping[str, Held], bound: Iterable[str] = ()) -> None:
        """Grant what running servers held before this process began (by server key); a key
        granted since (a spawn in this process) keeps its own grant. ``bound``: the keys whose
        pods are bound now (their leaving ends the restored grant)."""
        live = set(bound)
        for key, held in saved.items():
            if key not in self.grants:
                self.grants[key] = held
                if key in live:
                    self.seen.add(key)
        self.restored = True

    def pod_event(self, key: str, present: bool) -> None:
        """The pod ``key`` of this hub was bound (``present``) or has left the cluster: a grant
        whose pod was seen bound since it was made ends when that pod leaves."""
        if key not in self.grants:
            return
        if present:
            self.seen.add(key)
        elif key in self.seen:
            self.release(key)

    def holdings(self, bound: Mapping[str, Held], exclude: str = "") -> dict[str, Held]:
        """Everything held now, by server key: bound pods, overlaid by grants (one per key)."""
        held = {**bound, **self.grants}
        held.pop(exclude, None)
        return held

    def check(self, request: QuotaRequest) -> Decision:
        """Check ``request`` against its user's quota and that of each of its groups. Records nothing."""
        held = self.holdings(request.bound, exclude=request.key)
        members = {group: set(users) for group, users in request.group_members.items()}
        return check_quota(
            request.offering,
            request.count,
            request.quotas,
            [h for h in held.values() if h.user == request.user],
            {group: [h for h in held.values() if h.user in names] for group, names in members.items()},
        )

    def grant(self, request: QuotaRequest) -> Decision:
        """:meth:`check`, and record the grant when admitted (a GPU offering that takes units)."""
        decision = self.check(request)
        offering = request.offering
        if decision.action != REFUSE and offering.is_gpu and offering.takes_units:
            self.grants[request.key] = Held(offering.kind.value, request.count, request.user)
            self.seen.discard(request.key)  # (an old pod of the same name, still going, is not this grant's)
        return decision

    def release(self, key: str) -> None:
        """The server ``key`` holds nothing any more (stopped, its start failed, or its pod is gone)."""
        self.grants.pop(key, None)
        self.seen.discard(key)


def in_order(
    offering: Offering,
    count: int,
    closed: str,
    quota: Callable[[], Decision],
    availability: Callable[[Offering], Availability],
    others: Callable[[], Iterable[Offering]],
    policy: AdmissionPolicy | str,
) -> tuple[str, Decision]:
    """What stands in the way of ``count`` units of ``offering`` now, checked in order: its
    time window (``closed``: why it is closed now, "" when open; every kind, also those
    without a Kubernetes resource), then ``quota`` (called only when the window is open and
    the offering takes units: it may record a grant), then capacity (the ``availability``
    of the offering and of the ``others`` this user may take, for the alternatives).

    Returns (the refusal reason for the metrics, the decision); the reason is "" unless refused.
    """
    if closed:
        return Refusal.WINDOW, Decision(REFUSE, wording.window_closed(offering.display_name, closed))
    if not offering.takes_units:
        return "", Decision(ADMIT)
    decision = quota()
    if decision.action == REFUSE:
        return Refusal.QUOTA, decision
    decision = admit(offering, count, availability(offering), policy, [(o, availability(o)) for o in others()])
    return (Refusal.NO_CAPACITY if decision.action == REFUSE else ""), decision
