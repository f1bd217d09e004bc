"""One user's pod cannot stall the culler for anyone else (issue #25 item 2), on a REAL
JupyterHub with configurable-http-proxy. Every server is a real HTTP server on loopback,
on a port of its own (tests/culler/loopback_pods.py), started by the hub through a
spawner that fills ``user_options["gpuspawner"]`` as GPUSpawner does:

* nora's pod never answers a kernel request (held open until the test ends);
* sam's lists 40 idle kernels and holds each shutdown, then answers 503;
* mona's lists 4,000 idle kernels and shuts them down at once;
* olga (plain) and pete (whole GPU) are ordinary idle servers: stopped in the first
  cycle, while nora's request is still open.

nora's work is carried over, never started twice, counted as a stall with a WARNING,
and after ``stalls_before_telemetry`` cycles her idle GPU is stopped on telemetry alone.
The culler's clock is the test's: cycles run at chosen times (no sleeps).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

import pytest
import pytest_asyncio
from jupyterhub_idle_culler import utcnow

from gpuspawner.culler.policy import HELD_BACK, RECLAIM, STOP
from gpuspawner.culler.records import UNRESPONSIVE
from tests.culler.culler_hub import in_process_culler
from tests.culler.loopback_pods import GpuAnswers, Pod, idle_kernels, loopback_hub

pytestmark = pytest.mark.asyncio(loop_scope="session")

SKEW = timedelta(hours=3)
#: a cycle that takes longer than this is a hang (the culler's requests to a held pod
#: would time out only after SERVER_TIMEOUT): a guard, not a timing
HANG_GUARD_S = 240
SERVER_TIMEOUT = 3600
#: user -> offering ("" for a plain server)
OFFERINGS = {"nora": "a100-80gb", "sam": "t4-shared", "mona": "t4-shared", "olga": "", "pete": "a100-80gb"}


@pytest_asyncio.fixture(loop_scope="session")
async def env(tmp_path):
    gpus = GpuAnswers()
    pods = {
        "nora": Pod(hold="kernels"),
        "sam": Pod(idle_kernels(40, timedelta(days=1)), hold="shutdowns", shutdown_code=503),
        "mona": Pod(idle_kernels(4000, timedelta(days=1))),
        "olga": Pod(),
        "pete": Pod(),
    }
    for user, offering in OFFERINGS.items():
        if offering:
            gpus.pods[f"jupyter-{user}"] = (0.0, 0.0, 6000.0)  # idle, holding memory
    async with loopback_hub(tmp_path, {u: (OFFERINGS[u], pods[u]) for u in OFFERINGS}, gpus) as hub:
        yield hub, gpus, pods


async def test_a_pod_that_never_answers_delays_no_one_and_is_judged_by_telemetry(env):
    hub, gpus, pods = env
    c, rec, _ = in_process_culler(
        hub.api_url,
        gpus.url,
        hub.culler_token,
        "--kind-timeout=full=60",
        "--timeout=60",
        "--kernel-timeout=60",
        "--GpuCuller.server_deadline_seconds=20",
        f"--GpuCuller.server_request_timeout={SERVER_TIMEOUT}",
        "--GpuCuller.kernel_shutdowns_per_cycle=20",
        "--GpuCuller.kernel_shutdown_concurrency=4",
        "--GpuCuller.stalls_before_telemetry=3",
        skew=SKEW,
    )
    start = utcnow() + SKEW
    reports = []
    try:
        for n in range(3):  # cycles 10 minutes apart (the GPU window)
            c.clock = lambda n=n: start + timedelta(minutes=10 * n)
            reports.append(await asyncio.wait_for(c.cycle(), HANG_GUARD_S))
            if n == 0:
                # the first cycle came back while nora's pod still holds the culler's request
                assert pods["nora"].open["GET kernels"] == 1
                # ... and the ordinary idle servers were stopped in it
                for user in ("olga", "pete"):
                    o = reports[0].outcome(user)
                    assert o.decision.action == STOP and o.result.stopped in ("stopped", "stopping"), (user, o.decision.summary())
                    await hub.wait_stopped(user)
                # mona's 4,000 kernels: the cycle's cap of them, shut down
                mona = reports[0].outcome("mona")
                assert mona.decision.action == RECLAIM, mona.decision.summary()
                assert len(mona.result.kernels_shut_down) == 20 == pods["mona"].sent["DELETE kernel"]
                assert "3980 more idle kernel(s) wait for later cycles" in mona.decision.summary()
                # sam's held shutdowns run concurrently, never more than the server's limit
                await pods["sam"].wait_open("DELETE kernel", 4)
                assert reports[0].outcome("sam").carried_over
            if n == 1:
                assert pods["sam"].most_open["DELETE kernel"] == 4
                pods["sam"].release()  # its 503s end its carried-over work
        first, second, third = (r.outcome("nora") for r in reports)
        # carried over, never started again while it ran: one request in all
        assert pods["nora"].sent["GET kernels"] == 1
        assert first.carried_over and first.decision.action == HELD_BACK
        assert second.carried_over and second.decision.action == HELD_BACK
        # the third stall: judged by its idle GPU's telemetry alone, and stopped without a notice
        assert third.decision.action == STOP and third.decision.stop_reason == UNRESPONSIVE, third.decision.summary()
        assert third.result.stopped in ("stopped", "stopping")
        await hub.wait_stopped("nora")
        assert pods["nora"].sent["PUT notice"] == 0
        stalls = sum(1 for r in reports for o in r.outcomes if o.carried_over or o.decision.stop_reason == UNRESPONSIVE)
        assert c.metrics.value("gpuspawner_culler_errors_total", {"source": "stall"}) == stalls >= 3
        log = rec.text(logging.WARNING)
        assert log.count("server nora stalled") == 3
        assert "stop server nora [full a100-80gb] (unresponsive)" in log
        assert c.metrics.value("gpuspawner_culler_server_stops_total", {"reason": "unresponsive", "kind": "full"}) == 1
    finally:
        await c.close()
