"""Retries with backoff, time-outs, and the hub/kernel/Prometheus clients over real HTTP."""

from __future__ import annotations

import asyncio
import logging

import pytest
import pytest_asyncio
from culler_fakes import H100_MIG, FakePrometheus, free_port, template
from tornado import web
from tornado.httpserver import HTTPServer

from gpuspawner.culler.gpu_metrics import ENGINE, GpuQuerySettings
from gpuspawner.culler.hub import HubClient
from gpuspawner.culler.kernels import KernelClient
from gpuspawner.culler.metrics import CullerMetrics
from gpuspawner.culler.prometheus import PrometheusClient
from gpuspawner.culler.transport import RequestFailed, RetryPolicy, Transport

pytestmark = pytest.mark.asyncio(loop_scope="session")
LOG = logging.getLogger("test.transport")
FAST = RetryPolicy(
    attempts=3, base_delay=0.01, max_delay=0.02, request_timeout=2, connect_timeout=2
)


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
        s.seen.append(
            (self.request.method, self.request.uri, self.request.headers.get("Authorization"))
        )
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


async def test_hub_paging_follows_next_on_our_own_url(scripted):
    pages = {
        "0": {
            "items": [{"name": "a"}, {"name": "b"}],
            "_pagination": {
                "next": {"url": "http://elsewhere:1/hub/api/users?state=ready&offset=2&limit=2"}
            },
        },
        "2": {"items": [{"name": "c"}], "_pagination": {"next": None}},
    }

    class Pager(Handler):
        async def get(self, path):
            self.script.seen.append(
                (self.request.method, self.request.uri, self.request.headers.get("Accept"))
            )
            self.finish(pages[self.get_argument("offset", "0")])

    port = free_port()
    server = HTTPServer(web.Application([(r"(.*)", Pager, {"script": scripted})]))
    server.listen(port, "127.0.0.1")
    try:
        hub = HubClient(
            f"http://127.0.0.1:{port}/hub/api", "tok", transport(CullerMetrics()), page_size=2
        )
        names = [u["name"] async for u in hub.iter_users("ready")]
    finally:
        server.stop()
    assert names == ["a", "b", "c"]
    assert scripted.seen[0][1] == "/hub/api/users?state=ready&limit=2"
    assert scripted.seen[1][1] == "/hub/api/users?state=ready&offset=2&limit=2"
    assert scripted.seen[0][2] == "application/jupyterhub-pagination+json"


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


async def test_kernel_view_asks_directly_without_tracking_activity(scripted):
    scripted.body = (
        '[{"id": "k1", "name": "python3", "last_activity": "2026-05-04T11:00:00Z",'
        ' "execution_state": "busy", "connections": 1}]'
    )
    kc = KernelClient("svc-token", transport(CullerMetrics(), "server"))
    v = await kc.view(scripted.url + "/user/alice/")
    assert v.ok and [k.id for k in v.kernels] == ["k1"] and v.kernels[0].busy
    uris = sorted(s[1] for s in scripted.seen)
    assert uris == [
        "/user/alice/api/kernels?no_track_activity=1",
        "/user/alice/api/status?no_track_activity=1",
    ]
    assert {s[2] for s in scripted.seen} == {"token svc-token"}
    scripted.codes = [404]
    assert (await kc.shutdown(scripted.url + "/user/alice/", "k1")).ok  # already gone
    scripted.codes = [500] * 3
    bad = await kc.shutdown(scripted.url + "/user/alice/", "k2")
    assert not bad.ok and "500" in bad.error
    scripted.codes = [500] * 6  # both calls, every try
    down = await kc.view(scripted.url + "/user/alice/")
    assert not down.ok


async def test_prometheus_one_request_and_errors():
    fake = FakePrometheus()
    fake.start()
    try:
        labels = template(H100_MIG, ENGINE, 0)
        fake.tsdb.add_scrapes(ENGINE, labels, [0.0] * 40)
        m = CullerMetrics()
        prom = PrometheusClient(fake.url, GpuQuerySettings(), transport(m, "prometheus"))
        v = await prom.gpu_view()
        assert v.available and v.for_pod(labels["namespace"], labels["pod"]).idle
        assert (
            fake.requests == 1
            and m.value("gpuspawner_culler_requests_total", {"target": "prometheus"}) == 1
        )
        fake.mode = "down"
        v = await prom.gpu_view()
        assert not v.available and "503" in v.error and fake.requests == 4
        fake.mode = "ok"
        bad = PrometheusClient(
            fake.url, GpuQuerySettings(selector='pod=~"x'), transport(m, "prometheus")
        )
        v = await bad.gpu_view()
        assert not v.available and "bad matcher" in v.error
    finally:
        fake.stop()
