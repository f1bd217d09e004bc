"""Kernel view: each server's own Jupyter Server API, asked at its direct address.

Never through the proxy (a request through the proxy counts as activity), always
with ``?no_track_activity=1`` (so the culler's own polling is not activity to
jupyter_server either), and with that server's own token (owned by its user,
scope ``access:servers!server=<user>/<name>``: see :mod:`.tokens`) -- never the
culler's. Everything a server answers is the word of its user: it is read as a
claim, which GPU telemetry can outweigh (see ``gpu_idle_limit`` in :mod:`.decide`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol
from urllib.parse import quote

from gpuspawner.culler.dates import parse_time
from gpuspawner.culler.records import KernelInfo, KernelView, ServerRecord
from gpuspawner.culler.tokens import TokenDeferred, TokenUnavailable
from gpuspawner.culler.transport import RequestFailed, Transport

NO_TRACK = "no_track_activity=1"


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


class TokenSource(Protocol):
    """Where a server's own token comes from (:class:`.tokens.ServerTokens`)."""

    async def get(self, server: ServerRecord, budgeted: bool = False) -> str: ...

    async def refused(self, server: ServerRecord) -> None: ...

    def accepted(self, server: ServerRecord) -> None: ...


class KernelClient:
    """Ask single-user servers about their kernels; shut kernels down. Each
    request carries the token of the server it goes to, and no other."""

    def __init__(self, tokens: TokenSource, transport: Transport) -> None:
        self.tokens = tokens
        self.transport = transport
        if "Authorization" in transport.headers:
            raise ValueError("the server transport must carry no credential of its own")

    async def _headers(self, server: ServerRecord, budgeted: bool = False) -> dict[str, str]:
        return {"Authorization": f"token {await self.tokens.get(server, budgeted)}"}

    async def _refused(self, server: ServerRecord, exc: BaseException) -> None:
        if isinstance(exc, RequestFailed) and exc.code in (401, 403):
            await self.tokens.refused(server)

    async def view(self, server: ServerRecord, with_status: bool = True) -> KernelView:
        """``/api/kernels`` (and ``/api/status``) at once; never raises. A view
        without ``/api/status`` can only lead to a kernel shutdown: its token
        mint counts against the cycle's budget (and may be deferred)."""
        base_url = server.offering.url
        if not base_url:
            return KernelView(ok=False, error="no direct url")
        try:
            headers = await self._headers(server, budgeted=not with_status)
        except TokenDeferred as e:
            return KernelView(ok=False, error=str(e), deferred=True)
        except TokenUnavailable as e:
            return KernelView(ok=False, error=f"no per-server token: {e}")
        calls = [self.transport.fetch_json(f"{base_url}api/kernels?{NO_TRACK}", headers=headers)]
        if with_status:
            calls.append(self.transport.fetch_json(f"{base_url}api/status?{NO_TRACK}", headers=headers))
        # A pod that does not answer one request in time is not asked again in this cycle: its
        # retries (up to three timeouts, about 31 s) would hold the culler's connections and the
        # cycle, delaying every other server's decision and warning. It is judged this cycle from
        # the cluster and telemetry alone (a view that is not ok), and asked again next cycle.
        deadline = round(self.transport.retry.request_timeout * 1.1, 3)
        try:
            results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), deadline)
        except TimeoutError:
            return KernelView(ok=False, error=f"the server did not answer within {deadline:g} s")
        kernels_body = results[0]
        status_body = results[1] if with_status else None
        if isinstance(kernels_body, BaseException):
            await self._refused(server, kernels_body)
            return KernelView(ok=False, error=_describe(kernels_body))
        self.tokens.accepted(server)
        try:
            kernels = parse_kernels(kernels_body)
        except ValueError as e:
            return KernelView(ok=False, error=str(e))
        # /api/status only refines last activity: its failure does not hide kernels
        status = None
        if status_body is not None and not isinstance(status_body, BaseException):
            status = parse_status(status_body)
        return KernelView(ok=True, kernels=kernels, server_last_activity=status)

    async def shutdown(self, server: ServerRecord, kernel_id: str) -> KernelShutdown:
        url = f"{server.offering.url}api/kernels/{quote(kernel_id, safe='')}?{NO_TRACK}"
        try:
            headers = await self._headers(server)
        except TokenUnavailable as e:
            return KernelShutdown(kernel_id, False, f"no per-server token: {e}")
        try:
            await self.transport.fetch(url, "DELETE", headers=headers)
        except RequestFailed as e:
            if e.code == 404:  # already gone: the memory is free all the same
                return KernelShutdown(kernel_id, True, "already gone")
            await self._refused(server, e)
            return KernelShutdown(kernel_id, False, str(e))
        return KernelShutdown(kernel_id, True)


def _describe(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, RequestFailed) else f"{type(exc).__name__}: {exc}"


__all__ = [
    "KernelClient",
    "TokenSource",
    "KernelInfo",
    "KernelShutdown",
    "KernelView",
    "parse_kernels",
    "parse_status",
]
