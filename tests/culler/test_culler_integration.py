"""The culler against a REAL JupyterHub (subprocess, real configurable-http-proxy,
sqlite), REAL single-user servers (jupyterhub-singleuser) with REAL ipykernel
kernels, and the REAL Prometheus scraping dcgm-exporter stand-ins (rows labelled
like the reference scrapes), the hub's /metrics and the managed culler's metrics.
Prometheus "down" and "slow" are a fault-injecting proxy in front of it.

One hub for the module. The hub's last_activity is made "hours old" by running
the culler with its clock 3 hours ahead (its timeouts stay the defaults:
full 30 min, mig 1 h, shared 2 h -> 4 h for the t4-shared offering here, cpu 8 h).
Each test first puts the servers it needs in the state it needs, so tests can run
alone or in any order.
"""

from __future__ import annotations

import asyncio
import logging
import re
from datetime import timedelta

import pytest
import pytest_asyncio
from jupyterhub_idle_culler import utcnow
from tornado.httpclient import AsyncHTTPClient

from gpuspawner.culler.cullmetrics import CullerMetrics
from gpuspawner.culler.cycle import Culler
from gpuspawner.culler.gpu_query import ENGINE, FB_USED, GpuQuerySettings
from gpuspawner.culler.policy import HELD_BACK, KEEP, RECLAIM, STOP
from gpuspawner.culler.promclient import PrometheusClient
from gpuspawner.culler.transport import RetryPolicy, Transport
from gpuspawner.devcluster.ports import free_ports
from gpuspawner.devcluster.prometheus import ScrapeJob
from tests.culler.culler_fakes import (
    H100_MIG,
    MIXED_LOWER,
    SHARED_A100,
    FaultyProxy,
    template,
)
from tests.culler.culler_hub import Hub, Jupyter, Records, in_process_culler, join_gpu_users
from tests.culler.culler_prom import Telemetry

pytestmark = pytest.mark.asyncio(loop_scope="session")

SKEW = timedelta(hours=3)
OFFERING = {  # user -> offering slug (the test spawner maps slugs to kinds)
    "bea": "a100-80gb",  # full, busy kernel
    "gil": "a100-mig-1g.10gb",  # mig, GPU active
    "sam": "t4-shared",  # shared, idle kernel holding memory
    "mia": "a100-mig-1g.10gb",  # mig, idle
    "fay": "a100-80gb",  # full, idle
    "val": "a10-24q",  # vgpu, named server "train", idle
    "ned": "a100-80gb-unreachable",  # full, its kernel API cannot be reached
    "cal": None,  # plain server, no gpuspawner contract
}
NAMED = {"val": "train"}

SPAWNER = """
from jupyterhub.spawner import SimpleLocalProcessSpawner

OFFERINGS = {"a100-80gb": "full", "a100-mig-1g.10gb": "mig", "t4-shared": "shared",
             "a10-24q": "vgpu", "a100-80gb-unreachable": "full"}
RESOURCES = {"full": {"nvidia.com/gpu": "1"}, "mig": {"nvidia.com/mig-1g.10gb": "1"},
             "shared": {"nvidia.com/gpu.shared": "1"}, "vgpu": {"nvidia.com/gpu": "1"}}


class ContractSpawner(SimpleLocalProcessSpawner):
    '''Fills user_options["gpuspawner"] as GPUSpawner does (the culler's contract).'''

    async def start(self):
        ip, port = await super().start()
        slug = self.user_options.get("offering")
        kind = OFFERINGS.get(slug)
        if kind:
            pod = "jupyter-" + self.user.name + ("--" + self.name if self.name else "")
            url_port = UNREACHABLE_PORT if slug.endswith("unreachable") else port
            opts = dict(self.user_options)
            opts["gpuspawner"] = {
                "offering": slug, "kind": kind, "resources": RESOURCES[kind],
                "pod": pod, "namespace": "jhub",
                "url": f"http://{ip}:{url_port}{self.server.base_url}",
            }
            self.user_options = opts
        return ip, port


c.JupyterHub.spawner_class = ContractSpawner
c.SimpleLocalProcessSpawner.home_dir_template = str(TMP / "home" / "{username}")
c.Spawner.cmd = [str(VENV_BIN / "jupyterhub-singleuser")]
c.Spawner.args = ["--allow-root"]
c.Spawner.environment = {"JUPYTERHUB_ACTIVITY_INTERVAL": "3600"}

# the culler service and its role exactly as hub_config/culler_service_example.py
# registers them; only its command is pointed at this test's fake Prometheus
exec(compile(EXAMPLE.read_text(), str(EXAMPLE), "exec"))
svc = next(s for s in c.JupyterHub.services if s["name"] == "gpu-culler")
svc["command"] = svc["command"][:3] + [
    "--dry-run", "--cull-every=2", "--prometheus-url=" + PROM_URL,
    "--kind-timeout=mig=1", "--kind-timeout=full=1", "--log-level=DEBUG",
]
svc["url"] = "http://127.0.0.1:%d" % METRICS_PORT
svc["environment"] = {"PYTHONPATH": str(REPO)}
role = next(r for r in c.JupyterHub.load_roles if r["name"] == "gpu-culler")
# the in-process cullers of the tests get the same role under their own name
role["services"].append("gpu-culler-test")
c.JupyterHub.services.append({"name": "gpu-culler-test", "api_token": CULLER_TOKEN})
"""


class Env:
    hub: Hub
    prom: Telemetry
    faulty: FaultyProxy


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def env(tmp_path_factory):
    e = Env()
    e.prom = await asyncio.to_thread(Telemetry(tmp_path_factory.mktemp("telemetry")).start)
    e.prom.start_proxy()
    ports = free_ports(["metrics", "unreachable"])  # (two free_port() calls may return one port twice)
    metrics_port = ports["metrics"]
    extra = f"PROM_URL = {e.prom.url!r}\nMETRICS_PORT = {metrics_port}\nUNREACHABLE_PORT = {ports['unreachable']}\n" + SPAWNER
    e.hub = Hub(tmp_path_factory.mktemp("hub"), extra)
    e.faulty = FaultyProxy(f"http://127.0.0.1:{e.hub.hub_port}")
    try:  # whatever fails on the way, nothing started is left running
        await e.hub.start()
        # Prometheus scrapes the hub's /hub/metrics and the managed culler's /metrics too
        e.prom.prom.add_job(ScrapeJob("jupyterhub", [f"127.0.0.1:{e.hub.hub_port}"], metrics_path="/hub/metrics"))
        e.prom.prom.add_job(ScrapeJob("gpu-culler", [f"127.0.0.1:{metrics_port}"]))
        e.faulty.start()
        await e.hub.create_users(list(OFFERING))
        await join_gpu_users(e.hub, list(OFFERING))
        await asyncio.gather(*(ensure_running(e, u) for u in OFFERING))
        yield e
    finally:
        e.faulty.stop()
        await e.hub.stop()
        await asyncio.to_thread(e.prom.stop)


# -- helpers -------------------------------------------------------------------------
async def ensure_running(e: Env, user: str) -> dict:
    """The user's server, started again if an earlier test's cull stopped it. A stop the hub
    still has pending (a loaded machine takes a while to end a notebook process; JupyterHub
    answers a start then with 400 "pending stop") is waited out first."""
    name = NAMED.get(user, "")
    for _ in range(240):
        s = await e.hub.server(user, name)
        if s and s.get("ready"):
            return s
        if not (s and s.get("pending") == "stop"):
            break
        await asyncio.sleep(0.5)
    else:
        raise AssertionError(f"{user}'s server was still stopping after 120 s")
    opts = {"offering": OFFERING[user]} if OFFERING[user] else {}
    return await e.hub.spawn(user, opts, name=name)


def jupyter(e: Env, server: dict) -> Jupyter:
    return Jupyter(server["user_options"]["gpuspawner"]["url"], e.hub.admin_token)


async def ensure_kernel(e: Env, user: str, state: str) -> tuple[Jupyter, str]:
    """A kernel in `state` ("idle" or "busy") on the user's server."""
    j = jupyter(e, await ensure_running(e, user))
    for k in await j.kernels():
        if k["execution_state"] == state:
            return j, k["id"]
    kid = await j.start_kernel()
    if state == "busy":
        await j.execute(kid, "import time; time.sleep(900)", wait_idle=False)
    else:  # ran a cell, then nobody came back
        await j.execute(kid, "x = sum(range(10))", wait_idle=True)
    await j.wait_state(kid, state)
    return j, kid


MIG_T = template(H100_MIG, ENGINE, 0)  # H100 MIG, Hostname
A30_MIG_T = template(MIXED_LOWER, "DCGM_FI_DEV_FB_FREE", 1)  # A30 MIG, lowercase hostname
RTX_T = template(MIXED_LOWER, "DCGM_FI_DEV_FB_FREE", 0)  # whole GPU, no PROF metrics
A100_T = {k: v for k, v in template(SHARED_A100, FB_USED, 0).items() if k != "vgpu"}
SHARED_T = template(SHARED_A100, FB_USED, 1)  # shared, vgpu index label


def pod_of(user: str) -> str:
    return "jupyter-" + user + (f"--{NAMED[user]}" if user in NAMED else "")


def gpu(e: Env, user: str, tmpl: dict, *, engine=None, util=None, fb=None, exported=False):
    """The user's pod's GPU as dcgm-exporter reports it, from the next scrape on
    (``exported``: through a Service, so Prometheus renames its pod labels)."""
    labels = dict(tmpl, pod=pod_of(user), namespace="jhub", container="notebook")
    e.prom.put(pod_of(user), labels, exported=exported, engine=engine, util=util, fb_used=fb)


#: user -> (state, GPU memory MiB) as gpus_as_designed() reports them
DESIGNED = {
    "bea": ("idle", 9000.0),
    "gil": ("active", None),
    "sam": ("idle", 6000.0),
    "mia": ("idle", 5000.0),
    "fay": ("idle", 7000.0),
    "val": ("idle", 2000.0),
    "ned": ("idle", 1000.0),
}


async def gpus_seen(e: Env, expect: dict[str, tuple[str, float | None]]) -> None:
    """Wait until the real Prometheus answers the culler's query with ``expect`` (enough
    samples in the window, the latest memory values): a wait, not a timing assertion."""

    def ready(view) -> bool:
        return all((p := view.for_pod("jhub", pod_of(u))).state == state and p.memory_mib == mem for u, (state, mem) in expect.items())

    await asyncio.to_thread(e.prom.wait_view, GpuQuerySettings(), ready, f"the GPU view {expect}")


async def gpus_as_designed(e: Env) -> None:
    e.prom.mode = "ok"
    gpu(e, "bea", A100_T, engine=0.0, fb=9000.0)
    gpu(e, "gil", MIG_T, engine=0.6, exported=True)  # MIG: no FB rows (issue 512)
    gpu(e, "sam", SHARED_T, engine=0.0, fb=6000.0)
    gpu(e, "mia", A30_MIG_T, engine=0.0, fb=5000.0, exported=True)
    gpu(e, "fay", RTX_T, util=0.0, fb=7000.0)  # GPU_UTIL fallback
    gpu(e, "val", A100_T, engine=0.0, fb=2000.0)
    gpu(e, "ned", A100_T, engine=0.0, fb=1000.0)
    await gpus_seen(e, DESIGNED)


def culler(e: Env, *argv: str, hub_url: str | None = None) -> tuple[Culler, Records]:
    c, rec, _ = in_process_culler(hub_url or e.hub.api_url, e.prom.url, e.hub.culler_token, *argv, skew=SKEW)
    return c, rec


async def running(e: Env, user: str) -> bool:
    s = await e.hub.server(user, NAMED.get(user, ""))
    return bool(s and s.get("ready"))


def outcome(report, user):
    o = report.outcome(user, NAMED.get(user, ""))
    assert o is not None, f"{user} not in the cycle: {[x.server.label for x in report.outcomes]}"
    return o


# -- scenarios ------------------------------------------------------------------------------
async def test_dry_run_changes_nothing(env):
    await asyncio.gather(*(ensure_running(env, u) for u in OFFERING))
    _, busy = await ensure_kernel(env, "bea", "busy")
    sam, idle = await ensure_kernel(env, "sam", "idle")
    await gpus_as_designed(env)
    c, log = culler(env, "--dry-run")
    report = await c.cycle()
    # it decided as a real run would...
    for user in ("mia", "fay", "val"):
        assert outcome(report, user).decision.action == STOP
    assert outcome(report, "sam").decision.action == RECLAIM
    assert "DRY RUN: would stop server mia [mig a100-mig-1g.10gb]" in log.text()
    assert "DRY RUN: would shut down 1 idle kernel(s) of sam" in log.text()
    # ...and changed nothing
    for user in OFFERING:
        assert await running(env, user), user
    assert idle in {k["id"] for k in await sam.kernels()}
    assert c.metrics.value("gpuspawner_culler_server_stops_total", {"reason": "idle", "kind": "mig"}) == 0
    assert (
        c.metrics.value(
            "gpuspawner_culler_decisions_total",
            {"decision": "stop", "kind": "mig", "dry_run": "true"},
        )
        == 1
    )
    assert not any(r.result.stopped or r.result.kernels_shut_down for r in report.outcomes)


async def test_busy_kernel_with_hours_of_hub_inactivity_is_not_culled(env):
    j, kid = await ensure_kernel(env, "bea", "busy")
    await gpus_as_designed(env)
    c, log = culler(env)
    report = await c.cycle()
    o = outcome(report, "bea")
    assert o.decision.action == KEEP
    assert o.decision.inactive > timedelta(hours=2)  # hub and kernel activity are old...
    assert "1 of 1 kernels busy" in o.decision.summary()  # ...but the kernel is busy
    assert "GPU idle" in o.decision.summary()
    assert await running(env, "bea")
    assert {k["id"]: k["execution_state"] for k in await j.kernels()}[kid] == "busy"
    assert "keeping bea [full a100-80gb]" in log.text()


async def test_gpu_active_without_http_activity_is_not_culled(env):
    await ensure_running(env, "gil")
    await gpus_as_designed(env)
    c, _ = culler(env)
    report = await c.cycle()
    o = outcome(report, "gil")
    assert o.decision.action == KEEP
    assert "GR_ENGINE_ACTIVE max 0.60" in o.decision.summary()
    assert o.kernel_view is None  # the GPU alone decided: the server was not even asked
    assert await running(env, "gil")


async def test_idle_kernel_holding_memory_on_shared_gpu_is_shut_down_server_kept(env):
    j, idle = await ensure_kernel(env, "sam", "idle")
    await gpus_as_designed(env)
    c, log = culler(env)
    report = await c.cycle()
    o = outcome(report, "sam")
    assert o.decision.action == RECLAIM
    assert o.result.kernels_shut_down == [idle]
    assert idle not in {k["id"] for k in await j.kernels()}
    assert await running(env, "sam")
    assert c.metrics.value("gpuspawner_culler_kernel_shutdowns_total", {"reason": "idle", "kind": "shared"}) == 1
    assert "GPU memory held 6000 MiB" in o.decision.summary()
    # dcgm-exporter then sees the memory freed: counted as reclaimed in the next cycle
    gpu(env, "sam", SHARED_T, engine=0.0, fb=400.0)
    await gpus_seen(env, {"sam": ("idle", 400.0)})
    report = await c.cycle()
    assert report.reclaimed_mib == {"sam": 5600.0}
    assert (
        c.metrics.value(
            "gpuspawner_culler_gpu_memory_reclaimed_mib_total",
            {"action": "kernel_shutdown", "kind": "shared"},
        )
        == 5600.0
    )
    assert "6000 MiB -> 400 MiB after kernel shutdown" in log.text()


async def test_idle_mig_whole_gpu_and_vgpu_servers_past_timeout_are_stopped(env):
    await asyncio.gather(*(ensure_running(env, u) for u in ("mia", "fay", "val", "cal")))
    await gpus_as_designed(env)
    c, log = culler(env)
    before = c.metrics.value("gpuspawner_culler_requests_total", {"target": "prometheus"})
    report = await c.cycle()
    # ONE Prometheus request for the whole cycle
    assert c.metrics.value("gpuspawner_culler_requests_total", {"target": "prometheus"}) - before == 1
    for user, kind in (("mia", "mig"), ("fay", "full"), ("val", "vgpu")):
        o = outcome(report, user)
        assert o.decision.action == STOP, o.decision.summary()
        assert o.result.stopped in ("stopped", "stopping")
        assert c.metrics.value("gpuspawner_culler_server_stops_total", {"reason": "idle", "kind": kind}) == 1
    for user in ("mia", "fay", "val"):
        await env.hub.wait_stopped(user, NAMED.get(user, ""))
    assert "GPU_UTIL max 0%" in outcome(report, "fay").decision.summary()
    assert (
        c.metrics.value(
            "gpuspawner_culler_gpu_memory_reclaimed_mib_total",
            {"action": "server_stop", "kind": "mig"},
        )
        == 5000.0
    )
    # a plain server within its 8 h is left alone
    assert outcome(report, "cal").decision.action == KEEP and await running(env, "cal")
    assert "stop server val/train [vgpu a10-24q] (idle)" in log.text()


async def test_unreachable_kernel_api_holds_back(env):
    await ensure_running(env, "ned")
    await gpus_as_designed(env)
    c, log = culler(env)
    report = await c.cycle()
    o = outcome(report, "ned")
    assert o.decision.action == HELD_BACK
    assert "kernel view unavailable" in o.decision.summary()
    assert c.metrics.value("gpuspawner_culler_errors_total", {"source": "server"}) >= 1
    assert await running(env, "ned")


async def test_prometheus_down_no_gpu_cull_then_resumes(env):
    await asyncio.gather(*(ensure_running(env, u) for u in ("mia", "cal")))
    sam, idle = await ensure_kernel(env, "sam", "idle")
    await gpus_as_designed(env)
    env.prom.mode = "fail"  # Prometheus answers 503
    c, log = culler(env, "--timeout=3600")  # plain servers: 1 h
    report = await c.cycle()
    assert not report.gpu_view.available
    o = outcome(report, "mia")
    assert o.decision.action == HELD_BACK
    assert "no GPU-based cull without a known-idle GPU view" in o.decision.summary()
    assert "GPU view unavailable" in log.text()
    assert await running(env, "mia")
    assert idle in {k["id"] for k in await sam.kernels()}  # no memory view, no shutdown
    # hub signals alone still stop the plain server
    assert outcome(report, "cal").decision.action == STOP
    await env.hub.wait_stopped("cal")
    assert c.metrics.value("gpuspawner_culler_gpu_view_up") == 0
    assert c.metrics.value("gpuspawner_culler_errors_total", {"source": "prometheus"}) == 1
    # Prometheus answers again: decisions resume
    env.prom.mode = "ok"
    report = await c.cycle()
    assert outcome(report, "mia").decision.action == STOP
    await env.hub.wait_stopped("mia")
    assert c.metrics.value("gpuspawner_culler_gpu_view_up") == 1


async def test_prometheus_process_gone_no_gpu_cull_then_it_comes_back(env):
    """The real Prometheus stopped (connection refused, not a 503), then started again on
    the same data: no GPU-based decision meanwhile, and the culler says why."""
    await ensure_running(env, "mia")
    await gpus_as_designed(env)
    c, log = culler(env, "--GpuCuller.retries=1")
    await asyncio.to_thread(env.prom.prom.stop)
    try:
        report = await c.cycle()
    finally:
        await asyncio.to_thread(env.prom.prom.start)
    assert not report.gpu_view.available
    o = outcome(report, "mia")
    assert o.decision.action == HELD_BACK
    assert "no GPU-based cull without a known-idle GPU view" in o.decision.summary()
    assert "GPU view unavailable" in log.text() and await running(env, "mia")
    await gpus_as_designed(env)  # its data survived the restart
    report = await c.cycle()
    assert report.gpu_view.available and outcome(report, "mia").decision.action == STOP
    await env.hub.wait_stopped("mia")


async def test_prometheus_slow_is_timed_out(env):
    await ensure_running(env, "mia")
    await gpus_as_designed(env)
    env.prom.mode, env.prom.faulty.slow_s = "slow", 5
    try:
        c, _ = culler(env, "--GpuCuller.prometheus_request_timeout=0.3", "--GpuCuller.retries=2")
        report = await c.cycle()
    finally:
        env.prom.mode = "ok"
    assert not report.gpu_view.available and "599" in report.gpu_view.error
    assert outcome(report, "mia").decision.action == HELD_BACK


async def test_hub_failing_slow_or_flaky_never_crashes_and_resumes(env):
    await ensure_running(env, "mia")
    await gpus_as_designed(env)
    c, log = culler(env, "--GpuCuller.hub_request_timeout=0.5", hub_url=env.faulty.url + "/hub/api")
    for mode in ("fail", "slow"):
        env.faulty.mode, env.faulty.slow_s = mode, 3
        report = await c.cycle()
        assert report.hub_error and not report.outcomes, mode
    assert c.metrics.value("gpuspawner_culler_errors_total", {"source": "hub"}) == 2
    assert "listing the hub's servers failed" in log.text()
    assert await running(env, "mia")
    # one failed request, then the hub answers: retried with backoff within the cycle
    env.faulty.mode, env.faulty.flaky_left = "flaky", 1
    try:
        report = await c.cycle()
    finally:
        env.faulty.mode = "ok"
    assert report.hub_error is None
    assert outcome(report, "mia").decision.action == STOP
    await env.hub.wait_stopped("mia")


async def test_managed_service_from_the_example_runs_dry_and_serves_metrics(env):
    """The hub itself runs `python -m gpuspawner.culler` as the example registers it
    (with --dry-run and 1 s timeouts for mig and full): it decides, stops nothing,
    and serves its metrics through the proxy."""
    await asyncio.gather(*(ensure_running(env, u) for u in ("mia", "fay")))
    await gpus_as_designed(env)
    client = AsyncHTTPClient()
    url = env.hub.public_url + "/services/gpu-culler/metrics"
    text = ""
    for _ in range(120):
        try:
            text = (await client.fetch(url, request_timeout=5)).body.decode()
        except Exception:
            text = ""
        if 'decision="stop",dry_run="true",kind="mig"' in text:
            break
        await asyncio.sleep(0.5)
    assert 'decision="stop",dry_run="true",kind="mig"' in text, text[-2000:]
    # nothing was done: no stop and no kernel shutdown was ever counted (the series are
    # there from the start, at 0, so that Prometheus' increase() sees a first one)
    counted = [
        line
        for line in text.splitlines()
        if line.startswith(("gpuspawner_culler_server_stops_total{", "gpuspawner_culler_kernel_shutdowns_total{"))
    ]
    assert counted and all(line.endswith(" 0.0") for line in counted), counted
    assert "gpuspawner_culler_cycle_duration_seconds_count" in text
    assert await running(env, "mia") and await running(env, "fay")
    # the real Prometheus scrapes the managed culler's metrics and the hub's /hub/metrics
    prom = env.prom.prom
    seen = await asyncio.to_thread(
        prom.wait_for,
        lambda: prom.query('gpuspawner_culler_decisions_total{decision="stop",dry_run="true",kind="mig",job="gpu-culler"} > 0'),
        "the culler's dry-run stop in Prometheus",
    )
    assert seen and {r["metric"]["job"]: r["value"][1] for r in prom.query('up{job=~"gpu-culler|jupyterhub"}')} == {
        "gpu-culler": "1",
        "jupyterhub": "1",
    }
    log = env.hub.log_text()
    assert "DRY RUN: would stop server mia" in log
    # its token is the hub-managed service's, and it never stopped anything (it only
    # revokes the per-server tokens it minted to read kernels)
    assert "(gpu-culler@" in log
    deletes = [line for line in log.splitlines() if "DELETE" in line and "(gpu-culler@" in line]
    assert all(re.search(r"DELETE /hub/api/users/[^/ ]+/tokens/", line) for line in deletes)


async def test_users_are_only_deleted_when_configured(env):
    # no server; her last activity (reported as a server would) "hours" old to the culler
    await env.hub.create_users(["uma"])
    await env.hub.api(
        "POST",
        "/users/uma/activity",
        {"last_activity": utcnow().isoformat().replace("+00:00", "Z")},
    )
    # a selector no series matches: no GPU view, so GPU servers are held back whatever ran before
    nothing = '--prometheus-selector=namespace="nowhere"'
    c, log = culler(env, nothing)
    await c.cycle()
    assert "uma" not in log.text()
    c, log = culler(env, "--cull-users=true", "--dry-run", "--timeout=3600", nothing)
    report = await c.cycle()
    assert "DRY RUN: would delete user uma" in log.text() and not report.users_deleted
    # the example's role has no admin:users: a real deletion is refused, logged, survived
    c, log = culler(env, "--cull-users=true", "--timeout=3600", "--GpuCuller.stop_kinds=full", nothing)
    report = await c.cycle()
    assert "could not delete user uma" in log.text() and "403" in log.text()
    assert c.metrics.value("gpuspawner_culler_errors_total", {"source": "hub"}) >= 1
    assert (await env.hub.user("uma"))["name"] == "uma"


async def test_prometheus_client_one_request_retries_and_errors(env):
    """The culler's Prometheus client against the real server: one request per view,
    retries when it answers 503, and Prometheus' own parse error for a bad selector."""
    await gpus_as_designed(env)
    m = CullerMetrics()
    retry = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05)
    transport = Transport("prometheus", concurrency=4, retry=retry, metrics=m, log=logging.getLogger("test.prom"))
    # a proxy of its own in front of the module's Prometheus: it counts only this test's requests
    # (env.prom's proxy also serves the module's other clients)
    own = FaultyProxy(env.prom.prom.url)
    own.start()
    try:
        prom = PrometheusClient(own.url, GpuQuerySettings(), transport)
        v = await prom.gpu_view()
        assert v.available and v.for_pod("jhub", pod_of("mia")).idle
        assert len(own.requests) == 1
        assert m.value("gpuspawner_culler_requests_total", {"target": "prometheus"}) == 1
        own.mode = "fail"
        v = await prom.gpu_view()
        assert not v.available and "503" in v.error and len(own.requests) == 4
    finally:
        own.stop()
    bad = PrometheusClient(env.prom.url, GpuQuerySettings(selector='pod=~"x'), transport)
    v = await bad.gpu_view()
    assert not v.available and "400" in v.error and "parse error" in v.error  # Prometheus says why
