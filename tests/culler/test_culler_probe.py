"""Two notebooks share one time-sliced GPU: ann's keeps it busy, bob's sits idle holding
5 GiB. dcgm-exporter reports the whole GPU on both pods (busy, 9 GB), so the culler alone
cannot tell them apart and reclaims nothing, and says once why. With the per-pod probe
scraped by the same real Prometheus (NVML replaced at the binding's boundary, /proc laid
out as containerd and CRI-O do), it shuts down bob's idle kernel and leaves ann alone.

Real JupyterHub, real single-user servers and ipykernel kernels, the real Prometheus, the
culler's own query and decisions; only the GPU (dcgm-exporter, NVML) is a stand-in.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry, start_http_server

from gpuspawner.culler.gpu_query import FB_USED, GpuQuerySettings
from gpuspawner.culler.policy import KEEP, RECLAIM
from gpuspawner.devcluster.nvmlstandin import GIB, FakeGpu, FakeNvmlLib, FakeProcess, ProcTree, cgroup_line, installed
from gpuspawner.devcluster.ports import free_port, free_ports
from gpuspawner.devcluster.prometheus import ScrapeJob
from gpuspawner.probe.collect import ProbeCollector, ProcReader
from gpuspawner.probe.nvml import NvmlReader
from gpuspawner.probe.pods import StaticPods
from tests.culler.culler_fakes import SHARED_A100, template
from tests.culler.culler_hub import Hub, Jupyter, in_process_culler, join_gpu_users
from tests.culler.culler_prom import Telemetry
from tests.culler.test_culler_integration import SPAWNER

pytestmark = pytest.mark.asyncio(loop_scope="session")

SKEW = timedelta(hours=3)
USERS = ("ann", "bob")  # ann: GPU busy; bob: idle, holding memory
UIDS = {"ann": "a0a0a0a0-0000-4000-8000-00000000000a", "bob": "b0b0b0b0-0000-4000-8000-00000000000b"}
PIDS = {"ann": 4101, "bob": 4201}
SHARED_T = template(SHARED_A100, FB_USED, 1)  # the GPU as dcgm-exporter labels it
#: the probe's DaemonSet pod, as a PodMonitor without honorLabels sees it
PROBE_TARGET = {"pod": "gpuspawner-probe-q8v4n", "namespace": "gpu-system", "container": "probe"}


def pod(user: str) -> str:
    return f"jupyter-{user}"


def node(tmp) -> tuple[FakeNvmlLib, ProcReader, StaticPods]:
    procs = ProcTree(tmp / "proc")
    pods = []
    for user in USERS:
        container = f"{PIDS[user]:064x}"
        runtime = "containerd" if user == "ann" else "cri-o"
        procs.add(PIDS[user], cgroup_line(UIDS[user], container, runtime=runtime), namespaced=True)
        pods.append(
            {
                "metadata": {"uid": UIDS[user], "namespace": "jhub", "name": pod(user)},
                "status": {"containerStatuses": [{"name": "notebook", "containerID": f"{runtime}://{container}"}]},
            }
        )
    gpu = FakeGpu(
        SHARED_T["UUID"],
        SHARED_T["modelName"],
        80 * GIB,
        processes=[FakeProcess(PIDS["ann"], 3 * GIB, sm_util=92), FakeProcess(PIDS["bob"], 5 * GIB)],
    )
    return FakeNvmlLib([gpu]), ProcReader(procs.root), StaticPods(pods)


class Env:
    hub: Hub
    prom: Telemetry
    probe_target: str


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def env(tmp_path_factory):
    e = Env()
    tmp = tmp_path_factory.mktemp("probe")
    (tmp / "telemetry").mkdir()
    lib, procs, pods = node(tmp)
    with installed(lib) as nvml:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(ProbeCollector(NvmlReader(nvml), procs, pods, SHARED_T["Hostname"]))
        port = free_port()
        server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
        e.probe_target = f"127.0.0.1:{port}"
        e.prom = await asyncio.to_thread(Telemetry(tmp / "telemetry").start)
        ports = free_ports(["metrics", "unreachable"])  # (two free_port() calls may return one port twice)
        extra = f"PROM_URL = {e.prom.url!r}\nMETRICS_PORT = {ports['metrics']}\nUNREACHABLE_PORT = {ports['unreachable']}\n" + SPAWNER
        e.hub = Hub(tmp / "hub", extra)
        try:  # whatever fails on the way, nothing started is left running
            await e.hub.start()
            await e.hub.create_users(list(USERS))
            await join_gpu_users(e.hub, list(USERS))
            await asyncio.gather(*(e.hub.spawn(u, {"offering": "t4-shared"}) for u in USERS))
            yield e
        finally:
            await e.hub.stop()
            await asyncio.to_thread(e.prom.stop)
            server.shutdown()
            thread.join(timeout=10)


async def idle_kernel(e: Env, user: str) -> tuple[Jupyter, str]:
    """A kernel that ran a cell, then nobody came back (its activity is hours old to the culler)."""
    server = await e.hub.server(user)
    j = Jupyter(server["user_options"]["gpuspawner"]["url"], e.hub.admin_token)
    kid = await j.start_kernel()
    await j.execute(kid, "x = sum(range(10))", wait_idle=True)
    await j.wait_state(kid, "idle")
    return j, kid


def view_of(e: Env, user: str):
    return e.prom.view(GpuQuerySettings()).for_pod("jhub", pod(user), shared=True)


async def test_only_the_idle_pod_on_a_shared_gpu_gives_its_memory_back(env):
    kernels = {u: await idle_kernel(env, u) for u in USERS}
    # dcgm-exporter: the shared GPU's own numbers on both pods
    for user in USERS:
        labels = dict(SHARED_T, pod=pod(user), namespace="jhub", container="notebook")
        env.prom.put(pod(user), labels, engine=0.92, fb_used=9 * 1024)

    # -- without the probe: today's behaviour, and the culler says why, once -------------
    await asyncio.to_thread(
        env.prom.wait_view, GpuQuerySettings(), lambda v: all(view_of(env, u).active for u in USERS), "both pods active"
    )
    c, log, _ = in_process_culler(env.hub.api_url, env.prom.url, env.hub.culler_token, skew=SKEW)
    for _ in range(2):
        report = await c.cycle()
    for user in USERS:
        o = report.outcome(user, "")
        assert o is not None and o.decision.action == KEEP, o
        # the busy neighbour's activity is on both pods: bob's kernels are not even asked
        assert "kernels not asked; GPU active" in o.decision.summary()
        assert o.decision.memory_mib == 9 * 1024  # the whole GPU's memory, on each of them
    assert log.text().count("no per-pod GPU probe series") == 1

    # -- the probe scraped too: each pod's own processes ---------------------------------
    env.prom.prom.add_job(ScrapeJob("gpuspawner-probe", [env.probe_target], honor_labels=False, labels=PROBE_TARGET))

    def told_apart(_view) -> bool:
        ann, bob = view_of(env, "ann"), view_of(env, "bob")
        return ann.active and bob.idle and bob.memory_mib == 5 * 1024 and ann.memory_mib == 3 * 1024

    await asyncio.to_thread(env.prom.wait_view, GpuQuerySettings(), told_apart, "the probe's per-pod view")
    report = await c.cycle()
    bob = report.outcome("bob", "")
    assert bob is not None and bob.decision.action == RECLAIM, bob
    assert bob.result.kernels_shut_down == [kernels["bob"][1]]
    assert "the pod's processes idle (probe" in bob.decision.summary()
    assert "GPU memory held 5120 MiB" in bob.decision.summary()
    ann = report.outcome("ann", "")
    assert ann is not None and ann.decision.action == KEEP, ann
    assert "SM utilisation max 0.92, mean 0.92 (probe)" in ann.decision.summary()
    j, kid = kernels["ann"]
    assert kid in {k["id"] for k in await j.kernels()}
    j, kid = kernels["bob"]
    assert kid not in {k["id"] for k in await j.kernels()}
    assert log.text().count("per-pod GPU probe series found") == 1
