"""Per-server tokens for the kernel view: the only credential the culler sends
into a notebook pod.

A user controls everything in their pod (the server process, its logs, its
answers), so whatever the culler sends there must be worth nothing beyond that
server. For each server whose kernels it needs to read, the culler asks the hub
for a token **owned by that server's user**, with the single scope
``access:servers!server=<user>/<name>`` and a short lifetime. The hub never lets
a token exceed its owner's own scopes, so a captured token gives its user
nothing they did not have; it is revoked as soon as the server is gone,
restarted or moved, or the culler stops, and expires on its own otherwise. The
culler's own token (``tokens`` scope and the rest of its role) stays on the hub
transport. See docs/culler.md, "Threat model".
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gpuspawner.culler.cullmetrics import CullerMetrics
from gpuspawner.culler.hubclient import HubClient
from gpuspawner.culler.records import ServerRecord
from gpuspawner.culler.transport import RequestFailed

#: the hub does not count API use of tokens whose note starts so as the user's
#: own activity (JupyterHub's handlers/base.py): the kernel view is not the user's
NOTE_PREFIX = "Server at "
_MAX_LIFETIME = re.compile(r"must not exceed (\d+)")


class TokenUnavailable(Exception):
    """No per-server token could be had; the message says why and what to do."""


class TokenRefused(TokenUnavailable):
    """The server refused its tokens (401/403) lately: no new one is minted for it until
    its backoff has passed (each mint and revocation is a write to the hub's database)."""


class TokenDeferred(TokenUnavailable):
    """This cycle's budget of token mints is spent; a later cycle mints it."""


def server_scope(user: str, name: str) -> str:
    """The one scope of a server's token: access to that server and no other."""
    return f"access:servers!server={user}/{name}"


def allowed_scopes(user: str, name: str) -> frozenset[str]:
    """What the hub may list for such a token: its scope, and the owner's name and
    groups, which the hub adds so that the server can tell who the token is."""
    return frozenset(
        {
            server_scope(user, name),
            f"read:users:name!user={user}",
            f"read:users:groups!user={user}",
        }
    )


@dataclass
class _Held:
    token_id: str
    token: str = field(repr=False)
    #: the server instance it was minted for: (started, direct url)
    instance: tuple[Any, Any] = (None, None)
    #: time.monotonic() after which it is renewed (before it expires)
    renew_at: float = 0.0
    #: time.monotonic() at which the hub lets it expire
    expires_at: float = 0.0


class ServerTokens:
    """Mints, caches, renews and revokes one token per running server.

    A token is bound to one server *instance* (its ``started`` time and direct
    URL): a restarted or moved server gets a new token and the old one is
    revoked first. Tokens are renewed once three quarters of their lifetime
    have passed, so a request never carries one about to expire; the old one
    then expires on its own within a quarter lifetime (one hub write saved).

    Each mint is a write to the hub's database (~30 ms of the hub's time on
    sqlite). A *budgeted* request (a kernel view that can only lead to a kernel
    shutdown) mints during the cycle only for the first ``mints_in_cycle`` servers
    (so a small hub sees every kernel in a culler's first cycle); the others are
    put on a list that :meth:`mint_wanted` works through after the cycle, one mint
    at a time, up to ``mints_per_cycle`` mints per cycle in all, and the next cycle
    reads them. So a cycle's decisions never wait on thousands of hub writes, and a
    restarted culler catches up over a few cycles without holding the hub busy;
    views that can lead to a stop are never deferred.
    """

    #: budgeted mints a cycle makes itself; the rest are made after it
    MINTS_IN_CYCLE = 10
    #: after a server refuses its token (401/403), no new one for it for this long,
    #: doubled at each refusal in a row, at most REFUSED_BACKOFF_MAX_S
    REFUSED_BACKOFF_S = 300.0
    REFUSED_BACKOFF_MAX_S = 6 * 3600.0

    def __init__(
        self,
        hub: HubClient,
        lifetime_s: int,
        log: logging.Logger,
        metrics: CullerMetrics | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        mints_per_cycle: int = 0,
    ) -> None:
        self.hub = hub
        self.lifetime_s = int(lifetime_s)
        self.mints_per_cycle = int(mints_per_cycle)
        self.mints_in_cycle = self.MINTS_IN_CYCLE if not mints_per_cycle else min(self.MINTS_IN_CYCLE, int(mints_per_cycle))
        self._cycle_mints = 0
        #: servers whose budgeted view wants a token: minted after the cycle (mint_wanted)
        self._wanted: dict[tuple[str, str], ServerRecord] = {}
        self.log = log
        self.metrics = metrics or CullerMetrics()
        self.monotonic = monotonic
        self._held: dict[tuple[str, str], _Held] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._logged: set[str] = set()
        #: the culler's own scopes, as the hub lists them (set at start-up): they say
        #: which group its ``tokens`` scope is filtered to
        self.scopes_held: tuple[str, ...] = ()
        #: (user, server) -> (instance, refusals in a row, monotonic time before which none is minted)
        self._refusals: dict[tuple[str, str], tuple[tuple[Any, Any], int, float]] = {}

    def __len__(self) -> int:
        return len(self._held)

    def _lock(self, key: tuple[str, str]) -> asyncio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    def new_cycle(self) -> None:
        """A culling cycle starts: its budget of mints is whole again."""
        self._cycle_mints = 0

    async def get(self, server: ServerRecord, budgeted: bool = False) -> str:
        """The server's token: cached while it is valid for this server instance,
        else minted now -- or, if ``budgeted`` and the cycle has made its
        ``mints_in_cycle``, after the cycle (:meth:`mint_wanted`; :class:`TokenDeferred`
        now). Raises :class:`TokenUnavailable`."""
        key = (server.user, server.name)
        instance = (server.started, server.offering.url)
        async with self._lock(key):
            held = self._held.get(key)
            now = self.monotonic()
            if held is not None and held.instance == instance:
                if now < held.renew_at:
                    return held.token
            elif held is not None:  # another instance of the server: never its token
                await self._revoke(key)
                held = None
            refusal = self._refusals.get(key)
            if refusal is not None and refusal[0] == instance and now < refusal[2]:
                raise TokenRefused(
                    f"the server refused its token {refusal[1]} time(s) in a row (401/403); no new token for"
                    f" {refusal[2] - now:.0f}s (backing off: each token is a write to the hub's database)"
                )
            if budgeted and self._cycle_mints >= self.mints_in_cycle:
                self._wanted[key] = server
                if held is not None and now < held.expires_at - 60:
                    return held.token  # due for renewal, still good: renewed after the cycle
                raise TokenDeferred("deferred to the next cycle: its token is minted after this one (token_mints_per_cycle)")
            self._wanted.pop(key, None)
            return await self._mint(server, key, instance)

    @property
    def wanted(self) -> int:
        """How many servers wait for a token to be minted after the cycle."""
        return len(self._wanted)

    async def mint_wanted(self) -> int:
        """Mint the tokens the cycle's budgeted views wanted, one at a time (one hub write
        in flight), up to ``mints_per_cycle`` mints in the cycle and after it (0: all);
        the rest wait for the next cycle. Returns how many were minted. Never raises for
        the hub's trouble: it is logged."""
        minted = 0
        while self._wanted and not (0 < self.mints_per_cycle <= self._cycle_mints):
            key = next(iter(self._wanted))
            server = self._wanted.pop(key)
            instance = (server.started, server.offering.url)
            async with self._lock(key):
                held = self._held.get(key)
                if held is not None and held.instance == instance and self.monotonic() < held.renew_at:
                    continue  # a view that can stop the server minted it meanwhile
                if held is not None and held.instance != instance:
                    await self._revoke(key)
                try:
                    await self._mint(server, key, instance)
                except TokenUnavailable as e:
                    self.log.warning("no kernel view of %s next cycle: %s", server.label, e)
                    continue
            minted += 1
        return minted

    async def refused(self, server: ServerRecord) -> None:
        """The server answered 401/403 to its token (revoked by its user, expired,
        or a pod that says so): drop it, and mint no new one for this server instance
        for REFUSED_BACKOFF_S, doubled at each refusal in a row (a pod that refuses
        every token would otherwise cost the hub two database writes per view)."""
        key = (server.user, server.name)
        instance = (server.started, server.offering.url)
        async with self._lock(key):
            held = self._held.get(key)
            if held is None or held.instance != instance:
                return  # refused already, or another instance's token: counted once
            prev = self._refusals.get(key)
            count = prev[1] + 1 if prev is not None and prev[0] == instance else 1
            backoff = min(self.REFUSED_BACKOFF_MAX_S, self.REFUSED_BACKOFF_S * 2 ** (count - 1))
            self._refusals[key] = (instance, count, self.monotonic() + backoff)
            self.log.warning(
                "server %s refused its own token (401/403, %d time(s) in a row): no kernel view of it for %.0fs",
                server.label,
                count,
                backoff,
            )
            await self._revoke(key)

    def accepted(self, server: ServerRecord) -> None:
        """The server took its token: its refusals are forgotten."""
        self._refusals.pop((server.user, server.name), None)

    async def revoke(self, server: ServerRecord) -> None:
        """The server is stopped (or being stopped): its token goes now."""
        key = (server.user, server.name)
        async with self._lock(key):
            await self._revoke(key)

    async def keep_only(self, running: Iterable[tuple[str, str]]) -> None:
        """Revoke the tokens of servers the hub no longer lists as running."""
        running = set(running)
        for key in set(self._refusals) - running:
            del self._refusals[key]
        gone = set(self._held) - running
        for key in set(self._wanted) - running:
            del self._wanted[key]
        await asyncio.gather(*(self._revoke(key) for key in gone))
        for key in set(self._locks) - set(self._held):
            lock = self._locks[key]
            if not lock.locked():
                del self._locks[key]

    async def close(self) -> None:
        """Revoke every token (the culler is stopping)."""
        self._wanted.clear()
        await asyncio.gather(*(self._revoke(key) for key in list(self._held)))

    # -- the hub ---------------------------------------------------------------
    async def _mint(self, server: ServerRecord, key: tuple[str, str], instance: tuple[Any, Any]) -> str:
        scope = server_scope(server.user, server.name)
        where = server.model.get("url") or f"/user/{server.user}/{server.name}"
        note = f"{NOTE_PREFIX}{where} (gpu-culler kernel view, revoked when it stops)"
        started = self.monotonic()
        lifetime = self.lifetime_s
        self._cycle_mints += 1
        try:
            minted = await self.hub.create_token(server.user, [scope], lifetime, note)
        except RequestFailed as e:
            found = _MAX_LIFETIME.search(str(e)) if e.code == 400 else None
            cap = int(found.group(1)) if found else 0
            if not 1 <= cap < lifetime:
                raise TokenUnavailable(self._explain(server, scope, e)) from e
            if self.lifetime_s > cap:  # said once, however many mints met the cap at once
                self.log.warning(
                    "the hub caps token lifetimes at %ss (c.JupyterHub.token_expires_in_max_"
                    "seconds); per-server tokens now last %ss instead of server_token_lifetime="
                    "%ss: set GpuCuller.server_token_lifetime at most that to silence this",
                    cap,
                    cap,
                    self.lifetime_s,
                )
                self.lifetime_s = cap
            started, lifetime = self.monotonic(), min(cap, self.lifetime_s)
            try:
                minted = await self.hub.create_token(server.user, [scope], lifetime, note)
            except RequestFailed as e2:
                raise TokenUnavailable(self._explain(server, scope, e2)) from e2
        beyond = set(minted.scopes) - allowed_scopes(server.user, server.name)
        if beyond:
            # never send a pod a token that can do more than its own server
            await self._delete(server.user, minted.id)
            raise TokenUnavailable(
                f"the hub minted a token for {server.label} with scopes {sorted(beyond)} beyond {scope!r}; not used, revoked"
            )
        self.metrics.server_tokens.labels("minted").inc()
        self._held[key] = _Held(minted.id, minted.token, instance, started + lifetime * 3 / 4, started + lifetime)
        return minted.token

    def _explain(self, server: ServerRecord, scope: str, e: RequestFailed) -> str:
        """Why no token could be had; role and user problems logged once each
        (not once per server and cycle)."""
        groups = sorted(s.partition("!group=")[2] for s in self.scopes_held if s.startswith("tokens!group="))
        if e.code == 403 and groups:
            # the hub's answer does not say which; the culler's own scopes do
            problem = why = (
                f"the hub refuses to create tokens for user {server.user!r} (403): user {server.user!r} is not in the"
                f" group {', '.join(map(repr, groups))} the culler's 'tokens' scope is filtered to (every user who may"
                " start a GPU server belongs there, never an admin: docs/culler.md, Scopes)"
            )
        elif e.code == 403:
            problem = (
                "the hub refuses to create tokens for users (403): the culler's role needs the 'tokens' scope, filtered"
                " to the group of GPU users (docs/culler.md, Scopes)"
            )
            why = f"{problem}; user {server.user!r}"
        elif e.code == 400 and "not held by" in str(e):
            problem = why = (
                f"user {server.user!r} does not hold {scope!r} (their roles do not let them"
                " use their own server), so no token for it can exist"
            )
        else:
            return f"minting a token for {server.label} failed: {e}"
        if problem not in self._logged:
            self._logged.add(problem)
            self.log.error("no kernel view: %s", problem)
        return why

    async def _revoke(self, key: tuple[str, str]) -> None:
        held = self._held.pop(key, None)
        if held is not None:
            await self._delete(key[0], held.token_id)

    async def _delete(self, user: str, token_id: str) -> None:
        try:
            await self.hub.delete_token(user, token_id)
        except RequestFailed as e:  # it expires on its own
            self.log.warning(
                "could not revoke per-server token %s of %s (it expires on its own): %s",
                token_id,
                user,
                e,
            )
            return
        self.metrics.server_tokens.labels("revoked").inc()
