"""Waiting on the scheduler and on each other: refusals (and their HTTP status), the scheduler's reason, the queue."""

from __future__ import annotations

import contextlib
import re
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from tornado.web import HTTPError

from gpuspawner.core import wording
from gpuspawner.names.vocabulary import Refusal

try:
    from jupyterhub.spawner import SpawnException  # JupyterHub >= 6
except ImportError:  # JupyterHub 5: an HTTPError gives the same answer (counted as an error)
    SpawnException = HTTPError

#: What the scheduler appends after its reasons: the post-filter plugins' words (Dynamic
#: Resource Allocation's "still not schedulable", "no new claims to deallocate", ...), each
#: followed by a comma, then the preemption details. Dropped: they are not the reason.
_PREEMPTION_TAIL = re.compile(r"\s*(?:[^.,:]+,\s*)*preemption:.*$", re.S)


#: Why a spawn was refused -> the HTTP status of the answer (the REST API's, and the form's).
#: An unknown offering and a forbidden one are both "not_offered" (403): a different
#: status for each would tell a user which offerings exist that they may not see.
#: Over quota or over the GPU-hour budget is 429, as JupyterHub answers its own per-hub server limit; nothing free
#: now is 409 (the request is fine, the cluster's state conflicts with it).
REFUSAL_STATUS: dict[str, int] = {
    Refusal.MALFORMED: 400,
    Refusal.NOT_OFFERED: 403,
    Refusal.WINDOW: 403,
    Refusal.NO_CAPACITY: 409,
    Refusal.QUEUE_TIMEOUT: 409,
    Refusal.UNSCHEDULABLE: 409,
    Refusal.IMAGE: 409,
    Refusal.POD_NAME_TAKEN: 409,
    Refusal.QUOTA: 429,
    Refusal.BUDGET: 429,
    Refusal.UNREACHABLE: 503,
    Refusal.START_TIMEOUT: 503,
    Refusal.MISCONFIGURED: 503,
}
#: Seconds a client is told to wait before trying again after a 503.
RETRY_AFTER_SECONDS = 30


class SpawnRefused(SpawnException):
    """The spawn cannot go ahead; ``str()`` is the message for the user.

    A JupyterHub :class:`~jupyterhub.spawner.SpawnException`, so the hub answers with
    the status of ``reason`` (:data:`REFUSAL_STATUS`) and this message as the REST
    API's JSON ``message``, the form's error and the spawn-pending page's, logs one
    line without a traceback, and counts a refusal, not a hub error (a hub error
    counts towards ``consecutive_failure_limit``).
    """

    #: Nothing more for tornado to log: the hub already logged ``str(self)``.
    log_message = ""

    def __init__(self, message: str, reason: str = Refusal.NO_CAPACITY):
        status = REFUSAL_STATUS.get(reason, 409)
        HTTPError.__init__(self, status, None, reason=reason)
        self.status_code = status
        self.message = self.jupyterhub_message = message
        self.message_html = ""
        if status == 503:
            self.headers = {"Retry-After": str(RETRY_AFTER_SECONDS)}

    def __str__(self) -> str:
        return self.message


class ProfileRefused(SpawnRefused, ValueError):
    """KubeSpawner's profile checks refused the user's profile or profile option (400).

    Also a ``ValueError``, the type KubeSpawner raises for it, so code written for
    KubeSpawner (``except ValueError``) keeps working; JupyterHub answers it as the
    refusal it is, where KubeSpawner's plain ``ValueError`` gets a 500.
    """

    def __init__(self, message: str):
        super().__init__(message, Refusal.MALFORMED)


def unschedulable_reason(pod: Mapping[str, Any]) -> str | None:
    """The scheduler's own words when it has marked ``pod`` Unschedulable, else None.

    "0/9 nodes are available: 1 Insufficient nvidia.com/mig-3g.20gb, 8 node(s) had
    untolerated taint(s)." or, for a Dynamic Resource Allocation claim, "0/14 nodes are
    available: 10 node(s) had untolerated taint(s), 4 cannot allocate all claims." (what the
    post-filter plugins and preemption add after the reasons is dropped).
    """
    for cond in (pod.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
            message = _PREEMPTION_TAIL.sub("", cond.get("message") or "").strip()
            return message if message.endswith(".") else message + "."
    return None


@dataclass
class Place:
    queue: WaitQueue
    key: str

    @property
    def position(self) -> int:
        return list(self.queue.waiting).index(self.key) + 1

    @property
    def first(self) -> bool:
        return next(iter(self.queue.waiting)) == self.key


class WaitQueue:
    """First come, first served: spawns waiting for one offering, in arrival order."""

    _queues: dict[str, WaitQueue] = {}

    def __init__(self) -> None:
        self.waiting: OrderedDict[str, None] = OrderedDict()

    @classmethod
    def for_offering(cls, slug: str) -> WaitQueue:
        return cls._queues.setdefault(slug, cls())

    @classmethod
    def length(cls, slug: str) -> int:
        queue = cls._queues.get(slug)
        return len(queue.waiting) if queue else 0

    @classmethod
    def lengths(cls) -> tuple[tuple[str, int], ...]:
        """Every offering's queue that has someone waiting, with how many (what the page's badges read)."""
        return tuple((slug, len(queue.waiting)) for slug, queue in cls._queues.items() if queue.waiting)

    @contextlib.asynccontextmanager
    async def place(self, key: str) -> AsyncIterator[Place]:
        self.waiting[key] = None
        try:
            yield Place(self, key)
        finally:
            self.waiting.pop(key, None)


def refusal(reason: str, decision: Any) -> SpawnRefused:
    """A refused window, quota or capacity decision (an admission ``Decision``), with what the
    user can do about it."""
    advice: dict[str, str] = {
        Refusal.WINDOW: wording.PICK_ANOTHER,
        Refusal.NO_CAPACITY: wording.TAKEN_PICK_AGAIN,
    }
    if getattr(decision, "queue", ""):  # Kueue's quota refused it, not a race for the last unit
        advice[Refusal.NO_CAPACITY] = wording.QUEUE_FULL_ADVICE
    return SpawnRefused(decision.message + advice.get(reason, ""), reason)


#: The start of KubeSpawner's message when a Kubernetes call kept timing out until
#: ``k8s_api_request_retry_timeout`` (JupyterHub's ``exponential_backoff`` raises it as a
#: TimeoutError: "Could not create pod <namespace>/<name>", "... PVC ...", "... service ...").
_KUBESPAWNER_GAVE_UP = "Could not create "


def chain(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc``, then what caused it (``__cause__``, else ``__context__``), and so on, each once."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def unreachable_cause(exc: BaseException | None) -> BaseException | None:
    """The exception in ``exc``'s chain that says the API server could not be reached: a
    connection refused, reset or timed out (aiohttp's, the OS's), or KubeSpawner giving up on
    a call that kept timing out. None for anything else (an answer with an HTTP error is an
    answer; a pod that does not start in ``start_timeout`` is not the API server's fault)."""
    for cause in chain(exc):
        if isinstance(cause, (aiohttp.ClientConnectionError, ConnectionError)):
            return cause
        if isinstance(cause, TimeoutError) and str(cause).startswith(_KUBESPAWNER_GAVE_UP):
            return cause
    return None


def brief(exc: BaseException) -> str:
    """One line about a failed Kubernetes call, for the hub log."""
    text = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
    return str(text).splitlines()[0][:200]
