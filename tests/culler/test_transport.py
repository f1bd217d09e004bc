"""Retries with backoff, time-outs, and the hub and kernel clients over real HTTP (the
Prometheus client is tested against the real Prometheus in test_culler_integration.py)."""

from __future__ import annotations

import asyncio
import logging

import pytest
import pytest_asyncio
from tornado import web
from tornado.httpserver import HTTPServer

from gpuspawner.culler.contract import parse_offering
from gpuspawner.culler.cullmetrics import CullerMetrics
from gpuspawner.culler.hubclient import HubClient
from gpuspawner.culler.kernels import KernelClient
from gpuspawner.culler.records import ServerRecord
from gpuspawner.culler.transport import RequestFailed, RetryPolicy, Transport
from gpuspawner.devcluster.ports import free_port

pytestmark = pytest.mark.asyncio(loop_scope="session")
LOG = logging.getLogger("test.transport")
FAST = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.02, request_timeout=2, connect_timeout=2)


class Script:
    """Answers the scripted codes in order, then 200 with `body`."""

    def __init__(self):
        self.codes: list[int] = []
        self.seen: list[tuple[str, str, str | None]] = []
        self.body = "{}"
        self.delay = 0.0


class Handler(web.RequestHandler):
    SUPPORTED_METHODS = ("GET", "DELETE")

    def initialize(self, script):
        self.script = script

    async def get(self, path):
        s = self.script
        s.seen.append((self.request.method, self.request.uri, self.request.headers.get("Authorization")))
        if s.delay:
            await asyncio.sleep(s.delay)
        if s.codes:
            self.set_status(s.codes.pop(0))
            self.finish({"message": "scripted"})
            return
        self.set_header("Content-Type", "application/json")
        self.finish(s.body)

    delete = get


@pytest_asyncio.fixture(loop_scope="session")
async def scripted():
    script = Script()
    port = free_port()
    server = HTTPServer(web.Application([(r"(.*)", Handler, {"script": script})]))
    server.listen(port, "127.0.0.1")
    script.url = f"http://127.0.0.1:{port}"
    yield script
    server.stop()


def transport(metrics, source="hub", retry=FAST):
    return Transport(source, concurrency=4, retry=retry, metrics=metrics, log=LOG)


async def test_retries_server_errors_then_succeeds(scripted):
    m = CullerMetrics()
    scripted.codes = [503, 502]
    body = await transport(m).fetch_json(scripted.url + "/hub/api/")
    assert body == {} and len(scripted.seen) == 3
    assert m.value("gpuspawner_culler_requests_total", {"target": "hub"}) == 3


async def test_gives_up_after_its_attempts(scripted):
    m = CullerMetrics()
    scripted.codes = [500] * 5
    with pytest.raises(RequestFailed) as e:
        await transport(m).fetch(scripted.url + "/x")
    assert e.value.code == 500 and len(scripted.seen) == 3 and "scripted" in str(e.value)


async def test_client_errors_are_not_retried(scripted):
    scripted.codes = [403]
    with pytest.raises(RequestFailed) as e:
        await transport(CullerMetrics()).fetch(scripted.url + "/x")
    assert e.value.code == 403 and len(scripted.seen) == 1


async def test_time_outs_and_refused_connections_are_599_and_retried(scripted):
    scripted.delay = 1.0
    slow = RetryPolicy(attempts=2, base_delay=0.01, max_delay=0.01, request_timeout=0.2)
    with pytest.raises(RequestFailed) as e:
        await transport(CullerMetrics(), retry=slow).fetch(scripted.url + "/x")
    assert e.value.code == 599 and len(scripted.seen) == 2
    with pytest.raises(RequestFailed) as e:
        await transport(CullerMetrics()).fetch(f"http://127.0.0.1:{free_port()}/")
    assert e.value.code == 599


async def list_users(pager: type[web.RequestHandler], script) -> list[str]:
    """The names HubClient.iter_users lists, two to a page, from a hub played by ``pager``."""
    port = free_port()
    server = HTTPServer(web.Application([(r"(.*)", pager, {"script": script})]))
    server.listen(port, "127.0.0.1")
    try:
        hub = HubClient(f"http://127.0.0.1:{port}/hub/api", "tok", transport(CullerMetrics()), page_size=2)
        return [u["name"] async for u in hub.iter_users("ready")]
    finally:
        server.stop()


async def test_hub_paging_follows_next_on_our_own_url(scripted):
    pages = {
        "0": {
            "items": [{"name": "a"}, {"name": "b"}],
            "_pagination": {"next": {"url": "http://elsewhere:1/hub/api/users?state=ready&offset=2&limit=2"}},
        },
        "2": {"items": [{"name": "c"}], "_pagination": {"next": None}},
    }

    class Pager(Handler):
        async def get(self, path):
            self.script.seen.append((self.request.method, self.request.uri, self.request.headers.get("Accept")))
            self.finish(pages[self.get_argument("offset", "0")])

    names = await list_users(Pager, scripted)
    assert names == ["a", "b", "c"]
    assert scripted.seen[0][1] == "/hub/api/users?state=ready&limit=2"
    assert scripted.seen[1][1] == "/hub/api/users?state=ready&offset=2&limit=2"
    assert scripted.seen[0][2] == "application/jupyterhub-pagination+json"


async def test_hub_paging_asks_the_page_after_next_while_a_page_is_handled(scripted):
    """With the hub's total, the page after the next is asked as soon as a page arrives: the
    hub answers page 2 here only once page 4 was asked (without that, the listing would wait
    until its bound and fail). Every page once, the users in the hub's order."""
    names = [f"u{i}" for i in range(7)]
    asked_4 = asyncio.Event()

    class Pager(Handler):
        async def get(self, path):
            offset = int(self.get_argument("offset", "0"))
            self.script.seen.append((self.request.method, self.request.uri, self.request.headers.get("Accept")))
            if offset == 4:
                asked_4.set()
            if offset == 2:
                await asyncio.wait_for(asked_4.wait(), 20)
            after = offset + 2
            nxt = {"offset": after, "limit": 2, "url": f"http://elsewhere:1/hub/api/users?state=ready&offset={after}&limit=2"}
            self.finish(
                {
                    "items": [{"name": n} for n in names[offset:after]],
                    "_pagination": {"offset": offset, "limit": 2, "total": len(names), "next": nxt if after < len(names) else None},
                }
            )

    got = await list_users(Pager, scripted)
    assert got == names
    uris = sorted(uri for _, uri, _ in scripted.seen)
    assert uris == sorted(["/hub/api/users?state=ready&limit=2"] + [f"/hub/api/users?state=ready&offset={o}&limit=2" for o in (2, 4, 6)])


async def test_hub_stop_server_paths(scripted):
    hub = HubClient(scripted.url + "/hub/api", "tok", transport(CullerMetrics()))
    assert await hub.stop_server("al ice", "") == "stopped"
    scripted.codes = [202]
    assert await hub.stop_server("bob", "gpu job", remove=True) == "stopping"
    scripted.codes = [404]
    assert await hub.stop_server("carol", "") == "gone"
    assert [s[1] for s in scripted.seen] == [
        "/hub/api/users/al%20ice/server",
        "/hub/api/users/bob/servers/gpu%20job",
        "/hub/api/users/carol/server",
    ]
    assert scripted.seen[0][2] == "token tok"


class Tokens:
    """The per-server token source, reduced to what KernelClient asks of it."""

    def __init__(self):
        self.refusals: list[str] = []

    async def get(self, server, budgeted=False):
        return f"tok-{server.label}"

    async def refused(self, server):
        self.refusals.append(server.label)

    def accepted(self, server):
        pass


def record(base_url: str, user: str = "alice") -> ServerRecord:
    offering = parse_offering({"gpuspawner": {"kind": "shared", "url": base_url + f"/user/{user}/"}})
    return ServerRecord(user, "", False, True, None, None, None, offering)


async def test_kernel_view_asks_directly_with_the_server_s_own_token(scripted):
    scripted.body = (
        '[{"id": "k1", "name": "python3", "last_activity": "2026-05-04T11:00:00Z", "execution_state": "busy", "connections": 1}]'
    )
    tokens = Tokens()
    kc = KernelClient(tokens, transport(CullerMetrics(), "server"))
    alice = record(scripted.url)
    v = await kc.view(alice)
    assert v.ok and [k.id for k in v.kernels] == ["k1"] and v.kernels[0].busy
    uris = sorted(s[1] for s in scripted.seen)
    assert uris == [
        "/user/alice/api/kernels?no_track_activity=1",
        "/user/alice/api/status?no_track_activity=1",
    ]
    assert {s[2] for s in scripted.seen} == {"token tok-alice"}
    scripted.codes = [404]
    assert (await kc.shutdown(alice, "k1")).ok  # already gone
    scripted.codes = [500] * 3
    bad = await kc.shutdown(alice, "k2")
    assert not bad.ok and "500" in bad.error
    scripted.codes = [500] * 6  # both calls, every try
    down = await kc.view(alice)
    assert not down.ok
    assert tokens.refusals == []
    # a server that refuses its token: the token is dropped (a new one next time)
    scripted.codes = [403, 403]
    assert not (await kc.view(alice)).ok
    scripted.codes = [401]
    assert not (await kc.shutdown(alice, "k3")).ok
    assert tokens.refusals == ["alice", "alice"]


async def test_the_server_transport_carries_no_credential_of_its_own():
    t = transport(CullerMetrics(), "server")
    t.headers["Authorization"] = "token culler-secret"
    with pytest.raises(ValueError, match="no credential"):
        KernelClient(Tokens(), t)


async def test_redirects_are_never_followed(scripted):
    """A pod that answers with a redirect gets an error, and the credential on
    the request never reaches where it points."""
    elsewhere = Script()
    port = free_port()
    server = HTTPServer(web.Application([(r"(.*)", Handler, {"script": elsewhere})]))
    server.listen(port, "127.0.0.1")

    class Redirect(Handler):
        async def get(self, path):
            self.script.seen.append((self.request.method, self.request.uri, None))
            self.redirect(f"http://127.0.0.1:{port}/hub/api/users")

    rport = free_port()
    rserver = HTTPServer(web.Application([(r"(.*)", Redirect, {"script": scripted})]))
    rserver.listen(rport, "127.0.0.1")
    try:
        tokens = Tokens()
        kc = KernelClient(tokens, transport(CullerMetrics(), "server"))
        v = await kc.view(record(f"http://127.0.0.1:{rport}"))
        hub = HubClient(f"http://127.0.0.1:{rport}/hub/api", "culler-secret", transport(CullerMetrics()))
        with pytest.raises(RequestFailed) as e:
            await hub.info()
    finally:
        server.stop()
        rserver.stop()
    assert not v.ok and "not followed" in v.error
    assert e.value.code == 302 and "not followed" in str(e.value)
    assert elsewhere.seen == []


async def test_a_deferred_token_is_a_deferred_view_and_nothing_is_sent(scripted):
    from gpuspawner.culler.tokens import TokenDeferred

    class Spent(Tokens):
        async def get(self, server, budgeted=False):
            if budgeted:
                raise TokenDeferred("deferred to a later cycle: token_mints_per_cycle (1) reached")
            return await super().get(server)

    scripted.body = "[]"
    kc = KernelClient(Spent(), transport(CullerMetrics(), "server"))
    v = await kc.view(record(scripted.url), with_status=False)  # could only reclaim
    assert not v.ok and v.deferred and "token_mints_per_cycle" in v.error
    assert scripted.seen == []
    assert (await kc.view(record(scripted.url), with_status=True)).ok  # could stop: asked


async def test_a_pod_that_does_not_answer_is_asked_once_per_cycle_and_its_slots_are_freed(scripted):
    """Its view fails after about one request's timeout, not after every retry's (which held the
    culler's connections and the cycle for about 31 s, delaying everyone else's decisions)."""
    scripted.delay = 30.0  # answers nothing within the cycle
    slow = RetryPolicy(attempts=3, base_delay=0.3, max_delay=0.3, request_timeout=0.5, connect_timeout=0.5)
    t = transport(CullerMetrics(), "server", retry=slow)
    kc = KernelClient(Tokens(), t)
    view = await kc.view(record(scripted.url))
    assert not view.ok and "did not answer within 0.55 s" in view.error
    paths = [s[1] for s in scripted.seen]
    assert paths.count("/user/alice/api/kernels?no_track_activity=1") == 1, paths  # not its three tries
    assert paths.count("/user/alice/api/status?no_track_activity=1") == 1, paths
    assert t._sem._value == 4  # every connection slot is free again
