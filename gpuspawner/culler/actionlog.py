"""The culler's action log: every server it stopped and every kernel it shut
down, kept in a JSON-lines file so that users can read why after the fact (the
hub's pages, the culler's ``api/actions``) and it survives a culler restart.

One JSON object a line (:func:`.notices.action_record`), appended as each action
is taken. Bounded: entries older than the retention and beyond the most recent
``max_entries`` are dropped; the file is rewritten (to a temporary file, then
renamed over it) when it holds twice the bound, so it never grows without end
and a crash mid-rewrite leaves the old file whole. A line that cannot be read
(a torn last line after a crash) is skipped with a warning, never fatal.
"""

from __future__ import annotations

import json
import logging
import os
from collections import deque
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from jupyterhub_idle_culler import utcnow

from gpuspawner.culler.dates import parse_time


class ActionLog:
    """The recent actions, in memory and in ``path`` (None: in memory only)."""

    def __init__(
        self,
        path: str | Path | None,
        *,
        max_entries: int = 10_000,
        retention: timedelta = timedelta(days=90),
        log: logging.Logger | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        if max_entries < 1:
            raise ValueError(f"action_log_max_entries={max_entries}: must be at least 1")
        self.path = Path(path) if path else None
        self.max_entries = max_entries
        self.retention = retention
        self.log = log or logging.getLogger(__name__)
        self.clock = clock
        self._entries: deque[dict[str, Any]] = deque(maxlen=max_entries)
        self._lines_in_file = 0
        self._load()

    def _fresh(self, entry: Mapping[str, Any], now: datetime) -> bool:
        when = parse_time(entry.get("time"))
        return when is not None and now - when <= self.retention

    def _load(self) -> None:
        if self.path is None or not self.path.exists():
            return
        now = self.clock()
        bad = 0
        with self.path.open(encoding="utf8", errors="replace") as f:
            for line in f:
                self._lines_in_file += 1
                try:
                    entry = json.loads(line)
                except ValueError:
                    bad += 1
                    continue
                if isinstance(entry, dict) and self._fresh(entry, now):
                    self._entries.append(entry)
        if bad:
            self.log.warning("action log %s: %d unreadable line(s) skipped", self.path, bad)
        self.log.info("action log %s: %d recent action(s) read back", self.path, len(self._entries))
        if self._lines_in_file > len(self._entries):
            self._rewrite()

    def _rewrite(self) -> None:
        assert self.path is not None
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("w", encoding="utf8") as f:
            for entry in self._entries:
                f.write(json.dumps(entry, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self._lines_in_file = len(self._entries)

    def add(self, entry: Mapping[str, Any]) -> None:
        """Keep one action (in memory always; on disk when it can be written)."""
        entry = dict(entry)
        self._entries.append(entry)
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf8") as f:
                f.write(json.dumps(entry, sort_keys=True) + "\n")
            self._lines_in_file += 1
            if self._lines_in_file >= 2 * self.max_entries:
                self._drop_old()
                self._rewrite()
        except OSError as e:  # the action happened all the same; say where it is not kept
            self.log.error("cannot write the action log %s (%s): this action is kept in memory only", self.path, e)

    def _drop_old(self) -> None:
        now = self.clock()
        while self._entries and not self._fresh(self._entries[0], now):
            self._entries.popleft()

    def entries(self, user: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Newest first; only ``user``'s when given."""
        self._drop_old()
        out = []
        for entry in reversed(self._entries):
            if user is not None and entry.get("user") != user:
                continue
            out.append(dict(entry))
            if len(out) >= limit:
                break
        return out

    def __len__(self) -> int:
        return len(self._entries)
