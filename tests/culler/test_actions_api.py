"""The action log's API where no hub is needed: what it says when the hub
cannot be asked, or when no token comes (the hub-backed cases, users and
scopes, are in test_culler_notices.py against a real hub)."""

from __future__ import annotations

import json
import socket

import pytest
import pytest_asyncio
from jupyterhub.services.auth import HubAuth
from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer

from gpuspawner.culler.actionlog import ActionLog
from gpuspawner.culler.api import make_service_app
from gpuspawner.culler.cullmetrics import CullerMetrics
from gpuspawner.devcluster.ports import free_port

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(loop_scope="session")
async def api():
    dead = socket.socket()  # bound, never listening: the "hub" refuses every connection
    dead.bind(("127.0.0.1", 0))
    hub_url = f"http://127.0.0.1:{dead.getsockname()[1]}/hub/api"
    hub_auth = HubAuth(api_url=hub_url, api_token="x", access_scopes={"access:services!service=gpu-culler"})
    app = make_service_app(CullerMetrics(), "/services/gpu-culler/", ActionLog(None), hub_auth)
    port = free_port()
    server = HTTPServer(app)
    server.listen(port, "127.0.0.1")
    yield f"http://127.0.0.1:{port}"
    server.stop()
    dead.close()


async def test_a_hub_that_cannot_be_asked_is_a_503_that_says_so(api):
    resp = await AsyncHTTPClient().fetch(
        f"{api}/services/gpu-culler/api/actions", headers={"Authorization": "token abc"}, raise_error=False
    )
    assert resp.code == 503
    assert json.loads(resp.body) == {"status": 503, "message": "the hub could not be asked whose token this is; try again shortly"}


async def test_no_token_is_a_403_that_says_what_to_send(api):
    for path in ("/services/gpu-culler/api/actions", "/api/actions"):
        resp = await AsyncHTTPClient().fetch(api + path, raise_error=False)
        assert resp.code == 403 and "Authorization: token" in json.loads(resp.body)["message"]
    resp = await AsyncHTTPClient().fetch(api + "/metrics")
    assert b"gpuspawner_culler_decisions_total" in resp.body
