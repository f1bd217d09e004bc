"""Waiting on the scheduler and on each other: refusals, the scheduler's reason, the queue."""

from __future__ import annotations

import contextlib
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, AsyncIterator, Mapping

_PREEMPTION_TAIL = re.compile(r"\s*(no new claims to deallocate,\s*)?preemption:.*$", re.S)


class SpawnRefused(RuntimeError):
    """The spawn cannot go ahead; ``str()`` is the message for the user.

    JupyterHub shows a spawn failure's message on the spawn-pending page, and the
    hub's log keeps no traceback for it beyond one line.
    """

    jupyterhub_message = None

    def __init__(self, message: str):
        super().__init__(message)
        self.jupyterhub_message = message


def unschedulable_reason(pod: Mapping[str, Any]) -> str | None:
    """The scheduler's own words when it has marked ``pod`` Unschedulable, else None.

    "0/9 nodes are available: 1 Insufficient nvidia.com/mig-3g.20gb, 8 node(s) had
    untolerated taint(s)." (the preemption details that follow are dropped).
    """
    for cond in (pod.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
            message = _PREEMPTION_TAIL.sub("", cond.get("message") or "").strip()
            return message if message.endswith(".") else message + "."
    return None


@dataclass
class Place:
    queue: "WaitQueue"
    key: str

    @property
    def position(self) -> int:
        return list(self.queue.waiting).index(self.key) + 1

    @property
    def first(self) -> bool:
        return next(iter(self.queue.waiting)) == self.key


class WaitQueue:
    """First come, first served: spawns waiting for one offering, in arrival order."""

    _queues: dict[str, "WaitQueue"] = {}

    def __init__(self) -> None:
        self.waiting: OrderedDict[str, None] = OrderedDict()

    @classmethod
    def for_offering(cls, slug: str) -> "WaitQueue":
        return cls._queues.setdefault(slug, cls())

    @classmethod
    def length(cls, slug: str) -> int:
        queue = cls._queues.get(slug)
        return len(queue.waiting) if queue else 0

    @contextlib.asynccontextmanager
    async def place(self, key: str) -> AsyncIterator[Place]:
        self.waiting[key] = None
        try:
            yield Place(self, key)
        finally:
            self.waiting.pop(key, None)
