"""GPU-hour and cost budgets counted from the hub's own record (no Prometheus), with the real
GPUSpawner on the devcluster: a GPU server's start and stop go into its ledger (its cost and its
price per hour), the ledger is in the state the hub saves, and a spawner made from that state (as
a restarted hub makes it) counts it: the next spawn is refused with 429 and the numbers. The pod
gets the figures the user's GPU view shows."""

from __future__ import annotations

import re

import pytest

from gpuspawner.hub import budgets
from gpuspawner.hub.scheduling import SpawnRefused
from gpuspawner.hub.spawnstate import user_label
from gpuspawner.spawner import GPUSpawner
from tests.integration.test_spawner import make_spawner, pod_of

pytestmark = pytest.mark.cluster
SLICE = "mig-nvidia-a100-sxm4-40gb-1g-5gb"
SETTINGS = {
    "user_gpu_budget": {"hours": 0.5, "window": "rolling-7d"},
    "offering_overrides": {SLICE: {"gpu_hour_cost": 0.5}},
}
#: a cost budget only (no GPU-hours): one hour of the slice at its price fits, the second does not
COST_SETTINGS = {
    "user_gpu_budget": {"cost": 1.5, "window": "rolling-7d"},
    "offering_overrides": {SLICE: {"price_per_hour": 1.5}},
}


def restarted(spawner: GPUSpawner) -> GPUSpawner:
    """What JupyterHub does after a stop (clear the state, then save it), and a restarted hub's
    new spawner object for the same server, from the saved state."""
    spawner.clear_state()
    saved = spawner.get_state()
    [row] = saved["gpu_usage"]
    assert row["end"] is not None and row["end"] > row["start"]
    again = GPUSpawner(hub=spawner.hub, user=spawner.user, config=spawner.config)
    again.server = spawner.user.server
    again.load_state(saved)
    return again


async def refused_start(spawner: GPUSpawner) -> str:
    """The 429's words of a start of the slice."""
    spawner.user_options = {"offering": SLICE}
    with pytest.raises(SpawnRefused) as refused:
        await spawner.start()
    assert refused.value.status_code == 429
    return str(refused.value)


async def test_the_ledger_is_saved_with_the_state_and_counted_after_a_restart(devcluster, namespace):
    spawner = make_spawner(devcluster, namespace, **SETTINGS)
    spawner.user_options = {"offering": SLICE}
    await spawner.start()  # 0 used + 0.5 for an hour fits the 0.5 budget
    try:
        env = {e["name"]: e.get("value") for e in (await pod_of(spawner))["spec"]["containers"][0]["env"]}
        assert env["GPUSPAWNER_BUDGET_HOURS"] == "0.5" and env["GPUSPAWNER_BUDGET_WINDOW"] == "rolling-7d"
        assert env["GPUSPAWNER_BUDGET_USED"] == "0.0000" and env["GPUSPAWNER_BUDGET_COST"] == "0.5"
        assert env["GPUSPAWNER_BUDGET_SOURCE"] == "hub-record"
        [row] = spawner.get_state()["gpu_usage"]
        assert row["end"] is None and row["cost"] == 0.5
    finally:
        await spawner.stop(now=True)
    message = await refused_start(restarted(spawner))
    assert re.match(r"You used (less than 0\.01|0\.\d+) of 0\.5 GPU-hours in the last 7 days; an hour of ", message), message
    assert "costs 0.5 GPU-hours; the next hour frees up on " in message
    assert message.endswith("(Usage from the hub's own record.)")


async def test_a_cost_budget_is_kept_in_the_ledger_and_refuses_with_429(devcluster, namespace):
    spawner = make_spawner(devcluster, namespace, **COST_SETTINGS)
    spawner.user_options = {"offering": SLICE}
    await spawner.start()  # 0 spent + 1.50 for an hour fits the 1.50 budget
    try:
        assert "Cost budget: 0.00 of 1.50 spent; this server costs 1.50 per hour." in spawner.spawn_state.messages
        env = {e["name"]: e.get("value") for e in (await pod_of(spawner))["spec"]["containers"][0]["env"]}
        assert env["GPUSPAWNER_COST_BUDGET"] == "1.5" and env["GPUSPAWNER_COST_BUDGET_WINDOW"] == "rolling-7d"
        assert env["GPUSPAWNER_COST_BUDGET_SPENT"] == "0.0000" and env["GPUSPAWNER_COST_BUDGET_PRICE"] == "1.5"
        assert env["GPUSPAWNER_COST_BUDGET_SOURCE"] == "hub-record" and "GPUSPAWNER_BUDGET_HOURS" not in env
        [row] = spawner.get_state()["gpu_usage"]
        assert row["end"] is None and row["price"] == 1.5
        assert budgets.LAST_COST[user_label(spawner.user.name)].budget.hours == 1.5
    finally:
        await spawner.stop(now=True)
    again = restarted(spawner)
    page = await again.get_options_form()  # the spawn page: the budget said, the slice disabled
    assert "Your cost budget: 0.0" in page and "of 1.50 spent in the last 7 days" in page, page
    assert "over your cost budget" in page
    message = await refused_start(again)
    assert re.match(r"You spent 0\.\d\d of your cost budget of 1\.50 in the last 7 days; an hour of ", message), message
    assert "costs 1.50; the next hour frees up on " in message
    assert message.endswith("(Usage from the hub's own record.)")
