#!/usr/bin/env python3
"""Benchmark: one culling cycle over N servers on a REAL JupyterHub, gpuspawner's
GPU-aware culler next to plain jupyterhub-idle-culler, on the same hub.

    python bench/culler_bench.py --servers 3000     # the target size (issue 30)
    python bench/culler_bench.py --servers 200      # quick

The servers come from a lightweight spawner whose "server" is a stand-in: ONE
tornado process (started by this script) answering the Jupyter Server API
(/api/kernels, /api/status) for every /user/<name>/ prefix. Every server is a
shared-GPU notebook whose pod holds GPU memory and whose GPU is idle, so the
GPU-aware culler must ask every server's kernels each cycle (its worst case);
no kernel is idle long enough to act on, so neither culler stops anything.
GPU telemetry: the real Prometheus scraping a dcgm-exporter stand-in that reports
every pod with the label set of a real dcgm-exporter scrape (gpuspawner/devcluster).

Printed: wall time and hub API calls per cycle (read from the hub's own
/hub/metrics), side by side as a ratio (target <= 1.3x), the other requests the
GPU-aware culler makes (per-server tokens minted through the hub included: a
new culler mints one per server whose kernels it reads), and the reclaim latency -- from the moment a notebook's
kernel goes idle to its GPU memory being freed -- against the physical floor,
kernel timeout + one cycle. No assertion on time: read the numbers.

Where the time goes: the hub's CPU and the culler's (this process's) per cycle, the
hub's time per request kind (its own request_duration_seconds), when a culler's
cycle got its GPU view and its last page of users, and with ``--profile FILE`` a
cProfile of one more first cycle. The servers' users are in the group the culler's
``tokens`` scope is filtered to (``gpu-users``), as in a real deployment.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tornado import web  # noqa: E402

from bench.procstat import cpu_seconds  # noqa: E402

# ---------------------------------------------------------------------------
# the stand-in single-user servers (run in a child process: --stand-in PORT)
# ---------------------------------------------------------------------------


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


class StandIn:
    def __init__(self) -> None:
        self.idle_since: dict[str, float] = {}  # user -> when its kernel went idle
        self.deleted: dict[str, float] = {}  # user -> when its kernel was shut down
        self.untracked = 0  # kernel API requests missing no_track_activity
        self.requests = 0
        self.credentials: set[str] = set()  # every Authorization header the culler sent


class _Base(web.RequestHandler):
    def initialize(self, s: StandIn) -> None:
        self.s = s

    def check_xsrf_cookie(self) -> None:
        pass


class KernelsAPI(_Base):
    def _kernels(self, user: str) -> list[dict]:
        if user in self.s.deleted:
            return []
        since = self.s.idle_since.get(user)
        last = since if since is not None else time.time() - 1  # fresh: nothing to do
        return [
            {
                "id": f"k-{user}",
                "name": "python3",
                "last_activity": _iso(last),
                "execution_state": "idle",
                "connections": 1,
            }
        ]

    def _count(self) -> None:
        self.s.requests += 1
        self.s.credentials.add(self.request.headers.get("Authorization", ""))
        if self.get_argument("no_track_activity", None) is None:
            self.s.untracked += 1

    def get(self, user: str, what: str) -> None:
        if what != "api":  # the hub's own readiness check is not the culler's
            self._count()
        if what == "kernels":
            self.finish(json.dumps(self._kernels(user)))
        elif what == "status":
            ks = self._kernels(user)
            last = max((k["last_activity"] for k in ks), default=_iso(time.time() - 3600))
            self.finish(
                {
                    "started": _iso(time.time() - 3600),
                    "last_activity": last,
                    "connections": len(ks),
                    "kernels": len(ks),
                }
            )
        else:
            self.finish({"version": "2.14.0"})

    def delete(self, user: str, what: str) -> None:
        self._count()
        self.s.deleted.setdefault(user, time.time())
        self.set_status(204)
        self.finish()


class Control(_Base):
    def post(self, action: str, user: str) -> None:
        if action == "idle":
            self.s.idle_since[user] = time.time()
            self.s.deleted.pop(user, None)
            self.finish({"t0": self.s.idle_since[user]})
        else:
            raise web.HTTPError(404)

    def get(self, action: str, user: str = "") -> None:
        self.finish(
            {
                "deleted": self.s.deleted,
                "requests": self.s.requests,
                "untracked": self.s.untracked,
                "credentials": sorted(self.s.credentials),
            }
        )


def run_stand_in(port: int) -> None:
    s = StandIn()
    app = web.Application(
        [
            (r"/user/([^/]+)/api/(kernels|status)(?:/[^/]+)?", KernelsAPI, {"s": s}),
            (r"/user/([^/]+)/(api)/?", KernelsAPI, {"s": s}),
            (r"/_control/(idle)/([^/]+)", Control, {"s": s}),
            (r"/_control/(state)", Control, {"s": s}),
        ],
        log_function=lambda h: None,
    )
    app.listen(port, "127.0.0.1")
    asyncio.get_event_loop().run_forever()


# ---------------------------------------------------------------------------
# the bench
# ---------------------------------------------------------------------------
SPAWNER = """
from jupyterhub.spawner import Spawner

class StandInSpawner(Spawner):
    '''No process: the server is the stand-in, at /user/<name>/.'''
    async def start(self):
        opts = dict(self.user_options)
        opts["gpuspawner"] = {
            "offering": "t4-shared", "kind": "shared",
            "resources": {"nvidia.com/gpu.shared": "1"},
            "pod": "jupyter-" + self.user.name, "namespace": "jhub",
            "url": f"http://127.0.0.1:{STANDIN_PORT}{self.server.base_url}",
        }
        self.user_options = opts
        return ("127.0.0.1", STANDIN_PORT)
    async def poll(self):
        return None
    async def stop(self, now=False):
        pass

c.JupyterHub.spawner_class = StandInSpawner
c.JupyterHub.services.append({"name": "bench-culler", "api_token": CULLER_TOKEN})
c.JupyterHub.load_roles.append(
    {"name": "bench-culler", "scopes": SCOPES, "services": ["bench-culler"]})
c.JupyterHub.log_level = "WARN"
"""


def hub_request_count(text: str) -> float:
    """All requests the hub's handlers served, but the metrics scrape itself."""
    from prometheus_client.parser import text_string_to_metric_families

    n = 0.0
    for fam in text_string_to_metric_families(text):
        if fam.name != "jupyterhub_request_duration_seconds":
            continue
        for s in fam.samples:
            if s.name.endswith("_count") and "Metrics" not in s.labels.get("handler", ""):
                n += s.value
    return n


def hub_request_breakdown(text: str) -> dict[str, tuple[float, float]]:
    """Per "METHOD handler": (requests, seconds the hub spent in them), but the metrics scrape."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[float]] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name != "jupyterhub_request_duration_seconds":
            continue
        for s in fam.samples:
            handler = s.labels.get("handler", "")
            if "Metrics" in handler or not s.name.endswith(("_count", "_sum")):
                continue
            row = out.setdefault(f"{s.labels.get('method', '')} {handler}", [0.0, 0.0])
            row[0 if s.name.endswith("_count") else 1] += s.value
    return {k: (v[0], v[1]) for k, v in out.items()}


#: the hub's handler of POST /users/{name}/tokens (a token mint)
TOKENS_HANDLER = "jupyterhub.apihandlers.users.UserTokenListAPIHandler"


def timed_phases(culler, t0: float) -> dict:
    """Seconds after ``t0`` at which this culler's next cycle got its GPU view, its last page of
    users, and its servers' outcomes (instance attributes wrapped: the bench's, not the culler's)."""
    marks: dict[str, float] = {}
    gpu_view, iter_users, user = culler.prometheus.gpu_view, culler.hub.iter_users, culler._user

    async def timed_gpu_view():
        view = await gpu_view()
        marks["GPU view"] = time.perf_counter() - t0
        return view

    async def timed_iter_users(state="ready"):
        async for u in iter_users(state):
            yield u
        marks["last page"] = time.perf_counter() - t0

    async def timed_user(*a, **kw):
        await user(*a, **kw)
        marks["servers done"] = time.perf_counter() - t0

    culler.prometheus.gpu_view, culler.hub.iter_users, culler._user = timed_gpu_view, timed_iter_users, timed_user
    marks["_restore"] = lambda: [delattr(o, a) for o, a in ((culler.prometheus, "gpu_view"), (culler.hub, "iter_users"), (culler, "_user"))]
    return marks


async def main(args: argparse.Namespace) -> None:
    from jupyterhub_idle_culler import cull_idle
    from tornado.httpclient import AsyncHTTPClient

    from gpuspawner.culler import REQUIRED_SCOPES, GpuCuller
    from gpuspawner.culler.gpu_query import GpuQuerySettings
    from gpuspawner.devcluster.fakedcgm import reference_labels
    from gpuspawner.devcluster.hub import Hub
    from gpuspawner.devcluster.ports import free_port
    from gpuspawner.names.vocabulary import GPU_USERS_GROUP

    logging.basicConfig(level=logging.WARNING)
    n = args.servers
    stand_port = free_port()
    stand = subprocess.Popen([sys.executable, __file__, "--stand-in", str(stand_port)])
    tmp = Path(tempfile.mkdtemp(prefix="culler-bench-"))
    extra = f"STANDIN_PORT = {stand_port}\nSCOPES = {list(REQUIRED_SCOPES)!r}\n" + SPAWNER
    hub = Hub(tmp, extra, debug=False)
    client = AsyncHTTPClient(force_instance=True)
    telemetry = None
    try:
        await hub.start()
        users = [f"user{i:05d}" for i in range(n)]
        await hub.create_users(users)
        # the culler's role may mint per-server tokens only for this group's members
        # (TOKENS_SCOPE, docs/culler.md, Scopes), as a real deployment's GPU users are
        await hub.api("POST", f"/groups/{GPU_USERS_GROUP}")
        for i in range(0, n, 500):
            await hub.api("POST", f"/groups/{GPU_USERS_GROUP}/users", {"users": users[i : i + 500]})
        t = time.monotonic()
        sem = asyncio.Semaphore(16)

        async def spawn(u: str) -> None:
            async with sem:
                await hub.api("POST", f"/users/{u}/server", {"offering": "t4-shared"})

        await asyncio.gather(*(spawn(u) for u in users))
        while True:
            ready = [x async for x in _ready_users(hub)]
            if len(ready) >= n:
                break
            await asyncio.sleep(1)
        print(
            f"hub with {n} running servers ready in {time.monotonic() - t:.0f}s (logs: {hub.log_path})",
            flush=True,
        )

        # every pod holds GPU memory on an idle shared GPU
        prom = telemetry = Telemetry(tmp / "telemetry")
        await asyncio.to_thread(telemetry.start)
        mig = ("GPU_I_PROFILE", "GPU_I_ID")  # a whole (shared) GPU: no MIG labels
        base = {k: v for k, v in reference_labels("DCGM_FI_PROF_GR_ENGINE_ACTIVE").items() if k not in mig}
        for i, u in enumerate(users):
            labels = dict(
                base,
                pod=f"jupyter-{u}",
                namespace="jhub",
                gpu=str(i % 8),
                UUID=f"GPU-{i // 8:08d}",
                Hostname=f"gpu-node-{i // 64:03d}",
            )
            telemetry.put(u, labels, engine=0.0, fb_used=6000.0)
        await asyncio.to_thread(
            telemetry.wait_view,
            GpuQuerySettings(),
            lambda v: len([p for p in v.pods.values() if p.idle]) >= n,
            f"{n} idle pods in Prometheus",
            300,
        )

        async def hub_count() -> float:
            r = await client.fetch(hub.public_url + "/hub/metrics")
            return hub_request_count(r.body.decode())

        async def hub_breakdown() -> dict[str, tuple[float, float]]:
            r = await client.fetch(hub.public_url + "/hub/metrics")
            return hub_request_breakdown(r.body.decode())

        assert hub.proc is not None
        hub_pid = hub.proc.pid

        mint_budget = [f"--GpuCuller.token_mints_per_cycle={args.token_mints_per_cycle}"] if args.token_mints_per_cycle >= 0 else []

        def make_ours(*extra: str):
            app = GpuCuller()
            app.initialize(
                [
                    f"--url={hub.api_url}",
                    f"--prometheus-url={prom.url}",
                    f"--GpuCuller.api_token={hub.culler_token}",
                    f"--api-page-size={args.page_size}",
                    "--log-level=WARN",
                    f"--GpuCuller.action_log_path={tmp / 'actions.jsonl'}",  # not in the checkout
                    *mint_budget,
                    *extra,
                ]
            )
            return app.make_culler()

        upstream_log = logging.getLogger("idle-culler")
        upstream_log.setLevel(logging.WARNING)

        async def upstream_cycle():
            await cull_idle(
                url=hub.api_url,
                api_token=hub.culler_token,
                inactive_limit=8 * 3600,
                logger=upstream_log,
                api_page_size=args.page_size,
            )

        def reqs(c, target: str) -> float:
            return c.metrics.value("gpuspawner_culler_requests_total", {"target": target})

        def tokens_minted(c) -> float:
            return c.metrics.value("gpuspawner_culler_server_tokens_total", {"action": "minted"})

        steady = make_ours()
        await upstream_cycle()  # warm-up: the hub's caches, the stand-in
        # the steady culler has seen every server once: it mints per-server tokens
        # token_mints_per_cycle at a time, so it takes a few cycles to catch up
        catch_up: list[float] = []
        while True:
            m0 = tokens_minted(steady)
            catch_up.append((await steady.cycle()).duration_s)
            await steady.tokens_minted()  # (minted after the cycle)
            if tokens_minted(steady) == m0:
                break
        runs = ("upstream", "cold", "steady")
        times: dict[str, list[float]] = {k: [] for k in runs}
        calls: dict[str, list[float]] = {k: [] for k in runs}
        server_calls: dict[str, list[float]] = {k: [] for k in runs}
        prom_calls: dict[str, list[float]] = {k: [] for k in runs}
        minted: dict[str, list[float]] = {k: [] for k in runs}
        hub_cpu: dict[str, list[float]] = {k: [] for k in runs}
        phases: dict[str, list[dict[str, float]]] = {k: [] for k in runs}
        own_cpu: dict[str, list[float]] = {k: [] for k in runs}
        per_handler: dict[str, dict[str, list[tuple[float, float]]]] = {k: {} for k in runs}
        after_cycle: list[tuple[float, float]] = []  # the cold culler's mints after its cycle: (count, seconds)
        for _ in range(args.cycles):
            for name in runs:
                c = None if name == "upstream" else (make_ours() if name == "cold" else steady)
                s0 = reqs(c, "server") if c else 0
                p0 = reqs(c, "prometheus") if c else 0
                m0 = tokens_minted(c) if c else 0
                b0 = await hub_breakdown()
                c0 = sum(v[0] for v in b0.values())
                h0, p0_cpu = cpu_seconds(hub_pid), time.process_time()
                t0 = time.perf_counter()
                if c is not None:
                    marks = timed_phases(c, t0)
                result = await (upstream_cycle() if c is None else c.cycle())
                times[name].append(time.perf_counter() - t0)
                if c is not None:
                    marks.pop("_restore")()
                    phases[name].append(marks)
                hub_cpu[name].append(cpu_seconds(hub_pid) - h0)
                own_cpu[name].append(time.process_time() - p0_cpu)
                m_end = tokens_minted(c) if c else 0
                b1 = await hub_breakdown()
                # the mints a culler leaves for after its cycle begin as soon as it returns, so
                # some are made while the hub's metrics are read: they are not the cycle's
                late = (tokens_minted(c) - m_end) if c else 0
                calls[name].append(sum(v[0] for v in b1.values()) - c0 - late)
                for k, (cnt, sec) in b1.items():
                    d = (cnt - b0.get(k, (0, 0))[0], sec - b0.get(k, (0, 0))[1])
                    if late and k == f"POST {TOKENS_HANDLER}" and d[0]:
                        d = (d[0] - late, d[1] * (d[0] - late) / d[0])
                    if d[0]:
                        per_handler[name].setdefault(k, []).append(d)
                if c is not None:
                    server_calls[name].append(reqs(c, "server") - s0)
                    prom_calls[name].append(reqs(c, "prometheus") - p0)
                    minted[name].append(m_end - m0)
                    counts = result.counts()
                    assert counts.get("stop", 0) == 0 and counts.get("reclaim", 0) == 0, counts
                    assert len(result.outcomes) == n, len(result.outcomes)
                if name == "cold":  # outside the measured cycle: the mints it left for after it, then revoke
                    t1 = time.perf_counter()
                    m1 = m_end  # (the late ones above included)
                    await c.tokens_minted()
                    after_cycle.append((tokens_minted(c) - m1, time.perf_counter() - t1))
                    await c.close()
        st = json.loads((await client.fetch(f"http://127.0.0.1:{stand_port}/_control/state")).body)

        med = {k: statistics.median(v) for k, v in times.items()}
        cal = {k: statistics.median(v) for k, v in calls.items()}
        up = med["upstream"]
        print()
        print(
            f"servers: {n}   cycles: {args.cycles} each (median)   page size: "
            f"{args.page_size or 'hub default'}   machine: {os.cpu_count()} cores"
        )
        print(f"{'':26}{'idle-culler':>12}{'gpuspawner':>12}{'ratio':>8}{'gpuspawner':>12}{'ratio':>8}")
        print(f"{'':26}{'':>12}{'1st cycle':>12}{'':>8}{'steady':>12}{'':>8}")
        print(
            f"{'wall time / cycle (s)':26}{up:12.3f}{med['cold']:12.3f}{med['cold'] / up:7.2f}x"
            f"{med['steady']:12.3f}{med['steady'] / up:7.2f}x"
        )
        print(
            f"{'hub API calls / cycle':26}{cal['upstream']:12.0f}{cal['cold']:12.0f}"
            f"{cal['cold'] / cal['upstream']:7.2f}x"
            f"{cal['steady']:12.0f}{cal['steady'] / cal['upstream']:7.2f}x"
        )
        print(
            f"{'  of which token mints':26}{'-':>12}"
            f"{statistics.median(minted['cold']):12.0f}"
            f"{'':8}{statistics.median(minted['steady']):12.0f}"
        )
        print(
            f"{'  then, after the cycle':26}{'-':>12}"
            f"{statistics.median(a for a, _ in after_cycle):12.0f}"
            f"  token mints, one at a time, in {statistics.median(b for _, b in after_cycle):.2f}s"
            " (the hub serves users meanwhile; the next cycle reads those servers)"
        )
        print(
            f"{'server API calls / cycle':26}{'-':>12}"
            f"{statistics.median(server_calls['cold']):12.0f}"
            f"{'':8}{statistics.median(server_calls['steady']):12.0f}"
        )
        print(
            f"{'Prometheus queries / cycle':26}{'-':>12}"
            f"{statistics.median(prom_calls['cold']):12.0f}"
            f"{'':8}{statistics.median(prom_calls['steady']):12.0f}"
        )
        print(
            "(1st cycle: a new culler asks the kernels of every server it has a token for; steady:"
            " it asks a server again only once an action could be due)"
        )
        print(
            f"a new culler had read every server's kernels after {len(catch_up)} cycles"
            f" ({sum(catch_up):.1f}s of cycles in all, one token mint per server,"
            f" token_mints_per_cycle={steady.tokens.mints_per_cycle or 'unlimited'})"
        )
        print(f"kernel API requests without no_track_activity: {st['untracked']} of {st['requests']}")
        own = sum(hub.culler_token in cred for cred in st["credentials"])
        print(
            f"credentials sent to the servers: {len(st['credentials'])} distinct per-server"
            f" tokens; the culler's own token: {'SENT' if own else 'never'}"
        )
        print(
            f"{'hub CPU / cycle (s)':26}{statistics.median(hub_cpu['upstream']):12.3f}"
            f"{statistics.median(hub_cpu['cold']):12.3f}{'':8}{statistics.median(hub_cpu['steady']):12.3f}"
        )
        print(
            f"{'culler CPU / cycle (s)':26}{statistics.median(own_cpu['upstream']):12.3f}"
            f"{statistics.median(own_cpu['cold']):12.3f}{'':8}{statistics.median(own_cpu['steady']):12.3f}"
        )
        print("hub requests per cycle by handler (median count, median seconds the hub spent in them):")
        for name in runs:
            for k, rows in sorted(per_handler[name].items()):
                print(f"  {name:9}{k:48}{statistics.median(r[0] for r in rows):7.0f}{statistics.median(r[1] for r in rows):9.3f}s")
        for name in ("cold", "steady"):
            print(
                f"  {name:9}phases, s after the cycle began (median): "
                + ", ".join(
                    f"{k} {statistics.median(m.get(k, float('nan')) for m in phases[name]):.2f}"
                    for k in ("GPU view", "last page", "servers done")
                )
            )
        if args.profile:
            import cProfile
            import pstats

            c = make_ours()
            prof = cProfile.Profile()
            prof.enable()
            await c.cycle()
            prof.disable()
            await c.tokens_minted()
            await c.close()
            prof.dump_stats(args.profile)
            print(f"profile of one more 1st cycle (not measured above): {args.profile}")
            pstats.Stats(prof).sort_stats("cumulative").print_stats(40)
        print("all cycles (s): " + ", ".join(f"{k} {[round(x, 3) for x in times[k]]}" for k in runs))

        # ---- reclaim latency -----------------------------------------------
        kt, ce = args.kernel_timeout, args.cull_every
        app2 = GpuCuller()
        app2.initialize(
            [
                f"--url={hub.api_url}",
                f"--prometheus-url={prom.url}",
                f"--GpuCuller.api_token={hub.culler_token}",
                f"--kernel-timeout={kt}",
                f"--cull-every={ce}",
                f"--api-page-size={args.page_size}",
                "--log-level=WARN",
                f"--GpuCuller.action_log_path={tmp / 'actions.jsonl'}",  # not in the checkout
                *mint_budget,
            ]
        )
        reclaimer = app2.make_culler()
        cycle_times: list[float] = []

        async def loop() -> None:  # what GpuCuller.run does, minus the metrics server
            while True:
                t0 = time.monotonic()
                r = await reclaimer.cycle()
                cycle_times.append(r.duration_s)
                await asyncio.sleep(max(0.0, ce - (time.monotonic() - t0)))

        task = asyncio.ensure_future(loop())
        probes = users[: args.probes]
        t0s: dict[str, float] = {}
        for u in probes:
            await asyncio.sleep(ce / max(1, len(probes)) + 0.05)  # spread over a cycle
            r = await client.fetch(f"http://127.0.0.1:{stand_port}/_control/idle/{u}", method="POST", body=b"")
            t0s[u] = json.loads(r.body)["t0"]
        deadline = time.monotonic() + kt + 6 * ce + 60
        while time.monotonic() < deadline:
            st = json.loads((await client.fetch(f"http://127.0.0.1:{stand_port}/_control/state")).body)
            if all(u in st["deleted"] for u in probes):
                break
            await asyncio.sleep(0.2)
        task.cancel()
        await reclaimer.close()
        await steady.close()
        lat = [st["deleted"][u] - t0s[u] for u in probes if u in st["deleted"]]
        floor = kt + ce
        print()
        print(f"reclaim latency, idle kernel -> shut down (memory freed), {len(lat)}/{len(probes)} probes:")
        if lat:
            print(
                f"  mean {statistics.mean(lat):.2f}s  max {max(lat):.2f}s   "
                f"floor: kernel timeout {kt}s + one cycle {ce}s = {floor:.2f}s "
                f"(mean/floor {statistics.mean(lat) / floor:.2f}, "
                f"max/floor {max(lat) / floor:.2f}); "
                f"cycle wall time here {statistics.median(cycle_times):.2f}s"
            )
        print("  idle-culler: n/a (it has no kernel view: it can only stop the whole server)")
        if args.prometheus_outage:
            await prometheus_outage(make_ours, prom, n, args.prometheus_outage)
    finally:
        client.close()
        await hub.stop()
        if telemetry is not None:
            await asyncio.to_thread(telemetry.stop)
        stand.terminate()
        stand.wait()


async def prometheus_outage(make_culler, telemetry: Telemetry, n: int, seconds: float) -> None:
    """Prometheus unreachable (its process stopped) for ``seconds`` while a culler runs cycle
    after cycle over every server: it may decide only on what it has, so no GPU server is stopped
    or has a kernel shut down, each is held back saying the GPU view is unavailable; then
    Prometheus comes back on its own data and the next cycle sees the GPUs again."""
    culler = make_culler()
    await culler.cycle()  # a culler that has run with Prometheus up
    await asyncio.to_thread(telemetry.prom.stop)
    started = time.monotonic()
    cycles, acted, held, judged = 0, 0, 0, 0
    try:
        while time.monotonic() - started < seconds:
            report = await culler.cycle()
            cycles += 1
            if report.gpu_view.available:
                judged += 1
            counts = report.counts()
            acted += counts.get("stop", 0) + counts.get("reclaim", 0)
            held += sum(
                1 for o in report.outcomes if "GPU view unavailable" in o.decision.summary() or "no GPU-based" in o.decision.summary()
            )
    finally:
        await asyncio.to_thread(telemetry.prom.start)
    back = time.monotonic()
    while True:
        report = await culler.cycle()
        if report.gpu_view.available or time.monotonic() - back > 120:
            break
        await asyncio.sleep(1)
    await culler.tokens_minted()
    await culler.close()
    print()
    print(f"Prometheus unreachable for {seconds:.0f}s, {n} servers: {cycles} cycles ran meanwhile")
    print(
        f"  cycles that claimed a GPU view: {judged}; stops and kernel shutdowns: {acted}; "
        f"server decisions held back for want of the GPU view: {held} of {cycles * n}"
    )
    print(
        f"  Prometheus back: the GPU view {'returned' if report.gpu_view.available else 'did NOT return'} "
        f"{time.monotonic() - back:.1f}s after it started again"
    )
    ok = judged == 0 and acted == 0 and report.gpu_view.available
    print(f"  decisions only on data the culler had: {'yes' if ok else 'NO'}")


class Telemetry:
    """The real Prometheus scraping one dcgm-exporter stand-in (with honor_labels, as the GPU
    operator's ServiceMonitor does), and the culler's view of it."""

    def __init__(self, tmp: Path) -> None:
        from gpuspawner.devcluster.dcgmstandin import DcgmStandIn
        from gpuspawner.devcluster.prometheus import Prometheus, ScrapeJob

        self.standin = DcgmStandIn()
        self.prom = Prometheus(tmp / "prometheus", [ScrapeJob("dcgm-exporter", [self.standin.target])])

    @property
    def url(self) -> str:
        return self.prom.url

    def start(self) -> None:
        self.standin.start()
        self.prom.start()

    def stop(self) -> None:
        self.prom.stop()
        self.standin.stop()

    def put(self, key: str, labels: dict[str, str], **values: float) -> None:
        self.standin.set(key, labels, **values)

    def wait_view(self, settings, ready, what: str, timeout: float):
        from gpuspawner.culler.gpu_metrics import parse_query_response
        from gpuspawner.culler.gpu_query import build_query

        query = build_query(settings)

        def check():
            view = parse_query_response(self.prom.raw_query(query), settings)
            return view if ready(view) else None

        return self.prom.wait_for(check, what, timeout)


async def _ready_users(hub):
    offset = 0
    while True:  # the plain (unpaginated) list, 200 at a time
        items = await hub.api("GET", f"/users?state=ready&limit=200&offset={offset}")
        for u in items:
            yield u
        if len(items) < 200:
            return
        offset += 200


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--servers", type=int, default=3000, help="running servers on the hub")
    p.add_argument("--cycles", type=int, default=3, help="measured cycles per culler")
    p.add_argument("--page-size", type=int, default=0, help="--api-page-size for both (0: hub default)")
    p.add_argument("--kernel-timeout", type=int, default=5, help="reclaim phase: kernel timeout (s)")
    p.add_argument("--cull-every", type=int, default=3, help="reclaim phase: cycle interval (s)")
    p.add_argument("--probes", type=int, default=5, help="reclaim phase: notebooks that go idle")
    p.add_argument(
        "--token-mints-per-cycle",
        type=int,
        default=-1,
        help="the culler's token_mints_per_cycle (0: no limit; default: the culler's own)",
    )
    p.add_argument("--profile", default="", help="cProfile one more 1st cycle into this file (printed too)")
    p.add_argument("--prometheus-outage", type=float, default=0, help="then stop Prometheus for this many seconds while cycles run")
    p.add_argument("--stand-in", type=int, default=0, help=argparse.SUPPRESS)
    return p.parse_args()


if __name__ == "__main__":
    a = parse()
    if a.stand_in:
        run_stand_in(a.stand_in)
    else:
        asyncio.run(main(a))
