"""Who may use what, and when. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable

from .offerings import Offering


@dataclass(frozen=True)
class Requester:
    """The user a decision is about."""

    name: str
    groups: frozenset[str] = frozenset()
    admin: bool = False


def named(items: Any) -> list[tuple[str, Any]]:
    """(name, item) for each of ``items`` that has a name: a hub's groups, or a group's users.

    JupyterHub gives lists of objects with a ``name``; authenticators and custom User
    objects have been seen to give names, a single name, None, or nothing at all. Every
    such shape works (a single string is one name); a value that cannot be iterated
    counts as none: a spawn must not fail on how groups are stored.
    """
    if items is None:
        return []
    if isinstance(items, str):
        return [(items, items)]
    try:
        items = list(items)
    except TypeError:
        return []
    out = []
    for item in items:
        name = item if isinstance(item, str) else getattr(item, "name", None)
        if isinstance(name, str) and name:
            out.append((name, item))
    return out


def may_use(offering: Offering, who: Requester) -> bool:
    """An offering restricted to groups and/or users is open to its members; admins may use all."""
    if who.admin or (not offering.groups and not offering.users):
        return True
    return who.name in offering.users or bool(who.groups & set(offering.groups))


def allowed(offerings: Iterable[Offering], who: Requester) -> dict[str, Offering]:
    """The offerings ``who`` may take, by slug, in order."""
    return {o.slug: o for o in offerings if may_use(o, who)}


# --------------------------------------------------------------------------- time windows

_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_WINDOW_RE = re.compile(r"^\s*(?P<days>[A-Za-z,\-*]+)\s+(?P<start>\d{2}:\d{2})-(?P<end>\d{2}:\d{2})\s*$")


@dataclass(frozen=True)
class Window:
    """Open on ``days`` from ``start`` to ``end`` (minutes after midnight); past midnight when end <= start."""

    text: str
    days: frozenset[int]
    start: int
    end: int

    def open_at(self, when: datetime) -> bool:
        minute = when.hour * 60 + when.minute
        today = when.weekday()
        if self.start < self.end:
            return today in self.days and self.start <= minute < self.end
        # An overnight window belongs to the day it starts on.
        return (today in self.days and minute >= self.start) or ((today - 1) % 7 in self.days and minute < self.end)


def parse_window(text: str) -> Window:
    """``"Mon-Fri 20:00-07:00"``, ``"Sat,Sun 00:00-24:00"``, ``"* 08:00-18:00"``; ValueError says what is wrong."""
    match = _WINDOW_RE.match(text) if isinstance(text, str) else None
    if not match:
        raise ValueError(f"time window {text!r} must look like 'Mon-Fri 20:00-07:00' or 'Sat,Sun 00:00-24:00'")
    days: set[int] = set()
    for part in match.group("days").split(","):
        if part in ("*", "daily"):
            days.update(range(7))
            continue
        ends = part.split("-")
        try:
            idx = [_DAYS.index(e.capitalize()[:3]) for e in ends if e]
        except ValueError:
            raise ValueError(f"time window {text!r}: days are Mon, Tue, Wed, Thu, Fri, Sat, Sun (ranges like Mon-Fri)") from None
        if len(idx) == 1:
            days.add(idx[0])
        else:
            day = idx[0]
            while True:
                days.add(day)
                if day == idx[1]:
                    break
                day = (day + 1) % 7
    minutes = []
    for stamp in (match.group("start"), match.group("end")):
        hours, mins = int(stamp[:2]), int(stamp[3:])
        if hours > 24 or mins > 59 or (hours == 24 and mins):
            raise ValueError(f"time window {text!r}: {stamp} is not a time of day")
        minutes.append(hours * 60 + mins)
    if minutes[0] == minutes[1]:
        raise ValueError(f"time window {text!r} is empty: start and end are the same")
    return Window(text=text.strip(), days=frozenset(days), start=minutes[0], end=minutes[1])


def window_state(windows: Iterable[str], now: datetime) -> str:
    """"" if the offering may be taken at ``now`` (tz-aware, in the site's zone), else why not."""
    parsed = [parse_window(w) for w in windows]
    if not parsed or any(w.open_at(now) for w in parsed):
        return ""
    zone = now.tzname() or ""
    return f"only available {' and '.join(w.text for w in parsed)}" + (f" ({zone})" if zone else "")
