"""KubeSpawner's pod reflector, telling a waiting spawn the scheduler's verdict at once.

KubeSpawner keeps the pods of its namespace in a reflector (a list-and-watch); a spawn that
wants to know whether the scheduler has refused its pod would have to read that dict over
and over. This reflector tells the spawns that wait on a pod the moment its watch sees the
pod marked Unschedulable: event-driven, and nothing polls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from kubespawner.spawner import PodReflector
from traitlets import validate

from gpuspawner.hub.scheduling import unschedulable_reason


class _Told(dict):
    """The reflector's pods by ``namespace/name``; calls ``changed`` on every update."""

    def __init__(self, pods: dict[str, Any], changed: Callable[[str, Any], None]):
        super().__init__(pods)
        self._changed = changed
        for key, pod in pods.items():
            changed(key, pod)

    def __setitem__(self, key: str, pod: Any) -> None:
        super().__setitem__(key, pod)
        self._changed(key, pod)


class VerdictPodReflector(PodReflector):
    """A PodReflector whose updates resolve the futures of :meth:`unschedulable`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._waiters: dict[str, list[asyncio.Future[str]]] = {}
        super().__init__(*args, **kwargs)

    @validate("resources")
    def _tell_waiters(self, proposal: Any) -> dict[str, Any]:
        return _Told(proposal["value"], self._changed)

    def unschedulable(self, key: str) -> asyncio.Future[str]:
        """A future resolved with the scheduler's own words once pod ``key`` is marked
        Unschedulable (at once if it already is); cancel it when no longer needed."""
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(key, []).append(future)
        future.add_done_callback(lambda done: self._forget(key, done))
        pod = self.resources.get(key)
        if pod is not None:
            self._changed(key, pod)
        return future

    def _forget(self, key: str, future: asyncio.Future[str]) -> None:
        waiters = self._waiters.get(key, [])
        if future in waiters:
            waiters.remove(future)
        if not waiters:
            self._waiters.pop(key, None)

    def _changed(self, key: str, pod: Any) -> None:
        waiters = self._waiters.get(key)
        reason = unschedulable_reason(pod) if waiters else None
        for future in list(waiters or ()) if reason else ():
            if not future.done():
                future.set_result(reason)
