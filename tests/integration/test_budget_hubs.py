"""GPU-hour budgets charge a user for this hub's pods only, each pod once (issue 38): the real
GPUSpawner measures its user's usage from a real Prometheus that scrapes two hubs, one of them
twice, with a known history backfilled by promtool (as tests/e2e/test_budgets.py does).

The history (one sample a minute, stamped at the minute's end, ending two hours ago or more):

* this hub (``hub_id`` "hub-a"): the user's pod held 1 unit for 3 hours, scraped by two jobs
  (the hub's ServiceMonitor and a static job, say): two series of the same pod, 3 GPU-hours;
* another hub ("hub-b") in the same namespace, with a user of the same name: 2 units for 3
  hours, 6 GPU-hours that are that hub's business.

The budget is 4.5 GPU-hours in the last 7 days and an hour of the offering costs 1: with this
hub's pods counted once, 3 are used and the spawn goes ahead; counted as before (both hubs, the
doubled series) it would be 12 and refused.
"""

from __future__ import annotations

import time

import pytest

from gpuspawner.devcluster.prometheus import Prometheus
from gpuspawner.hub import budgets
from gpuspawner.hub.spawnstate import user_label
from tests.integration.test_spawner import make_spawner

pytestmark = pytest.mark.cluster
SLICE = "mig-nvidia-a100-sxm4-40gb-1g-5gb"
HOUR = 3600
STEP = 60


def history(user: str, end: int) -> str:
    def series(labels: dict[str, str], value: int) -> list[str]:
        text = ",".join(f'{k}="{v}"' for k, v in labels.items())
        return [f"gpuspawner_server_gpus{{{text}}} {value} {t}" for t in range(end - 3 * HOUR + STEP, end + 1, STEP)]

    pod = {"namespace": "jhub", "user": user, "group": "", "offering": SLICE, "kind": "mig"}
    lines = series({**pod, "pod": "jupyter-a", "hub": "hub-a", "job": "hub", "instance": "10.0.0.1:8081"}, 1)
    lines += series({**pod, "pod": "jupyter-a", "hub": "hub-a", "job": "hub-static", "instance": "hub:8081"}, 1)
    lines += series({**pod, "pod": "jupyter-b", "hub": "hub-b", "job": "hub", "instance": "10.0.0.2:8081"}, 2)
    return "\n".join(["# TYPE gpuspawner_server_gpus gauge", *lines, "# EOF"]) + "\n"


async def test_a_budget_counts_this_hubs_pods_once(devcluster, namespace, tmp_path):
    end = (int(time.time()) // HOUR - 2) * HOUR
    prometheus = Prometheus(tmp_path / "prometheus", [], extra_args=["--query.lookback-delta=1m"])
    spawner = make_spawner(
        devcluster,
        namespace,
        hub_id="hub-a",
        user_gpu_budget={"hours": 4.5, "window": "rolling-7d"},
        budget_prometheus_url="",
        budget_prometheus_timeout=30.0,
    )
    prometheus.backfill(history(user_label(spawner.user.name), end))
    with prometheus:
        spawner.budget_prometheus_url = prometheus.url
        catalog = await spawner.catalog()
        found = await budgets.standing(spawner, catalog)
        assert found is not None and found.source == "prometheus", found
        assert found.used == pytest.approx(3.0, abs=0.02), found  # this hub's pod, once: not 3 x 2 + 6
        # ... so the spawn that one more hour fits goes ahead
        spawner.user_options = {"offering": SLICE}
        await spawner.start()
        try:
            assert any("GPU budget: 3.00 of 4.5 GPU-hours used" in m for m in spawner.spawn_state.messages), spawner.spawn_state.messages
        finally:
            await spawner.stop(now=True)
        # the query as it was (every hub's pods of that user name, each series) says what was wrong with it
        old = f'sum(sum_over_time(sum(gpuspawner_server_gpus{{user="{user_label(spawner.user.name)}"}})[{7 * 24 * HOUR}s:{STEP}s]))'
        [row] = prometheus.query(old)
        assert float(row["value"][1]) * STEP / HOUR == pytest.approx(12.0, abs=0.05)
