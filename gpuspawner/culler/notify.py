"""Notices to the notebook: the culler's view of a server, put to gpuspawner's
Jupyter Server extension (``PUT {base_url}api/gpuspawner/culler``) so that the
user sees what will be reclaimed and when, and what was.

Like the kernel view (:mod:`.kernels`): at the server's own address, never
through the proxy, with ``?no_track_activity=1`` (a notice is not the user's
activity) and with that server's own token -- never the culler's. A server
without the extension answers 404: the culler then leaves that server instance
alone (a restarted server is asked again) and behaves exactly as without
notices. Notices are best effort: one try, and a failure never delays or
changes an action.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from gpuspawner.culler.kernels import NO_TRACK, TokenSource
from gpuspawner.culler.records import ServerRecord
from gpuspawner.culler.tokens import TokenUnavailable
from gpuspawner.culler.transport import RequestFailed, Transport

#: the extension's endpoint, under the server's base URL
NOTICE_PATH = "api/gpuspawner/culler"

_Instance = tuple[Any, Any]
_Key = tuple[str, str]
#: what makes a notice news: figures that move every cycle (idle for N minutes,
#: sample counts) do not, so a server is not sent the same warning each cycle
_NEWS = ("action", "act_at", "idle_since", "warning", "reclaimed")


def _signature(body: Mapping[str, Any]) -> str:
    return json.dumps({k: body.get(k) for k in _NEWS}, sort_keys=True)


class Notifier:
    """Puts notices to servers, each only when it differs from the last one that
    server instance got, and never again to an instance that answered 404."""

    def __init__(self, tokens: TokenSource, transport: Transport, log: logging.Logger) -> None:
        if "Authorization" in transport.headers:
            raise ValueError("the server transport must carry no credential of its own")
        self.tokens = tokens
        self.transport = transport
        self.log = log
        #: (user, name) -> (instance, signature of the last body sent)
        self._sent: dict[_Key, tuple[_Instance, str]] = {}
        #: (user, name) -> instance that has no extension (404)
        self._absent: dict[_Key, _Instance] = {}

    @staticmethod
    def _instance(server: ServerRecord) -> _Instance:
        return (server.started, server.offering.url)

    def supported(self, server: ServerRecord) -> bool:
        """False once this server instance answered that it has no extension."""
        return self._absent.get((server.user, server.name)) != self._instance(server)

    def pending(self, server: ServerRecord, body: Mapping[str, Any]) -> bool:
        """Whether ``body`` is news for this server instance."""
        if not server.offering.url or not self.supported(server):
            return False
        last = self._sent.get((server.user, server.name))
        if last is None or last[0] != self._instance(server):
            # nothing to clear on a server never told; a lease its user may extend is news
            return bool(body.get("action") or body.get("lease"))
        return last[1] != _signature(body)

    async def put(self, server: ServerRecord, body: Mapping[str, Any], *, force: bool = False) -> bool:
        """Put ``body`` if it is news (or ``force``); True when the server took it."""
        if not force and not self.pending(server, body):
            return False
        if not server.offering.url or not self.supported(server):
            return False
        key = (server.user, server.name)
        text = json.dumps(body, sort_keys=True)
        try:
            token = await self.tokens.get(server)
        except TokenUnavailable as e:
            self.log.debug("no notice to %s: no per-server token (%s)", server.label, e)
            return False
        try:
            await self.transport.fetch(
                f"{server.offering.url}{NOTICE_PATH}?{NO_TRACK}",
                "PUT",
                body=text,
                headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
                attempts=1,
            )
        except RequestFailed as e:
            if e.code == 404:
                self._absent[key] = self._instance(server)
                self._sent.pop(key, None)
                self.log.info(
                    "server %s has no gpuspawner notebook extension (404 from %s): no notices to it until it restarts",
                    server.label,
                    NOTICE_PATH,
                )
            else:
                if e.code in (401, 403):
                    await self.tokens.refused(server)
                self.log.info("notice to %s not delivered: %s", server.label, e)
            return False
        self._sent[key] = (self._instance(server), _signature(body))
        return True

    def keep_only(self, keys: Iterable[_Key]) -> None:
        """Forget servers the hub no longer lists."""
        keep = set(keys)
        for d in (self._sent, self._absent):
            for key in set(d) - keep:
                del d[key]
