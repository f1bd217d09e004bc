"""Per-server tokens: minted once per server instance, renewed before they
expire, revoked when the server goes, and refused when the hub would make them
broader than one server. Against a scripted hub speaking the token API's shape
(the real hub: test_culler_trust.py)."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import UTC, datetime

import pytest
import pytest_asyncio
from tornado import web
from tornado.httpserver import HTTPServer

from gpuspawner.culler.contract import parse_offering
from gpuspawner.culler.cullmetrics import CullerMetrics
from gpuspawner.culler.hubclient import HubClient
from gpuspawner.culler.records import ServerRecord
from gpuspawner.culler.tokens import ServerTokens, TokenDeferred, TokenRefused, TokenUnavailable, server_scope
from gpuspawner.culler.transport import RetryPolicy, Transport
from gpuspawner.devcluster.ports import free_port

pytestmark = pytest.mark.asyncio(loop_scope="session")
FAST = RetryPolicy(attempts=2, base_delay=0.01, max_delay=0.02, request_timeout=2)
T0 = datetime(2026, 5, 4, 10, 0, tzinfo=UTC)


class TokenHub:
    """``POST /users/{u}/tokens`` and ``DELETE /users/{u}/tokens/{id}`` as JupyterHub
    answers them; ``max_expires`` mimics token_expires_in_max_seconds, ``refuse`` a
    role without ``tokens`` (403), ``extra_scope`` a hub that widens tokens."""

    def __init__(self):
        self.posts: list[tuple[str, dict]] = []
        self.deletes: list[tuple[str, str]] = []
        self.max_expires = 0
        self.refuse = False
        self.extra_scope = None
        self.n = 0


class TokensHandler(web.RequestHandler):
    SUPPORTED_METHODS = ("POST", "DELETE")

    def initialize(self, hub):
        self.hub = hub

    async def post(self, user, _id=None):
        h = self.hub
        body = json.loads(self.request.body)
        h.posts.append((user, body))
        await asyncio.sleep(0.01)  # let concurrent callers overlap
        if h.refuse:
            self.set_status(403)
            self.finish({"status": 403, "message": "Service x not found or no permissions"})
            return
        if h.max_expires and body["expires_in"] > h.max_expires:
            self.set_status(400)
            self.finish(
                {
                    "status": 400,
                    "message": f"token expires_in: {body['expires_in']} must not exceed {h.max_expires}",
                }
            )
            return
        h.n += 1
        scopes = body["scopes"] + ([h.extra_scope] if h.extra_scope else [])
        self.set_status(201)
        self.finish({"id": f"a{h.n}", "token": f"secret{h.n}", "scopes": scopes, "user": user})

    async def delete(self, user, token_id):
        self.hub.deletes.append((user, token_id))
        self.set_status(204)


@pytest_asyncio.fixture(loop_scope="session")
async def hub():
    h = TokenHub()
    port = free_port()
    server = HTTPServer(web.Application([(r"/hub/api/users/([^/]+)/tokens(?:/([^/]+))?", TokensHandler, {"hub": h})]))
    server.listen(port, "127.0.0.1")
    h.url = f"http://127.0.0.1:{port}/hub/api"
    yield h
    server.stop()


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def record(user="alice", name="", started=T0, url="http://10.0.0.5:8888/user/alice/"):
    offering = parse_offering({"gpuspawner": {"kind": "full", "url": url}})
    return ServerRecord(user, name, False, True, None, started, None, offering, {"url": "/x/"})


def tokens(hub, lifetime=3600, log=None, budget=0):
    log = log or logging.getLogger("test.tokens")
    t = Transport("hub", concurrency=4, retry=FAST, metrics=CullerMetrics(), log=log)
    clock = Clock()
    client = HubClient(hub.url, "culler-secret", t)
    st = ServerTokens(client, lifetime, log, monotonic=clock, mints_per_cycle=budget)
    return st, clock


async def test_one_token_per_server_instance_with_one_scope_renewed_and_revoked(hub):
    st, clock = tokens(hub)
    alice = record()
    assert await st.get(alice) == "secret1"
    assert await st.get(alice) == "secret1"  # cached
    user, body = hub.posts[0]
    assert user == "alice" and body["scopes"] == ["access:servers!server=alice/"]
    assert body["expires_in"] == 3600 and body["note"].startswith("Server at ")
    # renewed once three quarters of its lifetime have passed (the old one expires
    # on its own within the last quarter)
    clock.t += 2699
    assert await st.get(alice) == "secret1"
    clock.t += 2
    assert await st.get(alice) == "secret2" and hub.deletes == []
    # the server restarted (new started time) or moved (new address): a new token,
    # the old instance's revoked first
    assert await st.get(record(started=T0.replace(hour=11))) == "secret3"
    assert await st.get(record(started=T0.replace(hour=11), url="http://10.0.0.9:8888/u/")) == ("secret4")
    assert hub.deletes == [("alice", "a2"), ("alice", "a3")]
    # a named server has its own token and scope
    assert await st.get(record(name="train")) == "secret5"
    assert hub.posts[-1][1]["scopes"] == [server_scope("alice", "train")]
    # servers the hub no longer lists: revoked; then everything at close
    await st.keep_only({("alice", "train")})
    assert hub.deletes[-1] == ("alice", "a4") and len(st) == 1
    await st.close()
    assert hub.deletes[-1] == ("alice", "a5") and len(st) == 0


async def test_concurrent_requests_for_one_server_mint_once(hub):
    st, _ = tokens(hub)
    got = await asyncio.gather(*(st.get(record(user="bob")) for _ in range(5)))
    assert len(set(got)) == 1 and len(hub.posts) == 1


async def test_a_refused_token_is_revoked_and_replaced_after_a_growing_backoff(hub):
    st, clock = tokens(hub)
    first = await st.get(record())
    await st.refused(record())
    assert hub.deletes == [("alice", "a1")]
    # a pod that refuses every token would cost the hub two writes per view: none until the backoff passes
    for _ in range(3):
        with pytest.raises(TokenRefused, match="refused its token 1 time"):
            await st.get(record())
    assert len(hub.posts) == 1
    clock.t += st.REFUSED_BACKOFF_S
    second = await st.get(record())
    assert second != first and len(hub.posts) == 2
    await st.refused(record())
    await st.refused(record())  # the same refusal seen twice (kernels and status): counted once
    clock.t += st.REFUSED_BACKOFF_S
    with pytest.raises(TokenRefused, match="2 time"):  # twice as long now
        await st.get(record())
    clock.t += st.REFUSED_BACKOFF_S
    third = await st.get(record())
    st.accepted(record())  # taken: the refusals are forgotten
    await st.refused(record())
    with pytest.raises(TokenRefused, match="refused its token 1 time"):
        await st.get(record())
    assert third not in (first, second) and len(hub.posts) == 3


async def test_the_hub_s_lifetime_cap_is_used_and_said_once(hub, caplog):
    hub.max_expires = 600
    st, _ = tokens(hub)
    with caplog.at_level(logging.WARNING):
        # several mints meet the cap at once: each retries within it
        got = await asyncio.gather(*(st.get(record(user=u)) for u in ("alice", "carol")))
        assert len(set(got)) == 2
        assert await st.get(record(user="bob"))
    lifetimes = [b["expires_in"] for _, b in hub.posts]
    assert lifetimes.count(3600) == 2 and lifetimes.count(600) == 3 and lifetimes[-1] == 600
    warnings = [r.getMessage() for r in caplog.records if "caps token lifetimes" in r.getMessage()]
    assert len(warnings) == 1 and "600" in warnings[0] and "server_token_lifetime" in warnings[0]


async def test_without_the_tokens_scope_the_error_says_so_once(hub, caplog):
    hub.refuse = True
    st, _ = tokens(hub)
    with caplog.at_level(logging.ERROR):
        for user in ("alice", "bob"):
            with pytest.raises(TokenUnavailable, match=f"'tokens' scope.*{user}"):
                await st.get(record(user=user))
    assert sum("'tokens' scope" in r.getMessage() for r in caplog.records) == 1


async def test_a_token_wider_than_its_server_is_never_used(hub):
    hub.extra_scope = "read:users:name!user=alice"  # what the hub adds: fine
    st, _ = tokens(hub)
    assert await st.get(record()) == "secret1"
    for wider in ("access:servers", "read:users:name!user=bob", "access:servers!user=alice"):
        hub.extra_scope = wider
        with pytest.raises(TokenUnavailable, match="beyond"):
            await st.get(record(user="carol"))
        assert hub.deletes[-1][0] == "carol"
    assert len(st) == 1


async def test_mints_for_kernel_shutdowns_only_are_made_after_the_cycle_within_a_budget(hub):
    st, clock = tokens(hub, budget=3)
    st.mints_in_cycle = 1  # (10 by default: a small hub sees every kernel in the first cycle)
    st.new_cycle()
    assert await st.get(record(user="a"), budgeted=True)  # the cycle's own budgeted mint
    for user in ("b", "c"):  # the rest: after the cycle
        with pytest.raises(TokenDeferred, match="next cycle"):
            await st.get(record(user=user), budgeted=True)
    assert st.wanted == 2 and [u for u, _ in hub.posts] == ["a"]
    assert await st.get(record(user="d"))  # a view that can stop a server: minted at once
    assert await st.mint_wanted() == 1  # after the cycle, one at a time, 3 mints per cycle in all
    assert [u for u, _ in hub.posts] == ["a", "d", "b"] and st.wanted == 1
    st.new_cycle()
    assert await st.get(record(user="b"), budgeted=True)  # held ones cost nothing
    assert await st.mint_wanted() == 1
    assert await st.get(record(user="c"), budgeted=True)
    assert st.wanted == 0 and [u for u, _ in hub.posts] == ["a", "d", "b", "c"]
    # a token due for renewal when the cycle's own mints are spent: used while it is
    # still good, and renewed after the cycle
    st.new_cycle()
    clock.t += 2701
    assert await st.get(record(user="e"), budgeted=True) == "secret5"  # the cycle's own mint
    assert await st.get(record(user="a"), budgeted=True) == "secret1"
    assert st.wanted == 1 and await st.mint_wanted() == 1
    assert await st.get(record(user="a"), budgeted=True) == "secret6"
    st.new_cycle()
    clock.t += 2701 + 840
    assert await st.get(record(user="f"), budgeted=True)  # the cycle's own mint
    with pytest.raises(TokenDeferred):  # within a minute of expiring: not sent any more
        await st.get(record(user="b"), budgeted=True)
    # servers the hub no longer lists are not minted for
    await st.keep_only([("a", ""), ("f", "")])
    assert st.wanted == 0 and await st.mint_wanted() == 0
