"""A lab's first minute at scale: GPUSpawner next to plain KubeSpawner on a big, busy cluster.

    python -m bench.scale                      # make scale: 1,000 GPU nodes, 20,000 pods, 3,000 users, 600 spawns in 60 s
    python -m bench.scale --faults             # the same storm on GPUSpawner with the hub and the API server restarted in it
    python -m bench.scale --nodes 40 --pods 400 --users 120 --spawns 40 --window 10 --page-users 10   # small (CI's size)

One devcluster (the real kube-apiserver, kube-scheduler, kube-controller-manager and etcd, kwok's
simulated nodes): ``--nodes`` GPU nodes of every kind in ``nodes.yaml`` and a tenth as many CPU
nodes, ``--pods`` pods of other teams in 20 other namespaces, ``--churn`` of them replaced each
second through the scheduler the whole time. Then for each spawner in turn (KubeSpawner first,
then GPUSpawner, each with a hub of its own, fresh database, its own namespace): a real
JupyterHub behind a real configurable-http-proxy with ``--users`` users; ``--spawns`` spawns
within ``--window`` seconds, half through the REST API and half through the spawn form, a mix
of GPU offerings (60 %), "No GPU" (25 %) and requests no node can take (15 %), while
``--page-users`` other users load the spawn page every ``--page-interval`` seconds. The
notebooks answer from one stand-in process (``bench.scale.notebooks``): it is the hub that is
measured.

Printed, for each spawner and as GPUSpawner : KubeSpawner ratios: the spawn page's p50/p99
over the storm's first ``--page-window`` seconds (twice ``--window`` unless set: the same stretch on
both sides, whichever settles its spawns sooner); request -> pod bound p50/p99; request -> ready; request -> refusal p99 (what the
user is told: the form's or the API's answer, or the progress stream's failure); spawns per
second; hub CPU seconds over the storm and its peak memory (VmHWM); Kubernetes API requests per
spawn, from the API server's own audit log of the hub's identity (every request the hub made
while the storm ran and settled, watches and relists included); and for GPUSpawner the
inventory's lag (a pod bound on the API server -> counted in the hub's ``gpuspawner_offering_free``),
and a recount of every offering's free units from a fresh list against what the hub says.
Nothing is asserted on time; ``--check`` exits non-zero when a spawn was lost or stuck, a count
is wrong or a request that must be refused got a server (what CI checks at the small size).
The culler's cycle at 3,000 servers is ``bench.culler_bench`` (``make scale`` runs it after).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.procstat import cpu_seconds, memory_mib
from bench.scale import churn
from bench.scale.hubs import H100, HUB_CLIENT, KUBE_CLIENT, ORPHAN_CHECK, ORPHAN_GRACE, PROBE_OFFERING, Choice, choices, hub_config
from bench.scale.postgres import Postgres
from bench.scale.schedcheck import scheduler_check
from bench.scale.storm import Hub, PageLoads, PodWatch, Spawn, load_pages, parse_free, spawn
from gpuspawner.devcluster.cluster import DevCluster
from gpuspawner.devcluster.hub import HubProcess
from gpuspawner.devcluster.nodes import many_nodes, node_classes
from gpuspawner.devcluster.ports import free_port
from gpuspawner.names.vocabulary import STOP_NOTICE_KEY

GPU_CLASSES = [c for c in node_classes() if c["x-gpuspawner-class"] != "cpu"]


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Audit:
    """The API server's audit log of one hub's identity (``who``): requests between two marks."""

    def __init__(self, path: Path, who: str = HUB_CLIENT):
        self.path, self.who = path, who

    def mark(self) -> int:
        return self.path.stat().st_size if self.path.exists() else 0

    def between(self, start: int, end: int) -> dict[str, int]:
        counts: dict[str, int] = {}
        with open(self.path, "rb") as f:
            f.seek(start)
            for line in f.read(end - start).splitlines():
                event = json.loads(line)
                if (event.get("user") or {}).get("username") != self.who:
                    continue
                ref = event.get("objectRef") or {}
                what = ref.get("resource", event.get("requestURI", "?").split("?")[0])
                if ref.get("subresource"):
                    what += "/" + ref["subresource"]
                key = f"{event.get('verb')} {what}"
                counts[key] = counts.get(key, 0) + 1
        return counts


def mix(
    spawns: int,
    options: list[Choice],
    seed: int,
    held: dict[str, int] | None = None,
    contention: bool = False,
    share: int = 1,
    impossible: float = 0.15,
) -> list[tuple[str, Choice]]:
    """(channel, choice) of each spawn: half API, half form; 60 % GPU, 25 % no GPU, 15 % impossible
    (``impossible``: that share instead, taken from the GPU and no-GPU draws alike; 0: every spawn can
    be served, so that both hubs go at the pace of the same work, with no spawn waiting out
    ``start_timeout`` on KubeSpawner's side).

    A GPU choice is drawn only while its offering has room (at most three quarters of its units,
    less ``held`` of them for other pods): a request that fits must be served by both spawners,
    so that what is compared is the same work. Past that, the draw is "No GPU".

    With ``contention``, the two scarcest GPU offerings (H100 aside: the churn uses it) are asked
    for twice as many units as they have, by half the GPU draws while that demand lasts: those
    spawns are of kind "contended", apart from the fitting ones, because which of them get the
    units is a race. The other offerings keep their room. ``share``: how many hubs draw the same
    plan at once (``--paired``: 2), each given that share of the room."""
    rng = random.Random(seed)
    room = {c.name: (int(0.75 * c.units) - (held or {}).get(c.name, 0)) // share for c in options if c.kind == "gpu"}
    gpu = [c for c in options if c.kind == "gpu"]
    demand: dict[str, int] = {}
    contended: dict[str, Choice] = {}
    if contention:
        scarce = sorted((c for c in gpu if c.units > 0 and c.name != H100), key=lambda c: (c.units, c.name))[:2]
        demand = {c.name: 2 * c.units for c in scarce}
        contended = {c.name: dataclasses.replace(c, kind="contended") for c in scarce}
        gpu = [c for c in gpu if c.name not in demand]
    cpu = [c for c in options if c.kind == "cpu"]
    refuse = [c for c in options if c.kind == "refuse"]
    out = []
    for i in range(spawns):
        r = rng.random()
        if impossible != 0.15:  # the draw past the impossible share, spread over the other 85 % as before
            r = r * 0.15 / impossible if r < impossible else 0.15 + (r - impossible) * 0.85 / (1 - impossible)
        wanted = [name for name, left in demand.items() if left > 0]
        if r >= 0.40 and wanted and rng.random() < 0.5:
            name = rng.choice(wanted)
            demand[name] -= 1
            out.append(("api" if i % 2 == 0 else "form", contended[name]))
            continue
        pool = refuse if r < 0.15 else cpu if r < 0.40 else [c for c in gpu if room[c.name] > 0] or cpu
        choice = rng.choice(pool)
        if choice.kind == "gpu":
            room[choice.name] -= 1
        out.append(("api" if i % 2 == 0 else "form", choice))
    return out


async def probe_lag(hub: Hub, kube: churn.Conn, node: str, stop: asyncio.Event, lags: list[float], misses: list[str]) -> None:
    """Every 3 s: bind a one-GPU pod to a node of the probe offering and time until the hub's free
    count of that offering moves, then delete it and time the count's return."""
    try:
        await _probe_lag(hub, kube, node, stop, lags, misses)
    except (TimeoutError, aiohttp.ClientError) as exc:
        misses.append(f"the hub's /hub/metrics did not answer: {type(exc).__name__}: {exc}")


async def _probe_lag(hub: Hub, kube: churn.Conn, node: str, stop: asyncio.Event, lags: list[float], misses: list[str]) -> None:
    n = 0
    while not stop.is_set():
        before = parse_free(await hub.metrics(), PROBE_OFFERING)
        if before is None:
            misses.append("the hub's /hub/metrics has no free count of the probe offering")
            return
        name = f"lag-probe-{n}"
        body = churn.pod(name, "team-probe", random.Random(n), node=node, gpu="nvidia.com/gpu")
        for verb, path, payload, want in (
            ("POST", "/api/v1/namespaces/team-probe/pods", body, before - 1),
            ("DELETE", f"/api/v1/namespaces/team-probe/pods/{name}?gracePeriodSeconds=0", None, before),
        ):
            status, _ = await asyncio.to_thread(kube.request, verb, path, payload)
            if status not in (200, 201):
                misses.append(f"{verb} probe pod: HTTP {status}")
                return
            t0 = time.monotonic()
            while True:
                free = parse_free(await hub.metrics(), PROBE_OFFERING)
                if free == want:
                    lags.append(time.monotonic() - t0)
                    break
                if time.monotonic() - t0 > 15:
                    misses.append(f"{verb} {name}: the count stayed {free} (wanted {want}) for 15 s")
                    break
                await asyncio.sleep(0.1)
        n += 1
        try:
            await asyncio.wait_for(stop.wait(), 3.0)
        except TimeoutError:
            pass


async def recount(hub: Hub, cluster: DevCluster, churner: churn.Churn, out: dict) -> list[str]:
    """Every offering's free units as the hub says them, against a recount from a fresh list
    (the churn paused meanwhile, so that both see one cluster)."""

    churner.pause()
    try:
        return await _recount(hub, cluster, out)
    finally:
        churner.resume()


async def _recount(hub: Hub, cluster: DevCluster, out: dict) -> list[str]:
    from gpuspawner.capacity.counts import availability
    from gpuspawner.capacity.index import ClusterIndex
    from gpuspawner.offerings.catalog import CatalogConfig, build_catalog

    started = time.monotonic()
    text = await hub.metrics()
    while parse_free(text, PROBE_OFFERING) is None and time.monotonic() < started + 120:  # (back in sync after an outage)
        await asyncio.sleep(1)
        text = await hub.metrics()
    out["counts_back_s"] = time.monotonic() - started
    await asyncio.sleep(3)  # the churn's last events reach the hub
    text = await hub.metrics()
    kube = cluster.client()
    nodes = await asyncio.to_thread(lambda: kube.request("GET", "/api/v1/nodes", timeout=120)["items"])
    pods = await asyncio.to_thread(
        lambda: kube.request(
            "GET", "/api/v1/pods?fieldSelector=spec.nodeName!%3D,status.phase!%3DSucceeded,status.phase!%3DFailed", timeout=300
        )["items"]
    )
    index = ClusterIndex()
    index.replace(nodes=nodes, pods=[])
    wrong = []
    for offering in build_catalog(CatalogConfig(), discovered=index.discovered()):
        if not offering.resources:
            continue
        said = parse_free(text, offering.slug)
        truth = availability(offering, nodes, pods).free
        if said != truth:
            wrong.append(f"{offering.slug}: the hub says {said}, a recount {truth}")
    return wrong


async def run_one(
    kind: str,
    cluster: DevCluster,
    churner: churn.Churn,
    options: list[Choice],
    profiles: list[dict],
    args,
    tmp: Path,
    standin_port: int,
    faults: bool = False,
    tag: str = "",
    together: asyncio.Barrier | None = None,
) -> dict:
    """One spawner's storm; returns its figures. ``tag`` names this storm's namespace and work
    folder apart from the other storms of a run (``--repeats``). ``together``: the other hub's
    storm of a pair (``--paired``) meets this one there at its start, once both have settled (before
    the counts are checked) and before either cleans up, so neither's pods move the other's checks."""
    tag = tag or kind
    namespace = f"jhub-{tag}"
    churn.ensure_namespaces(cluster.state, [namespace, "team-probe"])
    proc_hub = HubProcess(tmp / tag)
    token = secrets.token_hex(16)
    db_url = args.postgres.database(tag.replace("-", "_")) if args.postgres is not None else ""
    padding = max(0, args.offerings - len(profiles))  # (both pages as long: KubeSpawner's profiles, GPUSpawner's offerings beside "No GPU")
    config = hub_config(proc_hub.base_config(), kind, namespace, standin_port, token, profiles, args.start_timeout, db_url, padding)
    who = KUBE_CLIENT if together is not None and kind == "kube" else HUB_CLIENT  # (a pair's two hubs audited apart)
    env = {**os.environ, "KUBECONFIG": str(cluster.client_kubeconfig(who))}
    audit = Audit(cluster.audit_log, who)
    started = time.monotonic()
    proc_hub.launch(config, env)
    hub = Hub(proc_hub.url, token)
    out: dict = {"spawner": kind}
    watch = PodWatch(cluster.state, namespace)
    try:
        await hub.wait_up(600, proc_hub.proc)
        out["hub_up_s"] = time.monotonic() - started
        names = [f"u{i:04d}" for i in range(args.users)]
        t = time.monotonic()
        await hub.create_users(names)
        out["users_s"] = time.monotonic() - t
        share = 2 if together is not None else 1
        plan = mix(
            args.spawns,
            options,
            args.seed,
            held={H100: churn_gpu_cap(args)},
            contention=args.contention,
            share=share,
            impossible=args.impossible,
        )
        spawners = [Spawn(names[i], channel, choice) for i, (channel, choice) in enumerate(plan)]
        page_users = names[args.spawns : args.spawns + args.page_users]
        t = time.monotonic()
        sem = asyncio.Semaphore(20)

        async def ready_browser(user: str, form: bool) -> None:
            async with sem:
                browser = await hub.browser(user)
                if form:
                    await browser.load_form()

        await asyncio.gather(
            *(ready_browser(s.user, True) for s in spawners if s.channel == "form"), *(ready_browser(u, False) for u in page_users)
        )
        out["logins_s"] = time.monotonic() - t
        if kind == "gpu":  # the inventory has listed everything before the storm (it says so in its counts)
            deadline = time.monotonic() + 300
            while parse_free(await hub.metrics(), PROBE_OFFERING) is None and time.monotonic() < deadline:
                await asyncio.sleep(1)
        watch.start()
        await asyncio.sleep(1)
        if together is not None:
            await asyncio.wait_for(together.wait(), 900)  # both hubs ready: the two storms start at once
        pid = proc_hub.proc.pid
        cpu0, mark0 = cpu_seconds(pid), audit.mark()
        stop_pages, stop_probe = asyncio.Event(), asyncio.Event()
        pages = PageLoads()
        page_task = asyncio.create_task(load_pages(hub, page_users, args.page_interval, stop_pages, pages))
        # The page is timed over the same stretch on both sides: the storm's first page_window seconds,
        # whether or not the side's spawns have settled by then (a side whose spawns end sooner must not
        # add quiet views; one whose spawns run longer must not add more storm).
        page_window = args.page_window or 2 * args.window
        page_timer = asyncio.get_running_loop().call_later(page_window, stop_pages.set)
        lags: list[float] = []
        misses: list[str] = []
        probe_node = next(
            n
            for n in cluster.client().request("GET", "/api/v1/nodes?labelSelector=gpuspawner.io/node-class%3Dv100-vgpu-class&limit=1")[
                "items"
            ]
        )["metadata"]["name"]
        probe_task = (
            asyncio.create_task(probe_lag(hub, churn.Conn(cluster.state), probe_node, stop_probe, lags, misses))
            if kind == "gpu" and not faults and together is None
            else None
        )
        spy = (
            subprocess.Popen(
                [
                    args.py_spy,
                    "record",
                    "--pid",
                    str(pid),
                    "--output",
                    str(tmp / f"{tag}-hub.txt"),
                    "--format",
                    "raw",
                    "--rate",
                    "50",
                    "--nonblocking",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            if args.py_spy
            else None
        )
        storm_start = time.monotonic()
        tasks = []
        fault_log: list[str] = []
        fault_task = asyncio.create_task(inject_faults(cluster, proc_hub, hub, args, fault_log)) if faults else None
        for i, s in enumerate(spawners):
            await asyncio.sleep(max(0.0, storm_start + i * args.window / args.spawns - time.monotonic()))
            tasks.append(asyncio.create_task(spawn(hub, s, kind == "gpu", args.start_timeout + 300)))
        out["sent_s"] = time.monotonic() - storm_start
        await asyncio.gather(*tasks)
        if fault_task:
            await fault_task
        out["settled_s"] = time.monotonic() - storm_start
        if spy:
            spy.send_signal(2)  # py-spy writes its flame graph on SIGINT
            spy.wait(60)
        stop_probe.set()
        await page_task  # (ends page_window s into the storm)
        page_timer.cancel()
        if probe_task:
            await probe_task
        elif (
            kind == "gpu" and not faults
        ):  # paired: the probes after the page's stretch (their /hub/metrics polls load GPUSpawner's hub only)
            probes_done = asyncio.Event()
            asyncio.get_running_loop().call_later(10, probes_done.set)
            await probe_lag(hub, churn.Conn(cluster.state), probe_node, probes_done, lags, misses)
        await asyncio.sleep(2)  # the last binds reach the watch
        pid = proc_hub.proc.pid
        out["hub_cpu_s"] = cpu_seconds(pid) - cpu0 if not faults else None
        out["hub_peak_mib"] = memory_mib(pid, "VmHWM")
        requests = audit.between(mark0, audit.mark())
        for s in spawners:
            s.bound = watch.bound.get(s.user, 0.0)
        out.update(summarise(spawners, pages, requests, lags, misses))
        if together is not None:
            await asyncio.wait_for(together.wait(), 900)  # both storms settled: nothing of the other's moves the counts
        out["stuck"] = await stuck_servers(hub, spawners, watch)
        if kind == "gpu":
            out["recount"] = await recount(hub, cluster, churner, out)
            if args.scheduler_check:
                out["scheduler"] = await scheduler_check(hub, cluster.state, churner, profiles, args.scheduler_check)
        out["faults"] = fault_log
        out["rollbacks"] = proc_hub.log_text().count("Rolling back")
        (tmp / f"{tag}-spawns.json").write_text(
            json.dumps([{**vars(s), "choice": s.choice.name} for s in spawners], default=str)
        )  # JupyterHub found its session dirty, or a database error
        if together is not None:
            await asyncio.wait_for(together.wait(), 900)  # both checked: now either may clean up
        return out
    finally:
        watch.stop()
        await hub.close()
        await proc_hub.end_async(timeout=30)
        kube = churn.Conn(cluster.state)
        await asyncio.to_thread(kube.request, "DELETE", f"/api/v1/namespaces/{namespace}/pods")


async def inject_faults(cluster: DevCluster, proc_hub: HubProcess, hub: Hub, args, log: list[str]) -> None:
    """A third into the storm, restart the hub; two thirds in, the API server."""
    await asyncio.sleep(args.window / 3)
    t = time.monotonic()
    await proc_hub.end_async(timeout=30)
    config = proc_hub.tmp / "jupyterhub_config.py"
    proc_hub.launch(config, {**os.environ, "KUBECONFIG": str(cluster.client_kubeconfig(HUB_CLIENT))})
    await hub.wait_up(600, proc_hub.proc)
    log.append(f"hub restarted at {args.window / 3:.0f}s into the storm: answering again after {time.monotonic() - t:.1f}s")
    await asyncio.sleep(max(0.0, args.window / 3))
    t = time.monotonic()
    await asyncio.to_thread(cluster.restart, ("kube-apiserver",), 0.0, 120.0)
    log.append(f"kube-apiserver restarted: ready again after {time.monotonic() - t:.1f}s")


async def stuck_servers(hub: Hub, spawners: list[Spawn], watch: PodWatch) -> list[str]:
    """Every spawn user's server: running, or stopped with a reason the user is told (the spawn's
    own answer, or the notice the home page keeps); never still pending; and no notebook pod
    without a running server."""
    stuck = []
    deadline = time.monotonic() + ORPHAN_GRACE + 3 * ORPHAN_CHECK
    while time.monotonic() < deadline:  # a pod a timed-out request made is the orphan reconciler's, after its grace period
        ready = set()
        for user in list(watch.pods):
            _, model = await hub.api("GET", f"/users/{user}")
            if (((model or {}).get("servers") or {}).get("") or {}).get("ready") if isinstance(model, dict) else False:
                ready.add(user)
        if set(watch.pods) <= ready:
            break
        await asyncio.sleep(5)
    for s in spawners:
        status, model = await hub.api("GET", f"/users/{s.user}?include_stopped_servers=1")
        server = ((model or {}).get("servers") or {}).get("") if isinstance(model, dict) else None
        running = bool(server and server.get("ready"))
        if s.outcome == "stopped" and running:  # (its stream was cut by a restart; the hub resumed it)
            s.outcome = "ready"
        if s.outcome == "stopped":  # the start was dropped without a verdict: what does the home page say?
            notice = ((server or {}).get("state") or {}).get(STOP_NOTICE_KEY) or {}
            s.reason = notice.get("text", "")
        if s.user in watch.pods and not running:
            stuck.append(f"{s.user}: a pod ({watch.pods[s.user]['metadata']['name']}) and no running server")
        if s.outcome != "ready" and not s.reason:
            stuck.append(f"{s.user}: {s.outcome} without a reason ({s.choice.name})")
        if server and server.get("pending"):
            stuck.append(f"{s.user}: pending {server['pending']} ({s.choice.name}, {s.outcome})")
        elif s.outcome == "ready" and not running:
            stuck.append(f"{s.user}: told ready, but the hub has no running server")
        elif s.choice.kind == "refuse" and running:
            stuck.append(f"{s.user}: asked for {s.choice.name}, which no node can take, and has a server")
    return stuck


def summarise(spawners: list[Spawn], pages: PageLoads, requests: dict[str, int], lags: list[float], misses: list[str]) -> dict:
    ok = [s for s in spawners if s.choice.kind in ("gpu", "cpu")]
    bad = [s for s in spawners if s.choice.kind == "refuse"]
    contended = [s.done - s.sent for s in spawners if s.choice.kind == "contended" and s.outcome != "lost"]
    bound = [s.to_bound for s in ok if s.to_bound is not None]
    ready = [s.done - s.sent for s in ok if s.outcome == "ready"]
    refusals = [s.done - s.sent for s in bad if s.outcome in ("refused", "failed")]
    outcomes: dict[str, int] = {}
    for s in spawners:
        key = f"{s.choice.kind}:{s.outcome}"
        if key == "contended:failed" and not wordless(s.reason):
            key = "contended:refused"  # (refused after the 202: the progress stream's "Spawn failed: <words>")
        outcomes[key] = outcomes.get(key, 0) + 1
    first, last = min(s.sent for s in spawners), max(s.sent for s in spawners)
    total = sum(requests.values())
    reasons = sorted({f"{s.choice.name}: {s.reason[:160]}" for s in spawners if s.outcome in ("refused", "failed", "lost")})
    return {
        "page_p50": pct(pages.times, 0.5),
        "page_p99": pct(pages.times, 0.99),
        "page_loads": len(pages.times),
        "page_errors": pages.errors,
        "bound_p50": pct(bound, 0.5),
        "bound_p99": pct(bound, 0.99),
        "bound_n": len(bound),
        "ready_p50": pct(ready, 0.5),
        "ready_p99": pct(ready, 0.99),
        "refusal_p50": pct(refusals, 0.5),
        "refusal_p99": pct(refusals, 0.99),
        "contended_p50": pct(contended, 0.5),
        "contended_p99": pct(contended, 0.99),
        "spawns_per_s": len(spawners) / max(last - first, 1e-9),
        "ready_per_s": len(ready) / max(max((s.done for s in ok if s.outcome == "ready"), default=first) - first, 1e-9),
        "outcomes": outcomes,
        "api_requests": total,
        "api_per_spawn": total / len(spawners),
        "api_breakdown": dict(sorted(requests.items(), key=lambda kv: -kv[1])[:12]),
        "lag_p50": pct(lags, 0.5),
        "lag_p99": pct(lags, 0.99),
        "lag_n": len(lags),
        "lag_misses": misses,
        "reasons": reasons[:12],
        "slow_refusals": sum(1 for s in ok if s.outcome != "ready" and "too slowly" in (s.reason or "")),
        "throttled": sum(s.throttled for s in spawners),
        "throttled_spawns": sum(1 for s in spawners if s.throttled),
    }


def churn_gpu_cap(args) -> int:
    """How many H100s the churn's GPU pods hold at most: a quarter of the H100 nodes' GPUs."""
    h100_nodes = len([n for n in range(args.nodes) if GPU_CLASSES[n % len(GPU_CLASSES)]["x-gpuspawner-class"] == "h100-8x"])
    return h100_nodes * 8 // 4


def fmt(value, unit: str = "ms") -> str:
    if value is None:
        return "-"
    if unit == "ms":
        return f"{value * 1000:.0f} ms"
    if unit == "s":
        return f"{value:.1f} s"
    return f"{value:.1f}"


def report(results: list[dict], args, setup: dict) -> None:
    by = {r["spawner"]: r for r in results}
    print(
        f"\n# {args.nodes} GPU nodes + {args.nodes // 10} CPU nodes, {args.pods} other pods ({args.churn}/s churn), {args.users} users, "
        f"{args.spawns} spawns in {args.window:.0f}s, {args.page_users} users loading the spawn page every {args.page_interval:.0f}s"
    )
    print(
        f"# machine: {os.cpu_count()} cores, load before the storms {setup['load']}; hubs' database {args.db}; cluster up {setup['up_s']:.0f}s, "
        f"{args.pods} pods placed in {setup['fill_s']:.0f}s"
    )
    rows = [
        ("spawn page p50", "page_p50", "ms"),
        ("spawn page p99", "page_p99", "ms"),
        ("request -> pod bound p50", "bound_p50", "ms"),
        ("request -> pod bound p99", "bound_p99", "ms"),
        ("request -> ready p50", "ready_p50", "ms"),
        ("request -> ready p99", "ready_p99", "ms"),
        ("request -> refusal p50", "refusal_p50", "ms"),
        ("request -> refusal p99", "refusal_p99", "ms"),
        *(
            [("contended -> verdict p50", "contended_p50", "ms"), ("contended -> verdict p99", "contended_p99", "ms")]
            if args.contention
            else []
        ),
        ("spawns sent per second", "spawns_per_s", "n"),
        ("servers ready per second", "ready_per_s", "n"),
        ("hub CPU seconds (storm)", "hub_cpu_s", "s"),
        ("hub peak memory MiB", "hub_peak_mib", "n"),
        ("API requests per spawn", "api_per_spawn", "n"),
        ("inventory lag p50", "lag_p50", "ms"),
        ("inventory lag p99", "lag_p99", "ms"),
    ]
    names = [n for n in ("kube", "gpu") if n in by]
    print(
        f"{'':28}"
        + "".join(f"{'KubeSpawner' if n == 'kube' else 'GPUSpawner':>16}" for n in names)
        + ("    GPUSpawner : KubeSpawner" if len(names) == 2 else "")
    )
    for label, key, unit in rows:
        vals = [by[n].get(key) for n in names]
        line = f"{label:28}" + "".join(f"{fmt(v, unit):>16}" for v in vals)
        if len(names) == 2 and vals[0] and vals[1] is not None:
            line += f"    {vals[1] / vals[0]:.2f}x"
        print(line)
    for n in names:
        r = by[n]
        print(f"\n## {'KubeSpawner' if n == 'kube' else 'GPUSpawner'}")
        print(
            f"hub answering {r['hub_up_s']:.1f}s after start; {args.users} users created in {r['users_s']:.1f}s; browsers logged in in {r['logins_s']:.1f}s"
        )
        print(f"spawns sent over {r['sent_s']:.1f}s, all settled after {r['settled_s']:.1f}s; outcomes {r['outcomes']}")
        print(
            f"JupyterHub's concurrent spawn limit answered 429 {r['throttled']} times to {r['throttled_spawns']} spawns "
            "(each pressed again after the wait it named)"
        )
        print(f"spawn page loads {r['page_loads']}, errors {r['page_errors'] or 'none'}; pods bound {r['bound_n']}")
        print(f"API requests by the hub during the storm: {r['api_requests']} ({r['api_breakdown']})")
        if n == "gpu":
            print(f"inventory lag probes: {r['lag_n']}; misses: {r['lag_misses'] or 'none'}")
            print(
                f"free counts against a recount from a fresh list: {'exact' if not r['recount'] else r['recount']} "
                f"(the hub's counts answered {r['counts_back_s']:.1f}s after the storm settled)"
            )
            if r.get("scheduler"):
                sched = r["scheduler"]
                print(
                    f"free counts against the real scheduler: {sched['agree']} of {sched['checked']} offerings agree"
                    f"{': ' + '; '.join(sched['wrong']) if sched['wrong'] else ''}"
                    f" (not filled, more than {args.scheduler_check} free: {', '.join(sched['unchecked']) or 'none'})"
                )
        print(f"servers stuck pending, lost or wrong: {r['stuck'] or 'none'}")
        print(f"hub database rollbacks (a handler found the session dirty, or a database error): {r['rollbacks']}")
        for reason in r["reasons"]:
            print(f"  told: {reason}")
        for line in r["faults"]:
            print(f"  fault: {line}")


def fates(r: dict) -> dict[str, int]:
    """What became of one storm's spawns that fit (GPU and "No GPU" requests): served, refused as too
    slow, failed (a timeout, an error), lost (no verdict); and of the impossible ones."""
    outcomes = r["outcomes"]
    fitting: dict[str, int] = {}
    for key, count in outcomes.items():
        kind, _, outcome = key.partition(":")
        if kind in ("gpu", "cpu"):
            fitting[outcome] = fitting.get(outcome, 0) + count
    slow = r.get("slow_refusals", 0)
    total = sum(fitting.values())
    return {
        "fitting": total,
        "served": fitting.get("ready", 0),
        "refused as slow": slow,
        "refused or stopped otherwise": total - fitting.get("ready", 0) - fitting.get("lost", 0) - fitting.get("failed", 0) - slow,
        "failed (timeout, error)": fitting.get("failed", 0),
        "lost (no verdict)": fitting.get("lost", 0),
        "impossible, refused with words": sum(v for k, v in outcomes.items() if k.startswith("refuse:") and k != "refuse:lost"),
        **contended_fates(outcomes),
    }


def wordless(reason: str) -> bool:
    """Whether a failed spawn's message says nothing a user can act on: empty after JupyterHub's
    prefix, or only KubeSpawner's "pod ... did not start in N seconds!"."""
    said = reason.strip().removeprefix("Error:").strip().removeprefix("Spawn failed:").strip()
    return not said or "did not start in" in said


def contended_fates(outcomes: dict[str, int]) -> dict[str, int]:
    """What became of the spawns beyond the scarce offerings' units (``--contention``; none else):
    at most their units served, the rest refused with words (GPUSpawner: nothing free now) or
    failed (KubeSpawner: the pod waits out ``start_timeout``)."""
    mine = {key.partition(":")[2]: count for key, count in outcomes.items() if key.startswith("contended:")}
    if not mine:
        return {}
    return {
        "contended (2x the units)": sum(mine.values()),
        "  contended: served": mine.get("ready", 0),
        "  contended: refused with words": mine.get("refused", 0) + mine.get("stopped", 0),
        "  contended: failed without words (timeout)": mine.get("failed", 0),
        "  contended: lost": mine.get("lost", 0),
    }


def spread(values: list[float]) -> str:
    """Median [min - max] of ``values`` (as they come: already in the row's unit)."""
    if not values:
        return "-"
    ordered = sorted(values)
    mid = ordered[len(ordered) // 2] if len(ordered) % 2 else (ordered[len(ordered) // 2 - 1] + ordered[len(ordered) // 2]) / 2
    return f"{mid:.2f} [{ordered[0]:.2f} - {ordered[-1]:.2f}]"


#: The summary's rows: (label, key, scale to the printed unit).
SUMMARY_ROWS = [
    ("spawn page p50 (ms)", "page_p50", 1000),
    ("spawn page p99 (ms)", "page_p99", 1000),
    ("request -> pod bound p50 (s)", "bound_p50", 1),
    ("request -> pod bound p99 (s)", "bound_p99", 1),
    ("request -> ready p50 (s)", "ready_p50", 1),
    ("request -> ready p99 (s)", "ready_p99", 1),
    ("servers ready per second", "ready_per_s", 1),
    ("hub CPU s per served spawn", "cpu_per_served", 1),
    ("API requests per spawn", "api_per_spawn", 1),
    ("contended -> verdict p50 (s)", "contended_p50", 1),
    ("contended -> verdict p99 (s)", "contended_p99", 1),
]


def summary(runs: list[list[dict]]) -> None:
    """Every repeat side by side: each figure's median [min - max] per spawner, the ratio's median
    and spread over the repeats, and what became of the spawns, with the load at each storm's end."""
    for results in runs:
        for r in results:
            served = fates(r)["served"]
            r["cpu_per_served"] = r["hub_cpu_s"] / served if r.get("hub_cpu_s") is not None and served else None
    by = [{r["spawner"]: r for r in results} for results in runs]
    names = [n for n in ("kube", "gpu") if all(n in b for b in by)]
    print(f"\n===== {len(runs)} repeats, order alternated: median [min - max] =====")
    print(
        f"{'':32}"
        + "".join(f"{'KubeSpawner' if n == 'kube' else 'GPUSpawner':>26}" for n in names)
        + ("   GPUSpawner : KubeSpawner" if len(names) == 2 else "")
    )
    for label, key, scale in SUMMARY_ROWS:
        if all(b[n].get(key) is None for b in by for n in names):
            continue  # (the contended rows without --contention)
        cells = [spread([b[n][key] * scale for b in by if b[n].get(key) is not None]) for n in names]
        line = f"{label:32}" + "".join(f"{c:>26}" for c in cells)
        if len(names) == 2:
            ratios = [b["gpu"][key] / b["kube"][key] for b in by if b["kube"].get(key) and b["gpu"].get(key) is not None]
            line += f"   {spread(ratios)}"
        print(line)
    print("\nwhat became of the spawns (each repeat; KubeSpawner / GPUSpawner):")
    for fate in fates(runs[0][0]):
        print(f"  {fate:32}" + "  ".join(" / ".join(str(fates(b[n])[fate]) for n in names) for b in by))
    print("load average at each storm's end: " + "; ".join(", ".join(f"{r['spawner']} {r['load']}" for r in results) for results in runs))


def problems(results: list[dict], faults: bool = False) -> list[str]:
    """What ``--check`` fails on: a spawn lost or stuck, a pod without its server, a wrong count,
    a lag probe the hub never saw; on GPUSpawner without faults, a request that fits and was not
    served (with faults, a spawn the restarts ended may stop, with the words the user was told)."""
    out = []
    for r in results:
        name = r["spawner"]
        out += [f"{name}: {s}" for s in r["stuck"]]
        lost = {k: v for k, v in r["outcomes"].items() if k.endswith(":lost")}
        if lost:
            out.append(f"{name}: spawns lost (no verdict): {lost}")
        unserved = {k: v for k, v in r["outcomes"].items() if k.split(":")[0] in ("gpu", "cpu") and k.split(":")[1] != "ready"}
        if unserved and name == "gpu" and not faults:
            out.append(f"{name}: spawns that fit were not served: {unserved}")
        if r.get("recount"):
            out.append(f"{name}: free counts wrong: {r['recount']}")
        if (r.get("scheduler") or {}).get("wrong"):
            out.append(f"{name}: free counts the real scheduler disagrees with: {r['scheduler']['wrong']}")
        if r.get("lag_misses"):
            out.append(f"{name}: inventory lag probes missed: {r['lag_misses']}")
        if r.get("rollbacks"):
            out.append(f"{name}: the hub rolled its database session back {r['rollbacks']} times")
    return out


async def main_async(args) -> int:
    classes = node_classes()
    gpu_classes = [c for c in classes if c["x-gpuspawner-class"] != "cpu"]
    cpu_classes = [c for c in classes if c["x-gpuspawner-class"] == "cpu"]
    nodes = [*many_nodes(args.nodes, gpu_classes), *(many_nodes(max(1, args.nodes // 10), cpu_classes))]
    options, profiles = choices(nodes)
    with tempfile.TemporaryDirectory(prefix="gpuspawner-scale-") as tmp_name:
        tmp = Path(args.keep or tmp_name)
        tmp.mkdir(parents=True, exist_ok=True)
        cluster = DevCluster(tmp / "cluster", audited_clients=[HUB_CLIENT, KUBE_CLIENT])
        t = time.monotonic()
        await asyncio.to_thread(cluster.up, nodes, 900.0, lambda m: None)
        setup = {"up_s": time.monotonic() - t}
        standin_port = free_port()
        standin = subprocess.Popen(
            [sys.executable, "-m", "bench.scale.notebooks", str(standin_port)], cwd=Path(__file__).resolve().parents[2]
        )
        churner = None
        args.postgres = None
        try:
            if args.db == "postgresql":
                args.postgres = Postgres(tmp / "postgres").start()
            names = [n["metadata"]["name"] for n in nodes]
            standing, setup["fill_s"] = await asyncio.to_thread(churn.fill, cluster.state, names, args.pods)
            churner = churn.Churn(cluster.state, standing, args.churn, ["nvidia.com/gpu"], "h100-8x", gpu_cap=churn_gpu_cap(args))
            churner.start()
            setup["load"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
            runs: list[list[dict]] = []
            kinds = ["gpu"] if args.faults else [k for k in ("kube", "gpu") if k in args.spawners]
            for repeat in range(args.repeats):
                order = kinds if repeat % 2 == 0 else kinds[::-1]  # neither spawner always meets the fresher cluster
                results = []
                if args.paired and len(kinds) == 2:  # both hubs' storms at once: the same machine, the same moment
                    print(f"storms on kube and gpu at once (repeat {repeat + 1} of {args.repeats})...", flush=True)
                    together = asyncio.Barrier(2)
                    tags = {kind: f"{kind}-{repeat + 1}" for kind in kinds}
                    results = list(
                        await asyncio.gather(
                            *(
                                run_one(kind, cluster, churner, options, profiles, args, tmp, standin_port, False, tags[kind], together)
                                for kind in kinds
                            )
                        )
                    )
                    for kind, result in zip(kinds, results, strict=True):
                        result["load"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
                        (tmp / f"{tags[kind]}-results.json").write_text(json.dumps(result, indent=1, default=str))
                    runs.append(results)
                    continue
                for kind in order:
                    tag = kind if args.repeats == 1 else f"{kind}-{repeat + 1}"
                    print(f"storm on {kind}{f' (repeat {repeat + 1} of {args.repeats})' if args.repeats > 1 else ''}...", flush=True)
                    results.append(await run_one(kind, cluster, churner, options, profiles, args, tmp, standin_port, args.faults, tag))
                    results[-1]["load"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
                    (tmp / f"{tag}-results.json").write_text(json.dumps(results[-1], indent=1, default=str))
                runs.append(results)
            churner.stop()
            print(f"churn: {churner.created} created, {churner.deleted} deleted, {churner.errors} errors")
            for repeat, results in enumerate(runs):
                if len(runs) > 1:
                    print(f"\n===== repeat {repeat + 1} of {len(runs)} (order: {', '.join(r['spawner'] for r in results)}) =====")
                report(results, args, setup)
            if len(runs) > 1:
                summary(runs)
            found = [p for results in runs for p in problems(results, args.faults)]
            if found:
                print("\nPROBLEMS:\n" + "\n".join(f"- {p}" for p in found))
            return 1 if (args.check and found) else 0
        finally:
            if churner:
                churner.stop()
            standin.terminate()
            standin.wait(10)
            cluster.down(quiet=True)
            if args.postgres is not None:
                args.postgres.stop()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000, help="GPU nodes (and a tenth as many CPU nodes)")
    parser.add_argument("--pods", type=int, default=20000, help="pods of other teams")
    parser.add_argument("--churn", type=float, default=10.0, help="of those, replaced per second")
    parser.add_argument("--users", type=int, default=3000)
    parser.add_argument("--spawns", type=int, default=600)
    parser.add_argument("--window", type=float, default=60.0, help="seconds over which the spawns are sent")
    parser.add_argument("--page-users", type=int, default=100)
    parser.add_argument("--page-interval", type=float, default=5.0, help="seconds between one page user's loads")
    parser.add_argument(
        "--offerings",
        type=int,
        default=0,
        help="make each side's page this many choices long with a site's own whole-GPU offerings (KubeSpawner: profiles) nobody spawns",
    )
    parser.add_argument(
        "--page-window",
        type=float,
        default=0.0,
        help="seconds from the storm's start over which the page is loaded and timed, the same on both sides (default: twice --window)",
    )
    parser.add_argument("--start-timeout", type=int, default=60, help="KubeSpawner.start_timeout of both hubs")
    parser.add_argument("--spawners", nargs="+", default=["kube", "gpu"], choices=["kube", "gpu"])
    parser.add_argument("--faults", action="store_true", help="GPUSpawner only, with the hub and the API server restarted in the storm")
    parser.add_argument("--seed", type=int, default=30)
    parser.add_argument(
        "--db",
        choices=["sqlite", "postgresql"],
        default="sqlite",
        help="the hubs' database: JupyterHub's default sqlite file, or a PostgreSQL server the benchmark starts (Debian's package)",
    )
    parser.add_argument(
        "--repeats", type=int, default=1, help="storms per spawner, the order alternated each repeat; a summary of medians and spread"
    )
    parser.add_argument(
        "--paired",
        action="store_true",
        help="run the two hubs' storms at the same time on the same cluster (each asks for half the room), so both meet the "
        "same machine load: ratios a shared machine's other work moves far less than storms taken in turn",
    )
    parser.add_argument("--keep", metavar="DIR", help="work in DIR and keep it (the hubs' and the cluster's logs)")
    parser.add_argument(
        "--py-spy",
        metavar="PY_SPY",
        help="record each hub with this py-spy (not pausing it) during its storm: collapsed stacks in the work folder",
    )
    parser.add_argument(
        "--impossible",
        type=float,
        default=0.15,
        help="the share of spawns no node can serve (default 0.15); 0: both hubs do the same work at the same pace",
    )
    parser.add_argument(
        "--contention",
        action="store_true",
        help="also ask the two scarcest GPU offerings for twice their units (their spawns counted apart, as contended)",
    )
    parser.add_argument(
        "--scheduler-check",
        type=int,
        default=40,
        metavar="N",
        help="after GPUSpawner's storm, fill every GPU offering with at most N free units on the real scheduler (0: none)",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when a spawn was lost or stuck or a count is wrong")
    args = parser.parse_args(argv)
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
