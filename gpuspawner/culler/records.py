"""What the culler decides on, as plain records: a server as the hub lists it, what its own
Jupyter Server says about its kernels, and the reasons a server is stopped. Pure.

The clients (:mod:`.hub`, :mod:`.kernels`) build these; the decision (:mod:`.decide`) and the
metrics read them, so neither depends on a client.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpuspawner.culler.contract import ServerOffering
from gpuspawner.names.vocabulary import StopReason

#: why a server is stopped (:class:`gpuspawner.names.vocabulary.StopReason`, spelled once there)
IDLE, MAX_AGE, GPU_IDLE_LIMIT = StopReason.IDLE, StopReason.MAX_AGE, StopReason.GPU_IDLE_LIMIT
UNRESPONSIVE, GPU_LEASE, WAITING, BUDGET = StopReason.UNRESPONSIVE, StopReason.GPU_LEASE, StopReason.WAITING, StopReason.BUDGET


@dataclass(frozen=True)
class ServerRecord:
    """One running (or pending) server, as listed by the hub."""

    user: str
    name: str
    admin: bool
    ready: bool
    pending: str | None
    started: datetime | None
    last_activity: datetime | None
    offering: ServerOffering
    #: the raw server model, for ``cull_arbiter_hook``
    model: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def label(self) -> str:
        return f"{self.user}/{self.name}" if self.name else self.user


@dataclass(frozen=True)
class KernelInfo:
    id: str
    name: str
    execution_state: str
    last_activity: datetime | None
    connections: int

    @property
    def busy(self) -> bool:
        """Running code now. Other states are judged by ``last_activity``: a
        kernel nobody ever connected to stays "starting" in jupyter_server, and a
        (re)starting one has a fresh ``last_activity``."""
        return self.execution_state == "busy"

    @property
    def reclaimable(self) -> bool:
        """Ran code and finished: the state in which idle GPU memory is held."""
        return self.execution_state == "idle"


@dataclass(frozen=True)
class KernelView:
    """What a server's own API says; ``ok`` False means it could not be asked."""

    ok: bool
    kernels: tuple[KernelInfo, ...] = ()
    #: ``/api/status`` last_activity: the server's own idea (kernels, API, terminals)
    server_last_activity: datetime | None = None
    error: str | None = None
    #: not asked this cycle for want of a token (the mint budget was spent)
    deferred: bool = False

    @property
    def busy_kernels(self) -> tuple[KernelInfo, ...]:
        return tuple(k for k in self.kernels if k.busy)
