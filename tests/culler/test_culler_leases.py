"""GPU leases users extend, leases that end by reclaiming kernels, and GPU-hour budgets that run
out while a notebook runs (issue #28), on a REAL JupyterHub with configurable-http-proxy whose
servers are loopback pods (tests/culler/loopback_pods.py), and the culler in the test's process
reading its GPU view -- and the hub's budget figures, in the rows Prometheus gives for its
query -- from Prometheus' HTTP API on loopback.

The culler's clock is the test's: cycles run at chosen times (no sleeps). The hub page where
users extend a lease, and the hub's real budget series through the real Prometheus, are in
tests/e2e/test_leases.py and tests/e2e/test_budgets.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpuspawner.culler.leases import LeaseRefused
from gpuspawner.culler.policy import KEEP, RECLAIM, STOP
from gpuspawner.culler.records import BUDGET, GPU_LEASE
from tests.culler.culler_hub import in_process_culler
from tests.culler.loopback_pods import Pod, idle_kernels
from tests.culler.test_culler_gpu_use import busy_kernel, cycle

pytestmark = pytest.mark.asyncio(loop_scope="session")
M = timedelta(minutes=1)
H = timedelta(hours=1)


async def started_at(hub, user: str) -> datetime:
    return datetime.fromisoformat((await hub.server(user))["started"].replace("Z", "+00:00"))


async def test_an_extended_lease_ends_later_warned_and_a_restarted_culler_keeps_the_extension(make_hub, tmp_path):
    lena = Pod(extension=True)
    hub, gpus = await make_hub({"lena": ("a100-80gb", lena, (0.9, 1.0, 40000.0))})  # computing all along
    started = await started_at(hub, "lena")
    args = (
        "--GpuCuller.gpu_leases=full=3600",
        "--gpu-lease-extensions=1",
        "--gpu-lease-extension=1800",
        "--GpuCuller.warn_before_seconds=300",
        f"--GpuCuller.action_log_path={tmp_path / 'actions.jsonl'}",
    )
    c, _, _ = in_process_culler(hub.api_url, gpus.url, hub.culler_token, *args)
    try:
        # half an hour in: the notebook is told when the lease ends, and that it may be extended
        assert (await cycle(c, started + 30 * M)).outcome("lena").decision.action == KEEP
        [lease] = c.lease_list("lena")
        assert lease["ends_at"] == (started + H).isoformat() and lease["can_extend"] and lease["extensions_left"] == 1
        assert lena.notices[-1]["lease"]["can_extend"] is True and lena.notices[-1]["warning"] is False
        assert c.lease_list("someone-else") == []
        answer = c.extend_lease("lena", "")
        assert answer["lease"]["ends_at"] == (started + 90 * M).isoformat() and answer["lease"]["can_extend"] is False
        until = f"{(started + 90 * M).astimezone(UTC):%b %d %H:%M}"
        assert (
            answer["message"]
            == f"The GPU lease of your server was extended by 30 minutes, until {until} UTC (the last extension of this lease)."
        )
        with pytest.raises(LeaseRefused) as again:
            c.extend_lease("lena", "")
        assert again.value.status == 409 and "its one extension is used" in str(again.value)
        with pytest.raises(LeaseRefused) as nobody:
            c.extend_lease("lena", "other")
        assert nobody.value.status == 404
    finally:
        await c.close()

    # a restarted culler reads the extension back: at the lease's first end, kept
    c, rec, _ = in_process_culler(hub.api_url, gpus.url, hub.culler_token, *args)
    try:
        assert (await cycle(c, started + 61 * M)).outcome("lena").decision.action == KEEP
        # warned five minutes before the extended end, without "Keep" or "Extend"
        assert (await cycle(c, started + 85 * M)).outcome("lena").decision.action == KEEP
        warning = lena.notices[-1]
        assert warning["warning"] is True and warning["cause"] == GPU_LEASE and warning["keepable"] is False
        assert "1 hours 30 minutes (with 1 extension) at most" in warning["reason"] or "90 minutes (with 1 extension)" in warning["reason"]
        assert warning["lease"]["can_extend"] is False
        last = (await cycle(c, started + 91 * M)).outcome("lena")
        assert last.decision.action == STOP and last.decision.stop_reason == GPU_LEASE, last.decision.summary()
        await hub.wait_stopped("lena")
        records = c.action_log.entries("lena")
        assert [r["action"] for r in records] == ["server_stopped", "lease_extended"]
        assert records[0]["why"].startswith("the server's GPU lease ended: the whole GPU may be held for 90 minutes (with 1 extension)")
        assert "warned lena: server stop in 00:05:00" in rec.text()
    finally:
        await c.close()


async def test_a_lease_that_ends_with_a_reclaim_shuts_busy_kernels_down_and_begins_again(make_hub):
    kernels = [busy_kernel(), *idle_kernels(1, 5 * M)]
    tess = Pod(kernels, extension=True)
    hub, gpus = await make_hub({"tess": ("t4-shared", tess, (0.9, 1.0, 6000.0))})
    started = await started_at(hub, "tess")
    c, _, _ = in_process_culler(
        hub.api_url,
        gpus.url,
        hub.culler_token,
        "--offering-gpu-lease=t4-shared=3600",
        "--offering-gpu-lease-ends=t4-shared=reclaim",
        "--GpuCuller.warn_before_seconds=300",
    )
    try:
        assert (await cycle(c, started + 56 * M)).outcome("tess").decision.action == KEEP
        warning = tess.notices[-1]
        assert warning["warning"] is True and warning["action"] == "kernels" and warning["cause"] == GPU_LEASE
        assert warning["reason"].endswith("the server stays, and a new lease begins with new kernels")
        end = (await cycle(c, started + 61 * M)).outcome("tess")
        assert end.decision.action == RECLAIM and end.decision.stop_reason == GPU_LEASE, end.decision.summary()
        assert sorted(end.result.kernels_shut_down) == sorted(k["id"] for k in kernels)  # the busy one too
        assert tess.notices[-1]["cause"] == GPU_LEASE and sorted(tess.notices[-1]["reclaimed"]) == sorted(k["id"] for k in kernels)
        [record] = c.action_log.entries("tess")
        assert record["reason"] == GPU_LEASE and record["what"] == "2 kernels of your server were shut down"
        # the server stays; a new lease runs from the reclaim
        assert (await hub.server("tess"))["ready"]
        assert (await cycle(c, started + 62 * M)).outcome("tess").decision.action == KEEP
        [lease] = c.lease_list("tess")
        assert lease["ends_at"] == (started + 121 * M).isoformat() and lease["ends_with"] == "reclaim"
    finally:
        await c.close()


async def test_a_budget_that_runs_out_while_the_notebook_runs_is_warned_then_stopped(make_hub, tmp_path):
    bud = Pod(extension=True)
    hub, gpus = await make_hub({"bud": ("a100-80gb", bud, (0.9, 1.0, 40000.0))})  # busy: only the budget ends it
    start = await started_at(hub, "bud") + M
    c, rec, _ = in_process_culler(hub.api_url, gpus.url, hub.culler_token, "--GpuCuller.warn_before_seconds=300")
    try:
        gpus.budgets = {"bud": (2.0, 1.0)}  # two hours left: nothing to say
        assert (await cycle(c, start)).outcome("bud").decision.action == KEEP
        assert not [n for n in bud.notices if n.get("warning")]
        # the hub's figure, a while later: 3 minutes left -- warned for 5 minutes from now
        gpus.budgets = {"bud": (0.05, 1.0)}
        assert (await cycle(c, start + H)).outcome("bud").decision.action == KEEP
        warning = bud.notices[-1]
        assert warning["warning"] is True and warning["cause"] == BUDGET and warning["keepable"] is False
        assert (
            warning["reason"] == "your GPU-hour budget runs out (spending 1 GPU-hours per hour); a new start is refused until it frees up"
        )
        assert "the GPU-hour budget of bud runs out at" in rec.text()
        # it ran out 3 minutes in, but the warning said 5: kept until then
        gpus.budgets = {"bud": (-0.02, 1.0)}
        assert (await cycle(c, start + H + 4 * M)).outcome("bud").decision.action == KEEP
        last = (await cycle(c, start + H + 5 * M)).outcome("bud")
        assert last.decision.action == STOP and last.decision.stop_reason == BUDGET, last.decision.summary()
        await hub.wait_stopped("bud")
        [record] = c.action_log.entries("bud")
        assert record["reason"] == BUDGET and record["what"] == "Your server was stopped"
        assert record["why"].startswith("your GPU-hour budget ran out")
        assert c.metrics.value("gpuspawner_culler_server_stops_total", {"reason": "budget", "kind": "full"}) == 1
    finally:
        await c.close()


async def test_a_cost_budget_that_runs_out_is_warned_then_stopped_and_a_server_without_a_price_is_not(make_hub, tmp_path):
    """The same with a cost budget (money left and spent per hour, as the hub exports them):
    cash's priced A100 is warned, then stopped, in words of the cost budget; tina's T4 share,
    which has no price, spends nothing of hers and is kept, though her cost budget ran out too."""
    cash, tina = Pod(extension=True), Pod(extension=True)
    busy = (0.9, 1.0, 40000.0)
    hub, gpus = await make_hub({"cash": ("a100-80gb", cash, busy), "tina": ("t4-shared", tina, busy)})
    start = await started_at(hub, "cash") + M
    c, rec, _ = in_process_culler(
        hub.api_url,
        gpus.url,
        hub.culler_token,
        "--GpuCuller.warn_before_seconds=300",
        f"--GpuCuller.action_log_path={tmp_path / 'a.jsonl'}",
    )
    try:
        gpus.cost_budgets = {"cash": (10.0, 5.0), "tina": (-1.0, 0.0)}  # two hours left at 5.00 an hour
        assert (await cycle(c, start)).outcome("cash").decision.action == KEEP
        assert not [n for n in cash.notices if n.get("warning")]
        gpus.cost_budgets = {"cash": (0.25, 5.0), "tina": (-1.0, 0.0)}  # 3 minutes left: warned for 5
        outcome = await cycle(c, start + H)
        assert outcome.outcome("cash").decision.action == KEEP and outcome.outcome("tina").decision.action == KEEP
        warning = cash.notices[-1]
        assert warning["warning"] is True and warning["cause"] == BUDGET and warning["keepable"] is False
        assert warning["reason"] == "your cost budget runs out (spending 5 per hour); a new start is refused until it frees up"
        assert "the cost budget of cash runs out at" in rec.text()
        assert not [n for n in tina.notices if n.get("warning")]
        gpus.cost_budgets = {"cash": (-0.1, 5.0), "tina": (-1.0, 0.0)}
        assert (await cycle(c, start + H + 4 * M)).outcome("cash").decision.action == KEEP
        last = await cycle(c, start + H + 5 * M)
        assert last.outcome("cash").decision.action == STOP and last.outcome("cash").decision.stop_reason == BUDGET
        assert "its user's cost budget ran out" in last.outcome("cash").decision.summary()
        assert last.outcome("tina").decision.action == KEEP
        await hub.wait_stopped("cash")
        [record] = c.action_log.entries("cash")
        assert record["reason"] == BUDGET and record["what"] == "Your server was stopped"
        assert record["why"] == "your cost budget ran out (spending 5 per hour); a new start is refused until it frees up"
        assert c.action_log.entries("tina") == [] and (await hub.server("tina"))["ready"]
        assert c.metrics.value("gpuspawner_culler_server_stops_total", {"reason": "budget", "kind": "full"}) == 1
    finally:
        await c.close()
