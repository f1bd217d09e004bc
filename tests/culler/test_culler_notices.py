"""Fair warning before a cull and an answer after it (issue #17, the culler's
half), the whole story on a REAL JupyterHub with configurable-http-proxy, REAL
single-user servers (jupyterhub-singleuser, real ipykernel kernels), the REAL
Prometheus scraping dcgm-exporter stand-ins, and the culler's own service API
served as the hub service ``gpu-culler`` behind the proxy.

The notebook side is ``notice_double.py``: a TEST DOUBLE of gpuspawner's
notebook extension (the other half of the issue), a real Jupyter Server
extension that records each notice the culler puts to it.

* ada (time-sliced share): ran a cell and left. 25 minutes later she is warned
  (kernels, at the second her kernel passes its 30-minute timeout); the warning
  is not repeated; at 31 minutes her kernel is shut down, the notice naming it
  arriving while it was still alive; she reads why in the API and on the hub's
  home and spawn pages.
* bob (whole GPU): warned, then his server stopped; his page says so.
* cy (time-sliced share): warned, runs a cell: at the warned time nothing is
  reclaimed and the warning moves to 30 minutes after her cell; she starts a long
  computation: the warning is withdrawn.
* hostile: bob's token reads only bob's actions, cannot ask for ada's or for
  everyone's, and cannot post a notice to ada's server; ada's page never shows
  bob's actions. A token with ``custom:gpu-culler:read-actions`` reads all.

The culler's clock is the test's: cycles run at chosen times (no sleeps).
"""

from __future__ import annotations

import asyncio
import json
import re
from datetime import timedelta
from pathlib import Path
from urllib.parse import quote

import pytest
import pytest_asyncio
from jupyterhub_idle_culler import utcnow
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from gpuspawner.core.noticewords import when_words
from gpuspawner.culler.api import make_service_app
from gpuspawner.culler.dates import parse_time
from gpuspawner.culler.policy import KEEP, RECLAIM, STOP
from tests.culler.culler_hub import CONTRACT, Hub, Jupyter, in_process_culler, join_gpu_users
from tests.culler.culler_prom import Telemetry, user_gpu
from tests.culler.notice_double import recorded

pytestmark = pytest.mark.asyncio(loop_scope="session")

HERE = Path(__file__).parent
M = timedelta(minutes=1)
SERVERS = {"ada": "t4-shared", "bob": "a100-80gb", "cy": "t4-shared"}
READER_TOKEN = "reader" + "0" * 26
PAGES_TOKEN = "pages" + "0" * 27

SPAWNER = (
    CONTRACT
    + """
from jupyterhub.spawner import SimpleLocalProcessSpawner


class ContractSpawner(SimpleLocalProcessSpawner):
    '''Fills user_options["gpuspawner"] as GPUSpawner does (the culler's contract).'''

    async def start(self):
        ip, port = await super().start()
        self.user_options = with_contract(self, ip, port, self.user_options.get("offering", "t4-shared"))
        return ip, port

    def options_from_form(self, formdata):
        return {"offering": formdata.get("offering", ["t4-shared"])[0]}


c.JupyterHub.spawner_class = ContractSpawner
c.SimpleLocalProcessSpawner.home_dir_template = str(TMP / "home" / "{username}")
c.Spawner.cmd = [str(VENV_BIN / "jupyterhub-singleuser")]
# the test double of the notebook extension (notice_double.py), in every server, in place of
# the real one (which `pip install` enables in this venv, and which keeps only the latest notice)
c.Spawner.args = ["--allow-root", "--ServerApp.jpserver_extensions={'notice_double': True, 'gpuspawner.notebook_ext': False}"]
c.Spawner.environment = {"JUPYTERHUB_ACTIVITY_INTERVAL": "3600", "PYTHONPATH": HERE}
c.Spawner.options_form = "<input name='offering' value='t4-shared'>"

# the culler's service, roles, custom scope, page templates exactly as
# hub_config/culler_service_example.py writes them; the culler itself runs in the
# test's process (its role is held by gpu-culler-test), and serves its API on API_PORT
import os
os.environ["GPUSPAWNER_CULLER_PAGES_TOKEN"] = PAGES_TOKEN
exec(compile(EXAMPLE.read_text(), str(EXAMPLE), "exec"))
from gpuspawner.hub.culleractions import READ_ALL_ACTIONS, template_vars
svc = next(s for s in c.JupyterHub.services if s["name"] == "gpu-culler")
del svc["command"]
svc["url"] = "http://127.0.0.1:%d" % API_PORT
role = next(r for r in c.JupyterHub.load_roles if r["name"] == "gpu-culler")
role["services"] = ["gpu-culler-test"]
c.JupyterHub.services.append({"name": "gpu-culler-test", "api_token": CULLER_TOKEN})
c.JupyterHub.template_vars.update(template_vars(
    "http://127.0.0.1:%d/services/gpu-culler/api/actions" % API_PORT, PAGES_TOKEN))
# an auditor: reads every user's actions, nothing else
c.JupyterHub.services.append({"name": "auditor", "api_token": READER_TOKEN})
c.JupyterHub.load_roles.append({"name": "auditor", "services": ["auditor"],
    "scopes": [READ_ALL_ACTIONS, "access:services!service=gpu-culler"]})
"""
)


class Env:
    hub: Hub
    prom: Telemetry
    api_port: int
    api_sockets: list
    tokens: dict[str, str]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def env(tmp_path_factory):
    e = Env()
    e.prom = await asyncio.to_thread(Telemetry(tmp_path_factory.mktemp("telemetry")).start)
    # the culler's API socket, bound now: a port only reserved could be taken by a server spawned meanwhile
    e.api_sockets = bind_sockets(0, "127.0.0.1")
    e.api_port = e.api_sockets[0].getsockname()[1]
    extra = (
        f"PROM_URL = {e.prom.url!r}\nAPI_PORT = {e.api_port}\nHERE = {str(HERE)!r}\nREADER_TOKEN = {READER_TOKEN!r}\nPAGES_TOKEN = {PAGES_TOKEN!r}\n"
        + SPAWNER
    )
    e.hub = Hub(tmp_path_factory.mktemp("hub"), extra)
    try:  # whatever fails on the way, nothing started is left running
        await e.hub.start()
        await e.hub.create_users(list(SERVERS))
        await join_gpu_users(e.hub, list(SERVERS))
        await asyncio.gather(*(e.hub.spawn(u, {"offering": o}) for u, o in SERVERS.items()))
        e.tokens = {u: (await e.hub.api("POST", f"/users/{u}/tokens", {}))["token"] for u in SERVERS}
        yield e
    finally:
        for sock in e.api_sockets:
            sock.close()
        await e.hub.stop()
        await asyncio.to_thread(e.prom.stop)


def home(e: Env, user: str) -> Path:
    return e.hub.tmp / "home" / user


async def telemetry(e: Env, user: str, engine: float, fb: float) -> None:
    await user_gpu(e.prom, user, SERVERS[user] == "t4-shared", engine, fb)


async def idle_kernel(e: Env, user: str) -> tuple[Jupyter, str]:
    """A kernel that ran a cell and was left, on the user's server."""
    s = await e.hub.server(user)
    j = Jupyter(s["user_options"]["gpuspawner"]["url"], e.tokens[user])
    kid = await j.start_kernel()
    await j.execute(kid, "x = sum(range(10))", wait_idle=True)
    await j.wait_state(kid, "idle")
    return j, kid


async def kernel_activity(j: Jupyter, kid: str):
    return parse_time(next(k for k in await j.kernels() if k["id"] == kid)["last_activity"])


async def get(url: str, token: str | None = None, cookies: str | None = None) -> tuple[int, str]:
    headers = {}
    if token:
        headers["Authorization"] = f"token {token}"
    if cookies:
        headers["Cookie"] = cookies
    resp = await AsyncHTTPClient().fetch(HTTPRequest(url, headers=headers, follow_redirects=False, request_timeout=60), raise_error=False)
    return resp.code, resp.body.decode() if resp.body else ""


async def login(e: Env, user: str) -> str:
    """The hub's login form (dummy authenticator), as a browser posts it: the session cookies."""
    url = f"{e.hub.public_url}/hub/login"
    resp = await AsyncHTTPClient().fetch(url, raise_error=False)
    xsrf = re.search(r'name="_xsrf"[^>]*value="([^"]+)"', resp.body.decode()).group(1)
    jar = {c.split("=", 1)[0]: c.split(";")[0].split("=", 1)[1] for c in resp.headers.get_list("Set-Cookie")}
    body = f"username={user}&password=x&_xsrf={quote(xsrf)}"
    resp = await AsyncHTTPClient().fetch(
        HTTPRequest(
            url,
            method="POST",
            body=body,
            headers={"Cookie": "; ".join(f"{k}={v}" for k, v in jar.items())},
            follow_redirects=False,
        ),
        raise_error=False,
    )
    assert resp.code == 302, resp.code
    jar.update({c.split("=", 1)[0]: c.split(";")[0].split("=", 1)[1] for c in resp.headers.get_list("Set-Cookie")})
    return "; ".join(f"{k}={v}" for k, v in jar.items())


def actions_url(e: Env, query: str = "") -> str:
    return f"{e.hub.public_url}/services/gpu-culler/api/actions{query}"


async def test_warned_then_reclaimed_and_told_why(env):
    ada_j, ada_kid = await idle_kernel(env, "ada")
    await telemetry(env, "ada", engine=0.0, fb=6000.0)
    await telemetry(env, "bob", engine=0.0, fb=9000.0)
    c, rec, app = in_process_culler(
        env.hub.api_url,
        env.prom.url,
        env.hub.culler_token,
        "--GpuCuller.warn_before_seconds=600",
        "--kernel-timeout=1800",
        f"--GpuCuller.action_log_path={env.hub.tmp / 'culler-actions.jsonl'}",
    )
    server = HTTPServer(
        make_service_app(c.metrics, "/services/gpu-culler/", c.action_log, app.hub_auth(), tuple(app.actions_read_all_scopes))
    )
    server.add_sockets(env.api_sockets)
    try:
        ka = await kernel_activity(ada_j, ada_kid)
        bob_seen = parse_time((await env.hub.server("bob"))["last_activity"])
        t0 = max(ka, bob_seen)

        # 10 minutes idle: nothing planned, nothing said
        c.clock = lambda: t0 + 10 * M
        report = await c.cycle()
        assert report.outcome("ada").decision.action == KEEP
        assert recorded(home(env, "ada")) == [] and recorded(home(env, "bob")) == []

        # 25 minutes: both warned, each with the second its action falls due
        c.clock = lambda: t0 + 25 * M
        report = await c.cycle()
        assert report.outcome("ada").decision.action == KEEP and report.outcome("bob").decision.action == KEEP
        [ada_warning] = recorded(home(env, "ada"))
        body = ada_warning["body"]
        assert body["warning"] is True and body["action"] == "kernels"
        assert parse_time(body["act_at"]) == ka + 30 * M
        assert body["limit_seconds"] == 1800 and body["observed"]["gpu_memory_mib"] == 6000
        assert "an idle kernel holds 6000 MiB of the shared GPU's memory while idle for 2" in body["reason"]
        assert ada_warning["by"] == "ada"  # the server's own user's token, never the culler's
        assert "no_track_activity=1" in ada_warning["uri"]
        [bob_warning] = recorded(home(env, "bob"))
        assert bob_warning["body"]["action"] == "server" and bob_warning["body"]["warning"] is True
        assert re.fullmatch(r"the whole GPU has been idle for 2\d minutes \(limit 30\)", bob_warning["body"]["reason"])
        assert "warned ada: kernel shutdown in" in rec.text()

        # a minute later: the same warning is not sent again
        c.clock = lambda: t0 + 26 * M
        await c.cycle()
        assert len(recorded(home(env, "ada"))) == 1 and len(recorded(home(env, "bob"))) == 1

        # 31 minutes: ada's kernel is shut down (told first, while it was alive), bob is stopped
        c.clock = lambda: t0 + 31 * M
        report = await c.cycle()
        assert report.outcome("ada").decision.action == RECLAIM
        assert report.outcome("ada").result.kernels_shut_down == [ada_kid]
        assert ada_kid not in {k["id"] for k in await ada_j.kernels()}
        reclaimed = recorded(home(env, "ada"))[-1]
        assert reclaimed["body"]["reclaimed"] == [ada_kid] and reclaimed["body"]["warning"] is False
        assert ada_kid in reclaimed["kernels_alive"]  # the notice came before the shutdown
        assert report.outcome("bob").decision.action == STOP
        await env.hub.wait_stopped("bob")
        assert recorded(home(env, "bob"))[-1]["body"]["act_at"] == (t0 + 31 * M).isoformat()

        # the answer after the fact: the user's own actions through the hub's proxy
        code, text = await get(actions_url(env), env.tokens["ada"])
        assert code == 200, text
        [act] = json.loads(text)["actions"]
        assert act["user"] == "ada" and act["action"] == "kernels_shut_down" and act["kernels"] == [ada_kid]
        assert act["observed"]["gpu_memory_mib"] == 6000 and act["observed"]["gpu"] == "idle"
        assert act["what"] == "An idle kernel of your server was shut down"
        at = when_words(act["time"], utcnow())  # "00:10 UTC", or with the day when not today
        ada_sentence = f"An idle kernel of your server was shut down at {at}: {act['why']}."
        bob_sentence = re.compile(
            re.escape(f"Your server was stopped at {at}: the whole GPU was idle for ") + r"3\d minutes \(limit 30\)\."
        )

        # ... and on the hub's home and spawn pages, each user only their own
        ada_cookies = await login(env, "ada")
        code, page = await get(f"{env.hub.public_url}/hub/home", cookies=ada_cookies)
        assert code == 200 and ada_sentence in page.replace("&#39;", "'"), page[-3000:]
        assert "Your server was stopped" not in page  # bob's, not hers
        bob_cookies = await login(env, "bob")
        code, page = await get(f"{env.hub.public_url}/hub/spawn", cookies=bob_cookies)
        assert code == 200 and "spawn_form" in page
        assert bob_sentence.search(page), page[-3000:]
        assert "idle kernel" not in page

        # hostile: bob's token reads bob's only; never ada's, never everyone's
        code, text = await get(actions_url(env), env.tokens["bob"])
        assert code == 200 and {a["user"] for a in json.loads(text)["actions"]} == {"bob"}
        code, text = await get(actions_url(env, "?user=ada"), env.tokens["bob"])
        assert code == 403 and "only your own actions" in json.loads(text)["message"]
        code, _ = await get(actions_url(env))  # no token
        assert code in (302, 403)
        code, text = await get(actions_url(env, "?limit=lots"), env.tokens["ada"])
        assert code == 400 and "limit" in json.loads(text)["message"]
        # ... nor post a notice to ada's server
        ada_url = (await env.hub.server("ada"))["user_options"]["gpuspawner"]["url"]
        resp = await AsyncHTTPClient().fetch(
            HTTPRequest(
                ada_url + "api/gpuspawner/culler",
                method="PUT",
                body=json.dumps({"action": "server", "warning": True}),
                headers={"Authorization": f"token {env.tokens['bob']}"},
            ),
            raise_error=False,
        )
        assert resp.code == 403
        # an auditor with custom:gpu-culler:read-actions reads everyone's
        code, text = await get(actions_url(env), READER_TOKEN)
        assert code == 200 and {a["user"] for a in json.loads(text)["actions"]} == {"ada", "bob"}

        # the log survives a culler restart
        again = app.make_action_log()
        assert again.entries() == c.action_log.entries()
        assert sorted(a["user"] for a in again.entries()) == ["ada", "bob"]
    finally:
        server.stop()
        await c.close()


async def test_activity_after_a_warning_means_nothing_is_reclaimed(env):
    cy_j, cy_kid = await idle_kernel(env, "cy")
    await telemetry(env, "cy", engine=0.0, fb=6000.0)
    c, rec, _ = in_process_culler(
        env.hub.api_url,
        env.prom.url,
        env.hub.culler_token,
        "--GpuCuller.warn_before_seconds=600",
        "--kernel-timeout=1800",
    )
    try:
        kc = await kernel_activity(cy_j, cy_kid)
        c.clock = lambda: kc + 25 * M
        await c.cycle()
        [warning] = recorded(home(env, "cy"))
        assert warning["body"]["action"] == "kernels" and parse_time(warning["body"]["act_at"]) == kc + 30 * M

        # cy comes back and runs a cell (at least a second later than the last)
        while utcnow() < kc + timedelta(seconds=2):
            await asyncio.sleep(0.2)
        await cy_j.execute(cy_kid, "y = 2", wait_idle=True)
        assert await kernel_activity(cy_j, cy_kid) > kc + timedelta(seconds=1)

        # at the warned second: nothing reclaimed; the clock started again from her cell
        ran = await kernel_activity(cy_j, cy_kid)
        c.clock = lambda: kc + 30 * M + timedelta(seconds=1)
        report = await c.cycle()
        assert report.outcome("cy").decision.action == KEEP, report.outcome("cy").decision.summary()
        assert cy_kid in {k["id"] for k in await cy_j.kernels()}
        moved = recorded(home(env, "cy"))[-1]["body"]
        assert moved["warning"] is True  # to the second (counted from this cycle's clock)
        assert ran + 30 * M <= parse_time(moved["act_at"]) < ran + 30 * M + timedelta(seconds=1)

        # she starts a long computation: no action is planned any more, and the notebook hears so
        await cy_j.execute(cy_kid, "import time; time.sleep(600)", wait_idle=False)
        await cy_j.wait_state(cy_kid, "busy")
        c.clock = lambda: ran + 30 * M + timedelta(seconds=1)
        report = await c.cycle()
        assert report.outcome("cy").decision.action == KEEP, report.outcome("cy").decision.summary()
        assert cy_kid in {k["id"] for k in await cy_j.kernels()}
        withdrawn = recorded(home(env, "cy"))[-1]["body"]
        assert withdrawn["action"] is None and withdrawn["warning"] is False and withdrawn["act_at"] is None
        assert len(recorded(home(env, "cy"))) == 3
        assert c.action_log.entries("cy") == []
    finally:
        await c.close()
