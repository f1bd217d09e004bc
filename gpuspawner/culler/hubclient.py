"""The hub's REST API: paged user/server listing, stopping servers, deleting users,
and the per-server tokens of the kernel view (see :mod:`.tokens`).

Follows jupyterhub-idle-culler 2.0 request for request (same endpoints, the
``state`` filter, the pagination media type, ``{"remove": true}`` for named
servers, 202 = slow to stop), so that it costs the hub no more calls than it.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

from tornado.httputil import url_concat

from gpuspawner.culler.contract import parse_offering
from gpuspawner.culler.dates import parse_time
from gpuspawner.culler.records import ServerRecord
from gpuspawner.culler.transport import RequestFailed, Transport

PAGINATION_MEDIA_TYPE = "application/jupyterhub-pagination+json"


def server_record(user: Mapping[str, Any], name: str, server: Mapping[str, Any]) -> ServerRecord:
    """Build a :class:`ServerRecord` from a hub user model and one of its servers."""
    return ServerRecord(
        user=user["name"],
        name=name,
        admin=bool(user.get("admin")),
        ready=bool(server.get("ready", bool(server.get("url")))),
        pending=server.get("pending"),
        started=parse_time(server.get("started")),
        last_activity=parse_time(server.get("last_activity")),
        offering=parse_offering(server.get("user_options")),
        model=server,
    )


def _pages_ahead(pagination: Mapping[str, Any], asked: set[int], room: int) -> list[str]:
    """The queries of the pages to ask for now (at most ``room``, none asked before): the
    hub's ``next``, and the one after it when the hub's ``total`` says there is one."""
    nxt = pagination.get("next") or {}
    if not isinstance(nxt, Mapping) or not nxt.get("url"):
        return []
    query = urlsplit(str(nxt["url"])).query
    fields = dict(parse_qsl(query, keep_blank_values=True))
    try:
        offset, limit = int(fields["offset"]), int(fields.get("limit") or pagination["limit"])
    except (KeyError, TypeError, ValueError):  # a next page that does not say where: follow it alone
        return [query]
    total = pagination.get("total")
    offsets = [offset]
    if limit > 0 and isinstance(total, int) and offset + limit < total:
        offsets.append(offset + limit)
    out: list[str] = []
    for page in offsets:
        if len(out) >= room or page in asked:
            continue
        asked.add(page)
        out.append(query if page == offset else urlencode({**fields, "offset": str(page), "limit": str(limit)}))
    return out


@dataclass(frozen=True)
class MintedToken:
    """A token the hub created for a user (``POST /users/{name}/tokens``)."""

    id: str
    token: str = field(repr=False)
    scopes: tuple[str, ...] = ()


class HubClient:
    """JupyterHub REST API, as the culler service uses it. The service's own token
    is set on this client's transport only: it goes to the hub API URL and
    nowhere else."""

    def __init__(self, api_url: str, token: str, transport: Transport, page_size: int = 0):
        self.api_url = api_url.rstrip("/")
        self.transport = transport
        self.transport.headers["Authorization"] = f"token {token}"
        self.page_size = page_size

    async def info(self) -> dict[str, Any]:
        info: dict[str, Any] = await self.transport.fetch_json(f"{self.api_url}/")
        return info

    async def whoami(self) -> dict[str, Any]:
        """The culler's own model, with the scopes its token holds (``GET /user``)."""
        model: dict[str, Any] = await self.transport.fetch_json(f"{self.api_url}/user")
        return model

    async def iter_users(self, state: str | None = "ready") -> AsyncIterator[dict[str, Any]]:
        """Yield user models, page by page, with the same requests as jupyterhub-idle-culler
        (the ``state`` filter, the pagination media type, the hub's ``next`` page).

        Two pages are asked ahead when the hub says how many there are (``total``): the one
        after the next is asked for as soon as a page arrives, so the hub computes it while
        the culler handles the servers of this one. (Upstream lists every page before it
        handles any user; handling them as they come put that work between a page and the
        request for the next -- at 3,000 servers a second per cycle.)"""
        params = {}
        if state:
            params["state"] = state
        if self.page_size:
            params["limit"] = str(self.page_size)
        headers = {"Accept": PAGINATION_MEDIA_TYPE}

        def ask(url: str) -> asyncio.Future[Any]:
            return asyncio.ensure_future(self.transport.fetch_json(url, headers=headers))

        pending: deque[asyncio.Future[Any]] = deque([ask(url_concat(f"{self.api_url}/users", params))])
        asked: set[int] = {0}
        try:
            while pending:
                model = await pending.popleft()
                if isinstance(model, list):  # hub without pagination
                    items = model
                else:
                    items = model.get("items", [])
                    # the hub builds the next URL from the Host header it saw; keep only its
                    # query, on our own API URL (right behind any proxy)
                    for query in _pages_ahead(model.get("_pagination") or {}, asked, room=2 - len(pending)):
                        pending.append(ask(f"{self.api_url}/users?{query}"))
                for item in items:
                    yield item
        finally:
            for task in pending:  # an early exit (a failed page, a closed generator)
                task.cancel()

    async def stop_server(self, user: str, server_name: str, remove: bool = False) -> str:
        """Stop one server. Returns ``"stopped"``, ``"stopping"`` (202: slow to
        stop) or ``"gone"`` (404: already stopped or removed)."""
        body = None
        if server_name:
            url = f"{self.api_url}/users/{quote(user, safe='')}/servers/{quote(server_name, safe='')}"
            if remove:
                body = json.dumps({"remove": True})
        else:
            url = f"{self.api_url}/users/{quote(user, safe='')}/server"
        try:
            resp = await self.transport.fetch(url, "DELETE", body=body)
        except RequestFailed as e:
            if e.code == 404:
                return "gone"
            raise
        return "stopping" if resp.code == 202 else "stopped"

    async def create_token(self, user: str, scopes: list[str], expires_in: int, note: str) -> MintedToken:
        """A new token owned by ``user`` with exactly ``scopes`` (the hub refuses
        scopes the user does not hold: 400), for ``expires_in`` seconds."""
        body = json.dumps({"scopes": scopes, "expires_in": expires_in, "note": note})
        model = await self.transport.fetch_json(f"{self.api_url}/users/{quote(user, safe='')}/tokens", "POST", body=body)
        if not isinstance(model, Mapping) or not model.get("token") or not model.get("id"):
            raise RequestFailed("hub", "POST", f"{self.api_url}/users/{user}/tokens", 200, "no token in the answer")
        return MintedToken(str(model["id"]), str(model["token"]), tuple(map(str, model.get("scopes") or ())))

    async def delete_token(self, user: str, token_id: str) -> None:
        """Revoke one of ``user``'s tokens; one already gone (404) is fine."""
        url = f"{self.api_url}/users/{quote(user, safe='')}/tokens/{quote(token_id, safe='')}"
        try:
            await self.transport.fetch(url, "DELETE")
        except RequestFailed as e:
            if e.code != 404:
                raise

    async def delete_user(self, user: str) -> None:
        await self.transport.fetch(f"{self.api_url}/users/{quote(user, safe='')}", "DELETE")
