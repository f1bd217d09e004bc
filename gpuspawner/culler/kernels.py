"""Kernel view: each server's own Jupyter Server API, asked at its direct address.

Never through the proxy (a request through the proxy counts as activity), always
with ``?no_track_activity=1`` (so the culler's own polling is not activity to
jupyter_server either), with the service's token (scope ``access:servers``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote

from .dates import parse_time
from .transport import RequestFailed, Transport

NO_TRACK = "no_track_activity=1"


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

    @property
    def busy_kernels(self) -> tuple[KernelInfo, ...]:
        return tuple(k for k in self.kernels if k.busy)


@dataclass(frozen=True)
class KernelShutdown:
    kernel_id: str
    ok: bool
    error: str | None = None


def parse_kernels(body: Any) -> tuple[KernelInfo, ...]:
    """Parse ``GET /api/kernels``."""
    if not isinstance(body, list):
        raise ValueError(f"/api/kernels answered a {type(body).__name__}, not a list")
    out = []
    for k in body:
        if not isinstance(k, Mapping) or "id" not in k:
            continue
        out.append(
            KernelInfo(
                id=str(k["id"]),
                name=str(k.get("name", "")),
                execution_state=str(k.get("execution_state") or "unknown"),
                last_activity=parse_time(k.get("last_activity")),
                connections=int(k.get("connections") or 0),
            )
        )
    return tuple(out)


def parse_status(body: Any) -> datetime | None:
    """``last_activity`` out of ``GET /api/status``."""
    if not isinstance(body, Mapping):
        return None
    return parse_time(body.get("last_activity"))


class KernelClient:
    """Ask single-user servers about their kernels; shut kernels down."""

    def __init__(self, token: str, transport: Transport) -> None:
        self.transport = transport
        self.transport.headers["Authorization"] = f"token {token}"

    async def view(self, base_url: str, with_status: bool = True) -> KernelView:
        """``/api/kernels`` (and ``/api/status``) at once; never raises."""
        calls = [self.transport.fetch_json(f"{base_url}api/kernels?{NO_TRACK}")]
        if with_status:
            calls.append(self.transport.fetch_json(f"{base_url}api/status?{NO_TRACK}"))
        results = await asyncio.gather(*calls, return_exceptions=True)
        kernels_body = results[0]
        status_body = results[1] if with_status else None
        if isinstance(kernels_body, BaseException):
            return KernelView(ok=False, error=_describe(kernels_body))
        try:
            kernels = parse_kernels(kernels_body)
        except ValueError as e:
            return KernelView(ok=False, error=str(e))
        # /api/status only refines last activity: its failure does not hide kernels
        status = None
        if status_body is not None and not isinstance(status_body, BaseException):
            status = parse_status(status_body)
        return KernelView(ok=True, kernels=kernels, server_last_activity=status)

    async def shutdown(self, base_url: str, kernel_id: str) -> KernelShutdown:
        url = f"{base_url}api/kernels/{quote(kernel_id, safe='')}?{NO_TRACK}"
        try:
            await self.transport.fetch(url, "DELETE")
        except RequestFailed as e:
            if e.code == 404:  # already gone: the memory is free all the same
                return KernelShutdown(kernel_id, True, "already gone")
            return KernelShutdown(kernel_id, False, str(e))
        return KernelShutdown(kernel_id, True)


def _describe(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, RequestFailed) else f"{type(exc).__name__}: {exc}"


__all__ = [
    "KernelClient",
    "KernelInfo",
    "KernelShutdown",
    "KernelView",
    "parse_kernels",
    "parse_status",
]
