"""Time windows: when an offering may be taken (``windows`` in docs/config.md). Pure.

A window is ``"Mon-Fri 20:00-07:00"`` in the site's time zone (``c.GPUSpawner.site_timezone``);
an offering with windows may be taken while any of them is open.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

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
    """ "" if the offering may be taken at ``now`` (tz-aware, in the site's zone), else why not."""
    parsed = [parse_window(w) for w in windows]
    if not parsed or any(w.open_at(now) for w in parsed):
        return ""
    zone = now.tzname() or ""
    return f"only available {' and '.join(w.text for w in parsed)}" + (f" ({zone})" if zone else "")
