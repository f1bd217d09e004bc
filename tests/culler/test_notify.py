"""The notifier over real HTTP: each notice once, a 404 remembered per server
instance (a restart asks again), the server's own token and no other."""

from __future__ import annotations

import dataclasses
import json
import logging
from datetime import UTC, datetime

import pytest
import pytest_asyncio
from tornado import web
from tornado.httpserver import HTTPServer

from gpuspawner.culler.cullmetrics import CullerMetrics
from gpuspawner.culler.notify import Notifier
from gpuspawner.culler.transport import Transport
from gpuspawner.devcluster.ports import free_port
from tests.culler.test_transport import FAST, Tokens, record

pytestmark = pytest.mark.asyncio(loop_scope="session")
LOG = logging.getLogger("test.notify")
WARN = {"action": "kernels", "act_at": "2026-05-04T12:30:00+00:00", "warning": True, "idle_since": None, "reason": "25 min"}


class Extension(web.RequestHandler):
    """A server that has the extension (204) or not (404), recording what it got."""

    SUPPORTED_METHODS = ("PUT",)

    def initialize(self, state: dict) -> None:
        self.state = state

    def put(self, path: str) -> None:
        self.state["got"].append((self.request.uri, self.request.headers.get("Authorization"), json.loads(self.request.body)))
        self.set_status(self.state["code"])
        self.finish()


@pytest_asyncio.fixture(loop_scope="session")
async def ext():
    state = {"got": [], "code": 204}
    port = free_port()
    server = HTTPServer(web.Application([(r"(.*)", Extension, {"state": state})]))
    server.listen(port, "127.0.0.1")
    state["url"] = f"http://127.0.0.1:{port}"
    yield state
    server.stop()


def notifier() -> Notifier:
    t = Transport("server", concurrency=2, retry=FAST, metrics=CullerMetrics(), log=LOG)
    return Notifier(Tokens(), t, LOG)


async def test_a_notice_is_sent_once_with_the_server_s_own_token_and_not_tracked(ext):
    n, alice = notifier(), record(ext["url"])
    assert not n.pending(alice, {"action": None, "warning": False})  # nothing to clear yet
    assert await n.put(alice, WARN)
    assert not await n.put(alice, {**WARN, "reason": "26 min"})  # the same news: not again
    assert await n.put(alice, {"action": None, "act_at": None, "warning": False, "idle_since": None})  # withdrawn
    assert [(u, a) for u, a, _ in ext["got"]] == [("/user/alice/api/gpuspawner/culler?no_track_activity=1", "token tok-alice")] * 2


async def test_no_extension_is_remembered_until_the_server_restarts(ext, caplog):
    caplog.set_level(logging.INFO, logger=LOG.name)
    ext["code"] = 404
    n, alice = notifier(), record(ext["url"])
    assert not await n.put(alice, WARN)
    assert not await n.put(alice, {**WARN, "act_at": "2026-05-04T12:31:00+00:00"}, force=True)
    assert len(ext["got"]) == 1 and caplog.text.count("has no gpuspawner notebook extension") == 1
    restarted = dataclasses.replace(alice, started=datetime(2026, 5, 4, 13, tzinfo=UTC))
    ext["code"] = 204
    assert await n.put(restarted, WARN)
    assert len(ext["got"]) == 2


async def test_a_refused_token_is_given_back_and_the_transport_must_carry_none(ext):
    ext["code"] = 403
    n, alice = notifier(), record(ext["url"])
    assert not await n.put(alice, WARN)
    assert n.tokens.refusals == ["alice"]
    t = Transport("server", concurrency=1, retry=FAST, metrics=CullerMetrics(), log=LOG, headers={"Authorization": "token x"})
    with pytest.raises(ValueError, match="no credential"):
        Notifier(Tokens(), t, LOG)
