"""What counts as using a GPU, and what the culler tells a user it cannot keep (issue #25
items 5 and 6), on a REAL JupyterHub with configurable-http-proxy. Each test has a hub of
its own whose servers are real HTTP servers on loopback (tests/culler/loopback_pods.py),
and the GPU view the culler reads from Prometheus' HTTP API on loopback.

* a trivial keep-alive (one short burst in a window: max 1.0, mean 0.002) holds no GPU;
* the GPU lease stops a busy server, warned first with no "Keep";
* a ``gpu_idle_limit`` warning says only GPU use counts, and offers no "Keep";
* a pod that refuses its token (403) is not given a new one every view.

The culler's clock is the test's: cycles run at chosen times (no sleeps).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from jupyterhub_idle_culler import utcnow

from gpuspawner.culler.policy import KEEP, STOP
from gpuspawner.culler.records import GPU_IDLE_LIMIT, GPU_LEASE, IDLE
from tests.culler.culler_hub import in_process_culler
from tests.culler.loopback_pods import Pod

pytestmark = pytest.mark.asyncio(loop_scope="session")

HANG_GUARD_S = 240
M = timedelta(minutes=1)


async def cycle(c, at):
    c.clock = lambda: at
    return await asyncio.wait_for(c.cycle(), HANG_GUARD_S)


def busy_kernel() -> dict:
    now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    return {
        "id": "0b5e55ed-0000-4000-8000-000000000001",
        "name": "python3",
        "execution_state": "busy",
        "last_activity": now,
        "connections": 1,
    }


async def test_a_trivial_keep_alive_holds_no_gpu(make_hub):
    hub, gpus = await make_hub(
        {
            "kate": ("a100-80gb", Pod(), (0.002, 1.0, 500.0)),  # one tiny kernel a minute
            "gus": ("a100-80gb", Pod(), (0.6, 1.0, 30000.0)),  # really computing
        }
    )
    c, rec, _ = in_process_culler(hub.api_url, gpus.url, hub.culler_token, "--kind-timeout=full=60")
    try:
        report = await cycle(c, utcnow() + timedelta(hours=3))
        kate, gus = report.outcome("kate"), report.outcome("gus")
        assert kate.decision.action == STOP and kate.decision.stop_reason == IDLE, kate.decision.summary()
        assert "GR_ENGINE_ACTIVE max 1.00, mean 0.00 below gpu_engine_threshold 0.05" in kate.decision.summary()
        assert kate.result.stopped in ("stopped", "stopping")
        await hub.wait_stopped("kate")
        assert gus.decision.action == KEEP and "mean 0.60" in gus.decision.summary()
        assert (await hub.server("gus"))["ready"]
    finally:
        await c.close()


async def test_the_gpu_lease_stops_a_busy_server_warned_without_keep(make_hub):
    lena = Pod(extension=True)
    hub, gpus = await make_hub({"lena": ("a100-80gb", lena, (0.9, 1.0, 40000.0))})  # computing all along
    started = datetime.fromisoformat((await hub.server("lena"))["started"].replace("Z", "+00:00"))
    lease = 3 * 3600 + 300
    c, rec, _ = in_process_culler(hub.api_url, gpus.url, hub.culler_token, f"--GpuCuller.gpu_leases=full={lease}")
    try:
        # 3 hours in: the lease ends in 5 minutes -- warned, kept meanwhile (its GPU computes)
        first = (await cycle(c, started + timedelta(hours=3))).outcome("lena")
        assert first.decision.action == KEEP, first.decision.summary()
        [warning] = lena.notices
        assert warning["warning"] is True and warning["action"] == "server" and warning["keepable"] is False
        assert "GPU lease ends" in warning["reason"] and warning["limit_seconds"] == lease
        assert "warned lena: server stop in 00:05:00" in rec.text() and "whatever happens (its GPU lease ends)" in rec.text()
        # past it: stopped, busy GPU and all -- nothing vetoes the lease
        second = (await cycle(c, started + timedelta(hours=3, minutes=6))).outcome("lena")
        assert second.decision.action == STOP and second.decision.stop_reason == GPU_LEASE, second.decision.summary()
        assert second.result.stopped in ("stopped", "stopping")
        await hub.wait_stopped("lena")
        assert "GPU lease ended" in lena.notices[-1]["reason"] and lena.notices[-1]["warning"] is False
        assert c.metrics.value("gpuspawner_culler_server_stops_total", {"reason": "gpu_lease", "kind": "full"}) == 1
    finally:
        await c.close()


async def test_a_gpu_idle_limit_warning_says_only_gpu_use_counts_and_offers_no_keep(make_hub):
    gil = Pod([busy_kernel()], extension=True)  # says it is busy; its GPU is idle
    hub, gpus = await make_hub({"gil": ("a100-80gb", gil, (0.0, 0.0, 9000.0))})
    c, rec, _ = in_process_culler(hub.api_url, gpus.url, hub.culler_token, "--kind-timeout=full=60", "--gpu-idle-limit=1500")
    start = utcnow() + timedelta(hours=3)
    try:
        for minutes in (0, 10):
            assert (await cycle(c, start + minutes * M)).outcome("gil").decision.action == KEEP
        assert [n for n in gil.notices if n.get("warning")] == []
        # 20 minutes in: its gpu_idle_limit (25 minutes) is within the warning window
        assert (await cycle(c, start + 20 * M)).outcome("gil").decision.action == KEEP
        [warning] = [n for n in gil.notices if n.get("warning")]
        assert warning["keepable"] is False and warning["reason"].endswith("only GPU use counts")
        log = rec.text()
        assert "warned gil: server stop in 00:05:00" in log and "unless the GPU is used (only GPU use counts)" in log
        assert "unless there is activity" not in log
        last = (await cycle(c, start + 30 * M)).outcome("gil")
        assert last.decision.action == STOP and last.decision.stop_reason == GPU_IDLE_LIMIT, last.decision.summary()
    finally:
        await c.close()


async def test_a_pod_that_refuses_its_token_is_not_given_a_new_one_every_view(make_hub):
    rita = Pod(refuse=403)
    hub, gpus = await make_hub({"rita": ("a100-80gb", rita, (0.0, 0.0, 9000.0))})
    c, rec, _ = in_process_culler(hub.api_url, gpus.url, hub.culler_token, "--kind-timeout=full=60")
    start = utcnow() + timedelta(hours=3)
    try:
        for n in range(5):
            o = (await cycle(c, start + n * M)).outcome("rita")
            assert o.decision.action != STOP and o.kernel_view is not None and not o.kernel_view.ok
        # one token, refused, revoked -- and none minted again while the backoff runs
        assert c.metrics.value("gpuspawner_culler_server_tokens_total", {"action": "minted"}) == 1
        assert c.metrics.value("gpuspawner_culler_server_tokens_total", {"action": "revoked"}) == 1
        assert rita.sent["GET kernels"] == 1
        assert "refused its token 1 time(s) in a row" in o.kernel_view.error
        assert "server rita refused its own token (401/403, 1 time(s) in a row)" in rec.text()
        tokens = (await hub.api("GET", "/users/rita/tokens"))["api_tokens"]
        assert not [t for t in tokens if "gpu-culler" in (t["note"] or "")]
        # once the backoff has passed, one more try
        later = c.tokens.monotonic() + c.tokens.REFUSED_BACKOFF_S
        c.tokens.monotonic = lambda: later
        await cycle(c, start + 10 * M)
        assert c.metrics.value("gpuspawner_culler_server_tokens_total", {"action": "minted"}) == 2
        assert rita.sent["GET kernels"] == 2
    finally:
        await c.close()
