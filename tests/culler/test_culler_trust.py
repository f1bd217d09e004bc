"""The culler against pods its users control (issue #11 item 1), on a REAL
JupyterHub with configurable-http-proxy and REAL single-user servers:

* eve's server is the real jupyterhub-singleuser with a config file in her home
  that records every request's headers (what any user can do). The culler
  reads her kernels and shuts one down; every credential she captured is then
  replayed against bob's server (directly and through the proxy) and against
  the hub API: every replay is refused, and nothing of the culler's own token
  ever reached her pod.
* liam's server lies to keep its GPU: a busy kernel, activity in the future,
  fresh activity reported to the hub. GPU telemetry (the real Prometheus scraping a
  dcgm-exporter stand-in) says idle: kept until ``gpu_idle_limit``, then
  stopped with a WARNING. gus's lies the same way but his GPU really computes:
  never stopped.

The culler's clock is the test's: cycles are run at chosen times (no sleeps).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
import pytest_asyncio
from jupyterhub_idle_culler import utcnow
from tornado.httpclient import AsyncHTTPClient, HTTPRequest

from gpuspawner.culler import GpuCuller
from gpuspawner.culler.cycle import Culler
from gpuspawner.culler.policy import HELD_BACK, KEEP, RECLAIM, STOP
from gpuspawner.culler.records import GPU_IDLE_LIMIT
from gpuspawner.culler.settings import scope_problems
from gpuspawner.culler.tokens import NOTE_PREFIX
from tests.culler.culler_hub import CONTRACT, REPO, Hub, Jupyter, Records, in_process_culler, join_gpu_users
from tests.culler.culler_prom import Telemetry, user_gpu
from tests.culler.hostile_pod import SNOOP_CONFIG, captured

pytestmark = pytest.mark.asyncio(loop_scope="session")

HOSTILE = Path(__file__).with_name("hostile_pod.py")
SKEW = timedelta(hours=3)
#: user -> (offering, server program)
SERVERS = {
    "eve": ("t4-shared", "snoop"),  # records every header, real kernels
    "bob": ("a100-80gb", "singleuser"),  # the victim
    "liam": ("a100-80gb", "liar"),  # busy kernel, future activity; idle GPU
    "gus": ("a100-80gb", "liar"),  # the same lies; busy GPU
}
#: the hub caps token lifetimes below the culler's default (3600 s)
HUB_TOKEN_MAX = 1800

SPAWNER = (
    CONTRACT
    + """
import sys
from jupyterhub.spawner import SimpleLocalProcessSpawner


class ContractSpawner(SimpleLocalProcessSpawner):
    '''Runs the program the test asks for, and fills user_options["gpuspawner"]
    as GPUSpawner does.'''

    async def start(self):
        if self.user_options.get("program") == "liar":
            self.cmd = [sys.executable, HOSTILE]
            self.args = []
        else:
            self.cmd = [str(VENV_BIN / "jupyterhub-singleuser")]
            self.args = ["--allow-root"]
        ip, port = await super().start()
        self.user_options = with_contract(self, ip, port, self.user_options["offering"])
        return ip, port


c.JupyterHub.spawner_class = ContractSpawner
c.SimpleLocalProcessSpawner.home_dir_template = str(TMP / "home" / "{username}")
c.Spawner.environment = {"JUPYTERHUB_ACTIVITY_INTERVAL": "3600"}
c.JupyterHub.token_expires_in_max_seconds = HUB_TOKEN_MAX

# the culler's role exactly as hub_config/culler_service_example.py writes it, held
# by the test's in-process cullers (the example's managed service is not run here)
exec(compile(EXAMPLE.read_text(), str(EXAMPLE), "exec"))
c.JupyterHub.services = [s for s in c.JupyterHub.services if s["name"] != "gpu-culler"]
role = next(r for r in c.JupyterHub.load_roles if r["name"] == "gpu-culler")
role["services"] = ["gpu-culler-test"]
c.JupyterHub.services.append({"name": "gpu-culler-test", "api_token": CULLER_TOKEN})
# the role the culler had before per-server tokens: its own token opened every server
c.JupyterHub.services.append({"name": "old-culler", "api_token": OLD_TOKEN})
c.JupyterHub.load_roles.append({"name": "old-culler", "services": ["old-culler"], "scopes": [
    "list:users", "read:users:activity", "read:servers", "delete:servers", "access:servers"]})
"""
)


class Env:
    hub: Hub
    prom: Telemetry
    old_token: str


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def env(tmp_path_factory):
    e = Env()
    e.prom = await asyncio.to_thread(Telemetry(tmp_path_factory.mktemp("telemetry")).start)
    e.old_token = "old" + "0" * 29
    extra = (
        f"PROM_URL = {e.prom.url!r}\nHOSTILE = {str(HOSTILE)!r}\nHUB_TOKEN_MAX = {HUB_TOKEN_MAX}\nOLD_TOKEN = {e.old_token!r}\n" + SPAWNER
    )
    e.hub = Hub(tmp_path_factory.mktemp("hub"), extra)
    # what eve puts in her home: a config file that records every header
    jupyter_dir = home(e, "eve") / ".jupyter"
    jupyter_dir.mkdir(parents=True)
    (jupyter_dir / "jupyter_server_config.py").write_text(SNOOP_CONFIG)
    try:  # whatever fails on the way, nothing started is left running
        await e.hub.start()
        await e.hub.create_users(list(SERVERS))
        await join_gpu_users(e.hub, list(SERVERS))
        await asyncio.gather(*(ensure_running(e, u) for u in SERVERS))
        yield e
    finally:
        await e.hub.stop()
        await asyncio.to_thread(e.prom.stop)


# -- helpers -----------------------------------------------------------------------------
def home(e: Env, user: str) -> Path:
    return e.hub.tmp / "home" / user


async def ensure_running(e: Env, user: str) -> dict:
    s = await e.hub.server(user)
    if s and s.get("ready"):
        return s
    offering, program = SERVERS[user]
    return await e.hub.spawn(user, {"offering": offering, "program": program})


async def own_token(e: Env, user: str) -> str:
    """A token of the user's own, as they would make on the hub's token page."""
    model = await e.hub.api("POST", f"/users/{user}/tokens", {"expires_in": HUB_TOKEN_MAX})
    return model["token"]


async def telemetry(e: Env, user: str, engine: float, fb: float | None = None) -> None:
    """The user's GPU (a time-sliced share for the shared offering), ready in Prometheus."""
    await user_gpu(e.prom, user, SERVERS[user][0] == "t4-shared", engine, fb)


def culler(e: Env, *argv: str, token: str | None = None) -> tuple[Culler, Records, GpuCuller]:
    return in_process_culler(e.hub.api_url, e.prom.url, token or e.hub.culler_token, *argv, skew=SKEW)


async def call(method: str, url: str, header: tuple[str, str], body: object = None) -> int:
    """One request with one replayed header; the status code, whatever it is."""
    req = HTTPRequest(
        url,
        method=method,
        headers={header[0]: header[1]},
        body=None if body is None and method in ("GET", "DELETE") else json.dumps(body or {}),
        allow_nonstandard_methods=True,
        follow_redirects=False,
        request_timeout=60,
    )
    resp = await AsyncHTTPClient().fetch(req, raise_error=False)
    return resp.code


async def token_ids(e: Env, user: str) -> set[str]:
    return {t["id"] for t in (await e.hub.api("GET", f"/users/{user}/tokens"))["api_tokens"]}


async def received(e: Env, user: str, j: Jupyter) -> list[dict]:
    """What the user's pod received from anyone but the user (``j``), once
    everything sent so far is in its log: a server logs a request after it has
    answered, so the user's own marker request is awaited there first."""
    marker = uuid.uuid4().hex
    await j._json("GET", f"api/status?marker={marker}")
    deadline = time.monotonic() + 60
    while not any(marker in r["uri"] for r in captured(home(e, user))):
        assert time.monotonic() < deadline, "the pod never logged the marker request"
        await asyncio.sleep(0.1)
    own = ["Authorization", f"token {j.token}"]
    return [r for r in captured(home(e, user)) if own not in r["headers"]]


def credentials(requests: list[dict]) -> set[tuple[str, str]]:
    return {(name, value) for r in requests for name, value in r["headers"] if name.lower() in ("authorization", "cookie")}


# -- a pod that records every header -------------------------------------------------
async def test_what_a_pod_captures_from_the_culler_opens_nothing_but_its_own_server(env):
    hub = env.hub
    eve = await ensure_running(env, "eve")
    bob = await ensure_running(env, "bob")
    eve_url = eve["user_options"]["gpuspawner"]["url"]
    bob_url = bob["user_options"]["gpuspawner"]["url"]
    # eve ran a cell and left; bob is computing on his GPU, with a kernel of his own
    ej = Jupyter(eve_url, await own_token(env, "eve"))
    kid = await ej.start_kernel()
    await ej.execute(kid, "x = 1", wait_idle=True)
    await ej.wait_state(kid, "idle")
    bj = Jupyter(bob_url, await own_token(env, "bob"))
    bob_kernel = await bj.start_kernel()
    await telemetry(env, "eve", engine=0.0, fb=6000.0)
    await telemetry(env, "bob", engine=0.8, fb=9000.0)
    (home(env, "eve") / "headers.jsonl").unlink(missing_ok=True)  # from here: the culler's

    c, rec, _ = culler(env)
    report = await c.cycle()
    got = await received(env, "eve", ej)  # what the culler sent eve's pod

    # the culler works: it read eve's kernels and shut the idle one down with her
    # server's own token (the hub's cap on token lifetimes was met and said)
    o = report.outcome("eve")
    assert o.decision.action == RECLAIM, o.decision.summary()
    assert o.result.kernels_shut_down == [kid]
    assert kid not in {k["id"] for k in await ej.kernels()}
    assert f"caps token lifetimes at {HUB_TOKEN_MAX}s" in rec.text(logging.WARNING)
    assert report.outcome("bob").decision.action == KEEP
    [minted] = [
        t
        for t in (await hub.api("GET", "/users/eve/tokens"))["api_tokens"]
        if (t["note"] or "").startswith(NOTE_PREFIX) and "gpu-culler" in t["note"]
    ]
    # its one scope, and what the hub adds for it: eve's own name and groups
    assert sorted(minted["scopes"]) == [
        "access:servers!server=eve/",
        "read:users:groups!user=eve",
        "read:users:name!user=eve",
    ]
    assert minted["expires_at"]
    tokens_before = {u: await token_ids(env, u) for u in ("eve", "bob")}

    # what eve's pod received
    assert {(r["method"], r["uri"].split("?")[0]) for r in got} >= {
        ("GET", "/user/eve/api/kernels"),
        ("DELETE", f"/user/eve/api/kernels/{kid}"),
        ("PUT", "/user/eve/api/gpuspawner/culler"),  # the notice of what is reclaimed (404 here: no extension)
    }
    assert all(dict(r["headers"]).get("User-Agent") == "gpuspawner-culler" for r in got)
    creds = credentials(got)
    assert creds and {name for name, _ in creds} == {"Authorization"}  # no cookie either
    raw = json.dumps(got)
    assert hub.culler_token not in raw and hub.admin_token not in raw

    # every captured credential, replayed against bob's server and the hub
    for header in creds:
        for base in (bob_url, f"{hub.public_url}/user/bob/"):  # directly, through the proxy
            for method, path, body in (
                ("GET", "api/kernels", None),  # read his kernels
                ("POST", "api/kernels", {"name": "python3"}),  # run code
                ("PUT", "api/contents/pwned.txt", {"type": "file", "format": "text", "content": "eve was here"}),
                ("DELETE", f"api/kernels/{bob_kernel}", None),
            ):
                code = await call(method, base + path, header, body)
                assert code == 403, (method, base + path, code)
        for method, path, body in (
            ("GET", "/users", None),  # list users
            ("GET", "/users/bob", None),  # read his servers
            ("DELETE", "/users/bob/server", None),  # stop his server
            ("POST", "/users/bob/tokens", {"expires_in": 600}),  # become bob
            ("POST", "/users/eve/tokens", {"expires_in": 600}),  # more than it grants
            ("GET", "/users/eve/tokens", None),
            ("DELETE", "/users/eve/server", None),
        ):
            code = await call(method, hub.api_url + path, header, body)
            assert code in (403, 404), (method, path, code)
    assert await hub.server("bob") and (await hub.server("bob"))["ready"]
    assert bob_kernel in {k["id"] for k in await bj.kernels()}
    assert not (home(env, "bob") / "pwned.txt").exists()
    assert {u: await token_ids(env, u) for u in ("eve", "bob")} == tokens_before  # none made

    # what a leak gives its user: their own server, which they had anyway
    [header] = creds
    assert await call("GET", eve_url + "api/kernels", header) == 200
    # revoked when the culler stops
    await c.close()
    assert await call("GET", hub.api_url + "/user", header) == 403
    notes = [t["note"] for t in (await hub.api("GET", "/users/eve/tokens"))["api_tokens"]]
    assert not any("gpu-culler" in (n or "") for n in notes)


async def test_the_culler_never_falls_back_to_its_own_token(env):
    """With the old role (access:servers, no tokens) the culler cannot mint a
    per-server token: it reads no kernels rather than send its own token, says
    why, and names the needless scope at start-up."""
    eve = await ensure_running(env, "eve")
    ej = Jupyter(eve["user_options"]["gpuspawner"]["url"], await own_token(env, "eve"))
    kid = await ej.start_kernel()
    await ej.execute(kid, "x = 1", wait_idle=True)
    await ej.wait_state(kid, "idle")
    await telemetry(env, "eve", engine=0.0, fb=6000.0)
    (home(env, "eve") / "headers.jsonl").unlink(missing_ok=True)
    c, rec, app = culler(env, token=env.old_token)
    await app.check_hub(c)
    report = await c.cycle()
    assert await received(env, "eve", ej) == []  # nothing at all was sent to the pod
    o = report.outcome("eve")
    assert o.kernel_view is not None and not o.kernel_view.ok
    assert "'tokens' scope" in o.kernel_view.error
    assert kid in {k["id"] for k in await ej.kernels()}
    log = rec.text(logging.WARNING)
    assert "grants 'access:servers', which it does not need" in log
    assert "lacks 'tokens'" in log
    assert scope_problems((await c.hub.whoami())["scopes"])  # the same, from the hub
    await c.close()


# -- a pod that lies to keep its GPU ----------------------------------------------------
async def test_busy_claims_on_an_idle_gpu_are_overruled_after_the_bound(env):
    for user in ("liam", "gus"):
        await ensure_running(env, user)
    await telemetry(env, "liam", engine=0.0)
    await telemetry(env, "gus", engine=0.7)  # really computing
    c, rec, _ = culler(env, "--kind-timeout=full=60", "--gpu-idle-limit=1500")
    start = utcnow()
    claims = []
    for minutes in range(0, 6 * 60 + 1, 10):  # cycles 10 minutes apart (the GPU window)
        c.clock = lambda m=minutes: start + timedelta(minutes=m)
        report = await c.cycle()
        liam, gus = report.outcome("liam"), report.outcome("gus")
        assert gus.decision.action == KEEP, gus.decision.summary()
        assert "GR_ENGINE_ACTIVE max 0.70" in gus.decision.summary()
        assert gus.kernel_view is None  # its GPU alone keeps it: not even asked
        if liam is None:  # stopped in an earlier cycle
            continue
        if minutes < 25:  # kept on its word while the bound runs
            assert liam.decision.action in (KEEP, HELD_BACK), (minutes, liam.decision.summary())
            assert liam.result.stopped is None
            claims.append(liam.decision.summary())
        else:
            assert minutes == 30, "the bound is counted from the first cycle that saw it idle"
            d = liam.decision
            assert d.action == STOP and d.stop_reason == GPU_IDLE_LIMIT, d.summary()
            assert d.gpu_idle_for == timedelta(minutes=30)
            assert liam.result.stopped in ("stopped", "stopping")
            await env.hub.wait_stopped("liam")
    assert any("1 of 1 kernels busy" in s and "activity claimed" in s for s in claims), claims
    [warning] = [r for r in rec.records if r.levelno == logging.WARNING and "liam" in r.getMessage()]
    text = warning.getMessage()
    assert "stop server liam [full a100-80gb] (gpu_idle_limit)" in text
    assert "idle for 00:30:00, past gpu_idle_limit" in text
    assert "1 of 1 kernels busy" in text and "in the future" in text
    assert c.metrics.value("gpuspawner_culler_server_stops_total", {"reason": "gpu_idle_limit", "kind": "full"}) == 1
    # gus, whose GPU computes, was never stopped and was never even asked
    assert (await env.hub.server("gus"))["ready"]
    # the liar only ever got its own server's token
    raw = json.dumps(captured(home(env, "liam")))
    assert "Authorization" in raw and env.hub.culler_token not in raw
    # ... with its notice too: told just before, with that same token, never the culler's
    # (warned 5 minutes before its gpu_idle_limit, then told as it was stopped)
    notices = [r for r in captured(home(env, "liam")) if r["method"] == "PUT"]
    assert [r["uri"].split("?")[0] for r in notices] == ["/user/liam/api/gpuspawner/culler"] * 2
    assert all("no_track_activity=1" in r["uri"] for r in notices)
    assert "warned liam: server stop in 00:05:00" in rec.text()
    await c.close()


async def test_the_service_revokes_its_tokens_when_the_hub_stops_it(env):
    """`python -m gpuspawner.culler` as the hub runs it: on SIGTERM (how the hub
    stops a managed service) it revokes the per-server tokens it minted."""
    eve = await ensure_running(env, "eve")
    ej = Jupyter(eve["user_options"]["gpuspawner"]["url"], await own_token(env, "eve"))
    kid = await ej.start_kernel()  # a kernel nobody ran code in: nothing to shut down
    await telemetry(env, "eve", engine=0.0, fb=6000.0)  # a reclaim is possible: kernels are read

    def culler_tokens(model: dict) -> list[dict]:
        return [t for t in model["api_tokens"] if "gpu-culler" in (t["note"] or "")]

    env_vars = {
        **os.environ,
        "JUPYTERHUB_API_URL": env.hub.api_url,
        "JUPYTERHUB_API_TOKEN": env.hub.culler_token,
        "PYTHONPATH": str(REPO),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuspawner.culler", f"--prometheus-url={env.prom.url}", "--cull-every=1", "--server-token-lifetime=600"],
        env=env_vars,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while not culler_tokens(await env.hub.api("GET", "/users/eve/tokens")):
            assert proc.poll() is None and time.monotonic() < deadline, "no token was minted"
            await asyncio.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out.decode()
    assert "revoking 1 per-server tokens" in out.decode()
    assert culler_tokens(await env.hub.api("GET", "/users/eve/tokens")) == []
    assert kid in {k["id"] for k in await ej.kernels()}
