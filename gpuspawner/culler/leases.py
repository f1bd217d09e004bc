"""GPU leases their users extend: what each server's lease has been granted, kept in the
action log so that it survives a culler restart, and the lease as users and the hub's pages
see it (``api/leases``).

A lease belongs to one start of a server (its ``started`` time): a new start is a new lease.
Extending is the user's act, through the hub (its home page, or the page the notebook's
status item links to), never the pod's: the culler checks who asks (:mod:`.api`) and grants
an extension only while the lease runs, extensions are left, and nobody waits for the
offering. A lease that ends by reclaiming the kernels (``offering_gpu_lease_ends``) begins
again, with its extensions again, from that reclaim.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from gpuspawner.culler.actionlog import ActionLog
from gpuspawner.culler.dates import parse_time
from gpuspawner.culler.notices import duration_words, people_waiting, thing
from gpuspawner.culler.policy import RECLAIM, LeaseGrant, Policy
from gpuspawner.culler.records import GPU_LEASE, ServerRecord

#: the action log's "action" of an extension
EXTENDED = "lease_extended"


@dataclass(frozen=True)
class LeaseStatus:
    """One running server's lease, as the last cycle saw it: what ``api/leases`` answers."""

    user: str
    server: str
    offering: str | None
    kind: str
    started: datetime | None
    ends_at: datetime
    ends_with: str
    extensions_used: int
    extensions_allowed: int
    extension_seconds: int
    #: why it cannot be extended now ("" when it can)
    why_not: str

    @property
    def extensions_left(self) -> int:
        return max(0, self.extensions_allowed - self.extensions_used)

    def to_json(self) -> dict[str, Any]:
        return {
            "user": self.user,
            "server": self.server,
            "offering": self.offering,
            "kind": self.kind,
            "started": self.started.isoformat() if self.started else None,
            "ends_at": self.ends_at.isoformat(),
            "ends_with": self.ends_with,
            "extensions_used": self.extensions_used,
            "extensions_allowed": self.extensions_allowed,
            "extensions_left": self.extensions_left,
            "extension_seconds": self.extension_seconds,
            "can_extend": not self.why_not,
            "why_not": self.why_not,
            "words": self.words(),
        }

    def words(self) -> str:
        """ "Your server may hold the whole GPU until Nov 28 18:00 UTC (a GPU lease of 4 hours); you
        may extend it by 1 hour, 2 more times." """
        srv = f"Your server '{self.server}'" if self.server else "Your server"
        ends = "its kernels are shut down" if self.ends_with == "reclaim" else "it is stopped"
        out = f"{srv} may hold {thing(self.kind)} until {self.ends_at.astimezone(UTC):%b %d %H:%M} UTC; then {ends}."
        if self.extensions_allowed <= 0:
            return out
        if self.why_not:
            return f"{out} It cannot be extended now: {self.why_not}."
        times = "once more" if self.extensions_left == 1 else f"{self.extensions_left} more times"
        return f"{out} You may extend it by {duration_words(self.extension_seconds)}, {times}."


def used_up(allowed: int) -> str:
    """ "its one extension is used", "all 2 extensions of this lease are used"."""
    return "its one extension is used" if allowed == 1 else f"all {allowed} extensions of this lease are used"


def lease_status(server: ServerRecord, policy: Policy, now: datetime) -> LeaseStatus | None:
    """The lease of a running server (None: it has none)."""
    ends = policy.lease_ends_at(server)
    if ends is None or not server.ready:
        return None
    o = server.offering
    grant = policy.lease_grant(server)
    allowed = policy.lease_extensions_for(o)
    waiting, name = policy.waiting.get(o.slug or "", (0, o.slug or ""))
    if allowed <= 0:
        why_not = "this offering's lease cannot be extended"
    elif grant.extensions >= allowed:
        why_not = used_up(allowed)
    elif now >= ends:
        why_not = "the lease has ended"
    elif waiting > 0:
        why_not = f"{people_waiting(waiting)} waiting for {name}"
    else:
        why_not = ""
    return LeaseStatus(
        user=server.user,
        server=server.name,
        offering=o.slug,
        kind=o.kind,
        started=server.started,
        ends_at=ends,
        ends_with="reclaim" if policy.lease_reclaims_kernels(o) else "stop",
        extensions_used=grant.extensions,
        extensions_allowed=allowed,
        extension_seconds=max(0, int(policy.gpu_lease_extension)),
        why_not=why_not,
    )


class LeaseRefused(Exception):
    """An extension that is not granted: ``status`` is the HTTP status (404 no such lease,
    409 not now), the message says why in the user's words."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _key(entry: Mapping[str, Any]) -> tuple[str, str] | None:
    user, server = entry.get("user"), entry.get("server")
    if not isinstance(user, str) or not isinstance(server, str):
        return None
    return user, server


class LeaseBook:
    """Every running server's lease grant, read back from the action log at start and kept
    there as extensions and lease-ending reclaims happen."""

    def __init__(self, action_log: ActionLog | None) -> None:
        self.action_log = action_log
        self._grants: dict[tuple[str, str], LeaseGrant] = {}
        #: the last cycle's leases, per (user, server)
        self.status: dict[tuple[str, str], LeaseStatus] = {}
        if action_log is not None:
            self._read_back(reversed(action_log.entries(limit=action_log.max_entries)))

    def _read_back(self, entries: Iterable[Mapping[str, Any]]) -> None:
        """Oldest first: renewals (a lease that ended by reclaiming kernels) and extensions."""
        for entry in entries:
            key = _key(entry)
            started, when = parse_time(entry.get("started")), parse_time(entry.get("time"))
            if key is None or when is None:
                continue
            grant = self._grants.get(key)
            if grant is None or grant.started != started:
                grant = LeaseGrant(started)
            if entry.get("action") == EXTENDED and isinstance(entry.get("extensions"), int):
                self._grants[key] = LeaseGrant(started, int(entry["extensions"]), grant.renewed_at)
            elif entry.get("reason") == GPU_LEASE and entry.get("action") == "kernels_shut_down":
                self._grants[key] = LeaseGrant(started, 0, when)

    def grants(self) -> dict[tuple[str, str], LeaseGrant]:
        return dict(self._grants)

    def renewed(self, server: ServerRecord, now: datetime) -> None:
        """The lease ended by reclaiming the server's kernels: a new one begins now (the
        reclaim's own record in the action log says so after a restart)."""
        self._grants[(server.user, server.name)] = LeaseGrant(server.started, 0, now)

    def forget_all_but(self, running: Iterable[tuple[str, str]]) -> None:
        keep = set(running)
        for key in set(self._grants) - keep:
            del self._grants[key]
        for key in set(self.status) - keep:
            del self.status[key]

    def extend(self, user: str, server: str, policy: Policy, now: datetime) -> tuple[LeaseStatus, dict[str, Any]]:
        """Extend the lease of ``user``'s ``server`` by one extension; returns the lease as
        it is now and the action log's record. :class:`LeaseRefused` when it may not."""
        status = self.status.get((user, server))
        if status is None:
            what = f"server '{server}'" if server else "default server"
            raise LeaseRefused(404, f"{user}'s {what} has no GPU lease running (is it a GPU server, and started?)")
        if status.why_not:
            raise LeaseRefused(409, f"the GPU lease cannot be extended: {status.why_not}")
        if now >= status.ends_at:  # ended since the last cycle saw it: its end is under way
            raise LeaseRefused(409, "the GPU lease cannot be extended: the lease has ended")
        grant = self._grants.get((user, server))
        if grant is None or grant.started != status.started:
            grant = LeaseGrant(status.started)
        grant = LeaseGrant(status.started, grant.extensions + 1, grant.renewed_at)
        self._grants[(user, server)] = grant
        ends = status.ends_at + timedelta(seconds=status.extension_seconds)
        left = status.extensions_allowed - grant.extensions
        status = replace(
            status, ends_at=ends, extensions_used=grant.extensions, why_not=used_up(status.extensions_allowed) if left <= 0 else ""
        )
        self.status[(user, server)] = status
        srv = f"your server '{server}'" if server else "your server"
        record: dict[str, Any] = {
            "time": now.isoformat(),
            "user": user,
            "server": server,
            "action": EXTENDED,
            "reason": "extended",
            "kind": status.kind,
            "offering": status.offering,
            "started": status.started.isoformat() if status.started else None,
            "kernels": [],
            "extensions": grant.extensions,
            "what": f"The GPU lease of {srv} was extended",
            "why": f"by {duration_words(status.extension_seconds)}, until {ends.astimezone(UTC):%b %d %H:%M} UTC"
            + (f" ({left} more extension{'s' if left != 1 else ''} allowed)" if left > 0 else " (the last extension of this lease)"),
            "limit_seconds": int((ends - (status.started or now)).total_seconds()),
            "observed": {},
            "details": f"extension {grant.extensions} of {status.extensions_allowed}",
        }
        if self.action_log is not None:
            self.action_log.add(record)
        return status, record


def lease_reclaimed(action: str, stop_reason: str | None) -> bool:
    """Whether a decision was a lease ending by reclaiming kernels."""
    return action == RECLAIM and stop_reason == GPU_LEASE
