"""What the culler tells the notebook, checked; and what the notebook keeps of it. Pure.

The culler PUTs its view of this server (idle since, what it will reclaim and when, why)
each cycle; :func:`parse_culler_view` turns the body into a :class:`CullerView` or refuses
it with a :class:`ViewError` that names the wrong field and what is expected. A body is
what a pod-side HTTP client sent: it is checked field by field, never trusted. The
extension only shows this view; nothing the culler does depends on it.

:class:`NoticeBoard` is the in-memory state of one server: the latest view, replaced by
each PUT, and the kernels the culler reclaimed for idleness (kept apart, so the notebook
can say "reclaimed for idleness" after the kernel is gone).
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, NoReturn

#: Largest body the culler may PUT. Its view is a few hundred bytes; this leaves room for
#: ``observed`` and a long ``reclaimed`` list while refusing anything that is not a view.
MAX_BODY_BYTES = 64 * 1024
#: Reclaimed kernels kept for the notebook to explain (oldest dropped first).
MAX_RECLAIMED = 50
#: What the culler will reclaim next: idle kernels, or the whole server.
ACTIONS = ("kernels", "server")

_FIELDS: dict[str, str] = {
    "idle_since": "an ISO 8601 time with a timezone, or null",
    "action": "'kernels', 'server' or null",
    "act_at": "an ISO 8601 time with a timezone, or null",
    "reason": "a string",
    "warning": "true or false",
    "keepable": "true or false",
    "limit_seconds": "a whole number of seconds >= 0, or null",
    "observed": "a JSON object",
    "reclaimed": "a list of kernel ids (strings)",
    "cause": "a string (idle, waiting, gpu_lease, budget, ...)",
    "lease": "a JSON object (ends_at, extensions_left, can_extend, words) or null",
}
#: what a lease in the view holds, checked
_LEASE = {"ends_at": str, "extensions_left": int, "can_extend": bool, "words": str}


class ViewError(ValueError):
    """A refused body: ``status`` is the HTTP status to answer, the message says what to fix."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class CullerView:
    """The culler's view of this server, as it last PUT it (docs/user-gpu-view.md, "The API")."""

    posted_at: datetime
    idle_since: datetime | None = None
    action: str | None = None
    act_at: datetime | None = None
    reason: str = ""
    warning: bool = False
    #: False: the user's activity cannot prevent the action (only GPU use counts, or
    #: nothing does): no "Keep" is offered for it
    keepable: bool = True
    limit_seconds: int | None = None
    observed: dict[str, Any] = field(default_factory=dict)
    reclaimed: tuple[str, ...] = ()
    #: why the culler acts (its stop reason: "idle", "waiting", "gpu_lease", "budget", ...); "" for idleness
    cause: str = ""
    #: the server's GPU lease, where it has one: when it ends, extensions left, its words
    lease: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """The view as ``GET .../status`` shows it under ``"culler"``."""
        return {
            "idle_since": _iso(self.idle_since),
            "action": self.action,
            "act_at": _iso(self.act_at),
            "reason": self.reason,
            "warning": self.warning,
            "keepable": self.keepable,
            "limit_seconds": self.limit_seconds,
            "observed": self.observed,
            "reclaimed": list(self.reclaimed),
            "cause": self.cause,
            "lease": self.lease,
            "posted_at": _iso(self.posted_at),
        }


@dataclass(frozen=True)
class Reclaimed:
    """One kernel the culler said it shut down for idleness."""

    kernel_id: str
    at: datetime
    reason: str
    #: the culler's cause ("" or "idle": idleness; "gpu_lease": the lease ended)
    cause: str = ""


def parse_culler_view(body: bytes, now: datetime) -> CullerView:
    """The culler's PUT body -> a view, or :class:`ViewError` (400, or 413 when too large)."""
    if len(body) > MAX_BODY_BYTES:
        raise ViewError(413, f"the culler's view is {len(body)} bytes; at most {MAX_BODY_BYTES} are accepted")
    try:
        data = json.loads(body or b"null")
    except (ValueError, UnicodeDecodeError) as e:
        raise ViewError(400, f"the body is not JSON ({e}); send a JSON object (docs/user-gpu-view.md)") from None
    if not isinstance(data, dict):
        raise ViewError(400, f"the body must be a JSON object, not {type(data).__name__}; see docs/user-gpu-view.md")
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise ViewError(400, f"unknown field(s) {', '.join(map(repr, unknown))}; the fields are {', '.join(_FIELDS)}")
    action = data.get("action")
    if action is not None and action not in ACTIONS:
        _wrong("action", action)
    reason = data.get("reason", "")
    if not isinstance(reason, str):
        _wrong("reason", reason)
    warning = data.get("warning", False)
    if not isinstance(warning, bool):
        _wrong("warning", warning)
    keepable = data.get("keepable", True)
    if not isinstance(keepable, bool):
        _wrong("keepable", keepable)
    limit = data.get("limit_seconds")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        _wrong("limit_seconds", limit)
    observed = data.get("observed", {})
    if not isinstance(observed, dict):
        _wrong("observed", observed)
    reclaimed = data.get("reclaimed", [])
    if not isinstance(reclaimed, list) or not all(isinstance(k, str) and k for k in reclaimed):
        _wrong("reclaimed", reclaimed)
    cause = data.get("cause", "")
    if not isinstance(cause, str):
        _wrong("cause", cause)
    lease = data.get("lease")
    if lease is not None and not (
        isinstance(lease, dict)
        and set(lease) == set(_LEASE)
        and all(isinstance(lease[k], t) and not (t is int and isinstance(lease[k], bool)) for k, t in _LEASE.items())
    ):
        _wrong("lease", lease)
    return CullerView(
        posted_at=now,
        idle_since=_time(data, "idle_since"),
        action=action,
        act_at=_time(data, "act_at"),
        reason=reason,
        warning=warning,
        keepable=keepable,
        limit_seconds=limit,
        observed=observed,
        reclaimed=tuple(reclaimed),
        cause=cause,
        lease=dict(lease) if lease is not None else None,
    )


class NoticeBoard:
    """The latest culler view of this server and the kernels it reclaimed. In memory: a
    restarted server starts with none, as a fresh server has nothing to be warned about."""

    def __init__(self) -> None:
        self.view: CullerView | None = None
        self.reclaimed: deque[Reclaimed] = deque(maxlen=MAX_RECLAIMED)

    def post(self, view: CullerView) -> None:
        """Replace the view; remember the kernels it reclaims (once each)."""
        self.view = view
        known = {r.kernel_id for r in self.reclaimed}
        for kernel_id in view.reclaimed:
            if kernel_id not in known:
                self.reclaimed.append(Reclaimed(kernel_id, view.posted_at, view.reason, view.cause))
                known.add(kernel_id)

    def keep(self) -> None:
        """The user asked to keep their work: they are active now, and the warning and the
        planned action go, with its reason, until the culler's next view (which sees the
        activity too)."""
        if self.view is not None:
            if not self.view.keepable:
                return  # activity cannot prevent it (a GPU lease, a budget, gpu_idle_limit): the warning stays
            self.view = replace(self.view, idle_since=None, warning=False, act_at=None, action=None, reason="", cause="")

    def reclaimed_ids(self) -> frozenset[str]:
        return frozenset(r.kernel_id for r in self.reclaimed)


def _time(data: dict[str, Any], name: str) -> datetime | None:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        _wrong(name, value)
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        _wrong(name, value)
    if when.tzinfo is None:
        raise ViewError(400, f"{name}: {value!r} has no timezone; send {_FIELDS[name]}, e.g. '2026-05-04T12:00:00Z'")
    return when


def _wrong(name: str, value: Any) -> NoReturn:
    shown = json.dumps(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    raise ViewError(400, f"{name}: {shown} is not {_FIELDS[name]}")


def _iso(when: datetime | None) -> str | None:
    return None if when is None else when.isoformat().replace("+00:00", "Z")
