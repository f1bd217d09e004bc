"""Who may read and post a server's GPU view, checked by a real JupyterHub.

A real hub (tests/culler/culler_hub.py: subprocess, configurable-http-proxy, sqlite)
starts real jupyterhub-singleuser servers for ada and bob; the extension is enabled in
them the way ``pip install gpuspawner`` enables it (the venv's
``etc/jupyter/jupyter_server_config.d/gpuspawner.json``: nothing in this config names it).
Tokens are the hub's own: ada's, a token with only ``access:servers!server=ada/`` (the
culler's per-server token, gpuspawner/culler/tokens.py), and bob's.
"""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest
import pytest_asyncio
from tornado.httpclient import HTTPClientError, HTTPRequest

from tests.culler.culler_hub import Hub

pytestmark = pytest.mark.asyncio(loop_scope="session")

HUB_CONFIG = """
from jupyterhub.spawner import SimpleLocalProcessSpawner
c.JupyterHub.spawner_class = SimpleLocalProcessSpawner
c.SimpleLocalProcessSpawner.home_dir_template = str(TMP / "home" / "{username}")
c.Spawner.cmd = [str(VENV_BIN / "jupyterhub-singleuser")]
c.Spawner.args = ["--allow-root"]
c.Spawner.environment = {
    "JUPYTERHUB_ACTIVITY_INTERVAL": "3600",
    "GPUSPAWNER_OFFERING": "a100-mig-1g-10gb",
    "GPUSPAWNER_KIND": "mig",
    "GPUSPAWNER_DISPLAY_NAME": "MIG 1g.10gb",
}
"""

VIEW = {"action": "server", "act_at": "2999-01-01T00:00:00Z", "warning": True, "reason": "idle"}


class Env:
    hub: Hub
    tokens: dict[str, str]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def env(tmp_path_factory):
    e = Env()
    e.hub = Hub(tmp_path_factory.mktemp("hub"), HUB_CONFIG, debug=False)
    await e.hub.start()
    try:
        await e.hub.create_users(["ada", "bob"])
        for user in ("ada", "bob"):
            await e.hub.spawn(user, {})
        e.tokens = {
            "ada": (await e.hub.api("POST", "/users/ada/tokens", {"note": "ada"}))["token"],
            "bob": (await e.hub.api("POST", "/users/bob/tokens", {"note": "bob"}))["token"],
            "culler": (await e.hub.api("POST", "/users/ada/tokens", {"note": "culler", "scopes": ["access:servers!server=ada/"]}))["token"],
            "bob-server": (
                await e.hub.api("POST", "/users/bob/tokens", {"note": "bob's server", "scopes": ["access:servers!server=bob/"]})
            )["token"],
        }
        yield e
    finally:
        await e.hub.stop()


async def call(env: Env, user: str, path: str, method: str = "GET", body=None, token: str | None = None) -> tuple[int, bytes]:
    url = f"{env.hub.public_url}/user/{quote(user)}/{path}"
    headers = {"Authorization": f"token {token}"} if token else {}
    request = HTTPRequest(url, method=method, headers=headers, body=None if body is None else json.dumps(body), follow_redirects=False)
    try:
        response = await env.hub.client.fetch(request)
        return response.code, response.body
    except HTTPClientError as e:
        return e.code, (e.response.body if e.response else b"")


async def test_the_owner_reads_the_view_of_their_server(env):
    code, body = await call(env, "ada", "api/gpuspawner/status", token=env.tokens["ada"])
    assert code == 200
    status = json.loads(body)
    assert status["offering"]["display_name"] == "MIG 1g.10gb"
    assert "unavailable" in status["devices"]  # no NVIDIA library on this machine: said, not an error


async def test_the_cullers_per_server_token_posts_the_view(env):
    assert (await call(env, "ada", "api/gpuspawner/culler", "PUT", VIEW, env.tokens["culler"]))[0] == 204
    code, body = await call(env, "ada", "api/gpuspawner/status", token=env.tokens["culler"])
    assert code == 200 and json.loads(body)["culler"]["warning"] is True


@pytest.mark.parametrize("who", ["bob", "bob-server", None])
async def test_another_user_or_their_server_cannot_read_or_post_adas_notices(env, who):
    token = env.tokens[who] if who else None
    assert (await call(env, "ada", "api/gpuspawner/culler", "PUT", VIEW, env.tokens["culler"]))[0] == 204
    for method, path, body in (
        ("GET", "api/gpuspawner/status", None),
        ("PUT", "api/gpuspawner/culler", {"action": None, "warning": False, "reason": "bob was here"}),
        ("POST", "api/gpuspawner/keep", {}),
        ("GET", "gpuspawner/", None),
    ):
        code, answer = await call(env, "ada", path, method, body, token)
        assert code in (302, 403), (who, method, path, code)  # 302: the page sends a browser to log in
        assert b"MIG 1g.10gb" not in answer
    code, body = await call(env, "ada", "api/gpuspawner/status", token=env.tokens["ada"])
    culler = json.loads(body)["culler"]
    assert culler["warning"] is True and culler["reason"] == "idle"  # nothing bob sent took effect


async def test_adas_tokens_do_not_reach_bobs_view(env):
    for who in ("ada", "culler"):
        code, _ = await call(env, "bob", "api/gpuspawner/status", token=env.tokens[who])
        assert code == 403, who
