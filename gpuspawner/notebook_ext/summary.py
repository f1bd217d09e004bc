"""The words the notebook shows: one status line, the panel's lines, the notices. Pure.

JupyterLab's status bar, its panel and the plain page for classic-notebook users all show
these strings, made here once from the status (offering, devices, the culler's view), so
the three never disagree. "GB" is the spawn page's: 2**30 bytes (``wording.memory_phrase``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from gpuspawner.names.vocabulary import StopReason
from gpuspawner.notebook_ext.view import CullerView, Reclaimed

GIB = 2**30
#: JupyterLab cuts a notification's message at 140 characters (``Notification`` in
#: @jupyterlab/apputils), so each notice also has a ``headline`` that fits: what happens
#: and what to do. The reason is in the full ``text``, which the panel shows.
HEADLINE_MAX = 140
#: How long the status line still says a kernel was reclaimed (the notification stays).
RECLAIM_SHOWN = timedelta(hours=1)
#: What the culler reclaims, as the status line says it happens.
_WILL = {"kernels": "kernels reclaimed", "server": "server stopped"}


def gb(n_bytes: int) -> str:
    """``3328599654`` -> "3.1"; whole figures of 10 and more without the decimal ("80")."""
    value = n_bytes / GIB
    return f"{value:.0f}" if value >= 10 and abs(value - round(value)) < 0.05 else f"{value:.1f}"


def duration(seconds: float) -> str:
    """``1440`` -> "24 min"; under a minute "<1 min"; "2 h 5 min" past an hour."""
    minutes = int(seconds // 60)
    if minutes < 1:
        return "<1 min"
    if minutes < 60:
        return f"{minutes} min"
    hours, rest = divmod(minutes, 60)
    return f"{hours} h {rest} min" if rest else f"{hours} h"


def memory_line(devices: Sequence[Mapping[str, Any]] | Mapping[str, Any]) -> str:
    """ "3.1 / 10 GB" over the devices the container sees; "GPU figures unavailable" without NVML."""
    if isinstance(devices, Mapping):
        return "GPU figures unavailable"
    if not devices:
        return "no GPU visible"
    used = sum(int(d["memory_used_bytes"]) for d in devices)
    total = sum(int(d["memory_total_bytes"]) for d in devices)
    return f"{gb(used)} / {gb(total)} GB"


def _coming(view: CullerView | None) -> tuple[str, datetime] | None:
    """``(action, act_at)`` of the action the view announces, if one is still to come (the
    notice the culler puts as it reclaims kernels names them: that one is done)."""
    if view is None or view.action not in _WILL or view.act_at is None:
        return None
    if view.action == "kernels" and view.reclaimed:
        return None
    return view.action, view.act_at


def culler_line(view: CullerView | None, now: datetime) -> str:
    """ "idle 24 min, kernels reclaimed in 6 min"; "active" when not idle; "" without a view."""
    if view is None:
        return ""
    idle = f"idle {duration((now - view.idle_since).total_seconds())}" if view.idle_since else "active"
    coming = _coming(view)
    if coming is None:
        return idle
    action, act_at = coming
    left = (act_at - now).total_seconds()
    when = f"in {duration(left)}" if left >= 60 else "within a minute"
    return f"{idle}, {_WILL[action]} {when}"


def reclaimed_line(reclaimed: Iterable[Reclaimed], now: datetime) -> str:
    """ "kernel reclaimed for idleness at 14:02 UTC" (or "2 kernels ..., the last at") for
    reclaims within :data:`RECLAIM_SHOWN`: the kernel's trace where the user looks."""
    recent = sorted((r.at for r in reclaimed if now - r.at <= RECLAIM_SHOWN), reverse=True)
    if not recent:
        return ""
    if len(recent) == 1:
        return f"kernel reclaimed for idleness at {recent[0]:%H:%M} UTC"
    return f"{len(recent)} kernels reclaimed for idleness, the last at {recent[0]:%H:%M} UTC"


def status_line(
    offering: Mapping[str, Any] | None, devices: Any, view: CullerView | None, now: datetime, reclaimed: Iterable[Reclaimed] = ()
) -> str:
    """The status bar's text: "MIG 1g.10gb · 3.1 / 10 GB · idle 24 min, kernels reclaimed in 6 min";
    with no action coming, a recent reclaim instead: "... · idle 2 min · kernel reclaimed for
    idleness at 14:02 UTC"."""
    name = str(offering.get("got") or offering["display_name"]) if offering else "No GPU offering"
    parts = [name]
    if not (offering is None and isinstance(devices, Mapping)):
        parts.append(memory_line(devices))
    parts.append(culler_line(view, now))
    if _coming(view) is None:
        parts.append(reclaimed_line(reclaimed, now))
    return " · ".join(p for p in parts if p)


#: causes whose kernels are shut down busy or not (not "for idleness")
_NOT_IDLE: dict[str, str] = {StopReason.GPU_LEASE: "at the end of its GPU lease"}


def notices(view: CullerView | None, reclaimed: Iterable[Reclaimed], now: datetime, extend_url: str = "") -> list[dict[str, Any]]:
    """The warning (while the culler says one is due) and the reclaimed kernels, newest first.
    A warning about a lease its user may still extend says so, with ``extend_url`` (the hub's
    page where they extend it)."""
    out: list[dict[str, Any]] = []
    if view is not None and view.warning and view.action in _WILL:
        idle = "" if view.cause in _NOT_IDLE else "idle "
        what = f"your {idle}kernels will be shut down" if view.action == "kernels" else "this server will be stopped"
        when = f" in {duration((view.act_at - now).total_seconds())}" if view.act_at and view.act_at > now else " soon"
        why = f": {view.reason}" if view.reason else ""
        extend = view.cause == StopReason.GPU_LEASE and bool(view.lease and view.lease.get("can_extend")) and bool(extend_url)
        # Keep (activity) cannot prevent a stop that only GPU use, or nothing, prevents
        if view.keepable:
            keep = "Click Keep or run a cell to keep them."
        elif extend:
            keep = "Save your work, or extend the lease on the hub."
        else:
            keep = "Save your work: Keep cannot prevent this."
        notice = {
            "kind": "warning",
            "text": f"To free the GPU, {what}{when}{why}. {keep}",
            "headline": f"To free the GPU, {what}{when}. {keep}",
            "at": _iso(view.posted_at),
            "kernel_ids": [],
            "keep": view.keepable,
        }
        if extend:
            notice["extend_url"] = extend_url
        out.append(notice)
    for r in sorted(reclaimed, key=lambda r: r.at, reverse=True):
        why = f": {r.reason}" if r.reason else ""
        what = f"Kernel {r.kernel_id[:8]} was {'shut down ' + _NOT_IDLE[r.cause] if r.cause in _NOT_IDLE else 'reclaimed for idleness'} at {r.at:%H:%M} UTC"
        out.append(
            {
                "kind": "reclaimed",
                "text": f"{what}{why}. It did not crash; start a new one to go on.",
                "headline": f"{what}. It did not crash; start a new one to go on.",
                "at": _iso(r.at),
                "kernel_ids": [r.kernel_id],
            }
        )
    return out


def _iso(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")
