"""GPU-hour budgets (issue #28) on the demo stack: the real GPUSpawner, its REST API and spawn
page, and a real Prometheus holding a known history (backfilled with promtool, as in
tests/integration/test_report.py).

students: 5 GPU-hours in the last 7 days; a MIG 1g.5gb hour costs 0.5 (``gpu_hour_cost``).
student1 held one slice for 10 hours, ending two hours ago or more: 10 x 0.5 = 5 GPU-hours,
so one more hour does not fit. researchers: 0.5 GPU-hours a day.

1. From Prometheus: the spawn page shows student1's budget, its source and each offering's
   cost per hour, and the slice disabled; a REST API spawn is refused with 429 and the numbers.
2. From the fallback: Prometheus goes down; researcher1 starts a slice (0.5 of 0.5 GPU-hours
   a day fits), and a second server of theirs is refused with 429 from the hub's own record,
   which counts the first one's running time.
3. A cost budget (another demo hub): students 12.50 in the last 7 days, the slice at 1.25 an
   hour: student1's 10 hours spent it all, measured by Prometheus; refused in money.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from gpuspawner.culler.gpu_metrics import parse_query_response
from gpuspawner.culler.gpu_query import GpuQuerySettings, build_query
from gpuspawner.devcluster.prometheus import Prometheus
from tests.conftest import wait_for
from tests.e2e.demo_stack import demo_with_token, login, spawn_page

pytestmark = pytest.mark.cluster
SLICE = "mig-nvidia-a100-sxm4-40gb-1g-5gb"
HOUR = 3600
STEP = 60

EXTRA_CONFIG = """
c = get_config()
c.GPUSpawner.offering_overrides.update({{"{slice}": {{"groups": ["students", "researchers"], "gpu_hour_cost": 0.5}}}})
c.GPUSpawner.group_gpu_budgets = {{
    "students": {{"hours": 5, "window": "rolling-7d"}},
    "researchers": {{"hours": 0.5, "window": "day"}},
}}
c.GPUSpawner.budget_prometheus_url = "{prometheus}"
c.GPUSpawner.hub_id = "{hub_id}"  # the history below is this hub's (budgets select on the identity)
"""
HUB_ID = "budget-demo"


def history(end: int) -> str:
    """student1 held one slice for the 10 hours before ``end``: one sample a minute, stamped at the minute's end."""
    labels = (
        f'namespace="gpuspawner-demo",pod="jupyter-student1",user="student1",group="students",offering="{SLICE}",kind="mig",hub="{HUB_ID}"'
    )
    lines = [f"gpuspawner_server_gpus{{{labels}}} 1 {t}" for t in range(end - 10 * HOUR + STEP, end + 1, STEP)]
    return "\n".join(["# TYPE gpuspawner_server_gpus gauge", *lines, "# EOF"]) + "\n"


def call(demo, method, path, body=None):
    """(status, JSON answer) of a hub REST API call."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": f"token {demo.token}", "Content-Type": "application/json"}
    request = urllib.request.Request(f"{demo.api_url}{path}", data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        answer = json.loads(exc.read() or b"null")
        if exc.code >= 500:  # never: say why, from the hub's log
            pytest.fail(f"{method} {path}: {exc.code} {answer}\n" + (demo.state / "jupyterhub.log").read_text()[-6000:])
        return exc.code, answer


def post_form(demo, user: str, offering: str) -> tuple[int, str]:
    """(status, page) of the spawn form posted by ``user`` with ``offering`` chosen."""
    opener, xsrf = login(demo, user)
    form = urllib.parse.urlencode({"offering": offering, "_xsrf": xsrf}).encode()
    try:
        with opener.open(f"{demo.url}/hub/spawn", data=form, timeout=60) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def hub_metrics(demo) -> str:
    request = urllib.request.Request(f"{demo.url}/hub/metrics", headers={"Authorization": f"token {demo.token}"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        return resp.read().decode()


def culler_view(demo):
    """The culler's GPU view (its one query) as the demo's Prometheus answers it now."""
    settings = GpuQuerySettings()
    query = urllib.parse.urlencode({"query": build_query(settings)})
    with urllib.request.urlopen(f"{demo.prometheus.url}/api/v1/query?{query}", timeout=30) as resp:
        return parse_query_response(json.loads(resp.read()), settings)


def running(demo, user: str, name: str = "") -> bool:
    server = call(demo, "GET", f"/users/{user}")[1]["servers"].get(name)
    return bool(server and server.get("ready"))


@contextlib.contextmanager
def budget_demo(tmp_path_factory, template: str) -> Iterator[tuple[Prometheus, Any]]:
    """A Prometheus holding :func:`history` and the demo stack with ``template``'s settings on it."""
    end = (int(time.time()) // HOUR - 2) * HOUR
    prometheus = Prometheus(tmp_path_factory.mktemp("budgets") / "prometheus", [], extra_args=["--query.lookback-delta=1m"])
    prometheus.backfill(history(end))
    with prometheus:
        config = template.format(slice=SLICE, prometheus=prometheus.url, hub_id=HUB_ID)
        with demo_with_token(tmp_path_factory, config, culler=False) as demo:
            yield prometheus, demo


def test_budget_from_prometheus_then_from_the_hubs_own_record(tmp_path_factory):
    with budget_demo(tmp_path_factory, EXTRA_CONFIG) as (prometheus, demo):
        # 1. the spawn page shows the budget, where the figure came from, and what an hour costs
        page = spawn_page(demo, "student1")
        shown = r"Your GPU budget: (5|5\.0\d|4\.99) of 5 GPU-hours used in the last 7 days \((0|0\.01) left; measured by Prometheus\)\."
        assert re.search(shown, page), page
        assert "0.5 GPU-hours of budget per hour" in page
        assert "over your GPU-hour budget" in page

        # ... and the REST API refuses the spawn with 429 and the numbers, from Prometheus
        status, answer = call(demo, "POST", "/users/student1/server", {"offering": SLICE})
        assert status == 429, answer
        message = answer["message"]
        used = float(re.match(r"You used ([\d.]+) of 5 GPU-hours in the last 7 days; ", message).group(1))
        assert used == pytest.approx(5, abs=0.02)
        assert "costs 0.5 GPU-hours" in message and message.endswith("(Usage measured by Prometheus.)")
        assert not running(demo, "student1")
        # ... and so does the form: shown again with the same words
        status, page = post_form(demo, "student1", SLICE)
        assert status == 429 and "You used " in page and "of 5 GPU-hours in the last 7 days" in page, page[-3000:]
        assert not running(demo, "student1")
        metrics = (
            urllib.request.urlopen(
                urllib.request.Request(f"{demo.url}/hub/metrics", headers={"Authorization": f"token {demo.token}"}), timeout=30
            )
            .read()
            .decode()
        )
        remaining = re.search(r'gpuspawner_budget_remaining_hours\{name="student1",user="student1",window="rolling-7d"\} (\S+)', metrics)
        assert remaining and float(remaining.group(1)) < 0.02
        refused = [line for line in metrics.splitlines() if line.startswith("gpuspawner_refusals_total") and 'reason="budget"' in line]
        assert f'gpuspawner_refusals_total{{kind="mig",offering="{SLICE}",reason="budget"}} 1.0' in refused, refused

        # 2. Prometheus goes down: the hub counts from its own record
        prometheus.stop()
        status, answer = call(demo, "POST", "/users/researcher1/server", {"offering": SLICE})
        assert status in (201, 202), answer
        wait_for(lambda: running(demo, "researcher1"), "researcher1's server running", timeout=180, interval=0.5)
        status, answer = call(demo, "POST", "/users/researcher1/servers/two", {"offering": SLICE})
        assert status == 429, answer
        message = answer["message"]
        assert re.match(r"You used (less than 0\.01|0\.0\d) of 0\.5 GPU-hours today; an hour of .* costs 0\.5 GPU-hours; ", message)
        assert "the next hour frees up on " in message and message.endswith("00:00. (Usage from the hub's own record.)")
        # the exported figures go on at the running server's rate: used grows, left shrinks
        used = re.search(r'gpuspawner_budget_used_hours\{source="hub-record",user="researcher1",window="day"\} (\S+)', hub_metrics(demo))
        left = re.search(
            r'gpuspawner_budget_remaining_hours\{name="researcher1",user="researcher1",window="day"\} (\S+)', hub_metrics(demo)
        )
        assert used and left and 0 < float(used.group(1)) < 0.1 and 0.4 < float(left.group(1)) < 0.5
        # ... and reach the culler: its own query, asked of the demo's Prometheus (which scrapes the hub)
        budgets = wait_for(
            lambda: culler_view(demo).budgets.get("researcher1"), "researcher1's budget in the culler's view", timeout=120, interval=1
        )
        assert 0.4 < budgets[0] < 0.5 and budgets[1] == 0.5, budgets
        page = spawn_page(demo, "researcher1", "two")  # (their default server runs: its page is JupyterLab)
        assert "of 0.5 GPU-hours used today" in page and "from the hub&#39;s own record" in page
        call(demo, "DELETE", "/users/researcher1/server")
        wait_for(lambda: call(demo, "GET", "/users/researcher1")[1]["servers"] == {}, "researcher1's server stopped", timeout=120)


COST_CONFIG = """
c = get_config()
c.GPUSpawner.offering_overrides.update({{"{slice}": {{"groups": ["students"], "price_per_hour": 1.25}}}})
c.GPUSpawner.group_gpu_budgets = {{"students": {{"cost": 12.5, "window": "rolling-7d"}}}}  # a cost budget only
c.GPUSpawner.budget_prometheus_url = "{prometheus}"
c.GPUSpawner.hub_id = "{hub_id}"
"""


def test_a_cost_budget_from_prometheus(tmp_path_factory):
    """The cost budget on the demo stack: student1's 10 slice-hours at 1.25 are 12.50 of their
    12.50, measured by Prometheus; the page says so and disables the slice, the REST API refuses
    with 429 in money, and the hub exports the price and the figures, which reach the culler."""
    with budget_demo(tmp_path_factory, COST_CONFIG) as (_, demo):
        page = spawn_page(demo, "student1")
        shown = r"Your cost budget: (12\.5\d|12\.4\d) of 12\.50 spent in the last 7 days \(0\.0\d left; measured by Prometheus\)\."
        assert re.search(shown, page), page
        assert "over your cost budget" in page and "1.25 per hour" in page
        status, answer = call(demo, "POST", "/users/student1/server", {"offering": SLICE})
        assert status == 429, answer
        message = answer["message"]
        assert re.match(r"You spent 12\.\d\d of your cost budget of 12\.50 in the last 7 days; an hour of .* costs 1\.25", message)
        assert message.endswith("(Usage measured by Prometheus.)")
        metrics = hub_metrics(demo)
        assert f'gpuspawner_offering_price_per_hour{{hub="{HUB_ID}",kind="mig",offering="{SLICE}"}} 1.25' in metrics
        spent = re.search(r'gpuspawner_cost_budget_used\{source="prometheus",user="student1",window="rolling-7d"\} (\S+)', metrics)
        assert spent and float(spent.group(1)) == pytest.approx(12.5, abs=0.05)
        # left, and spent per hour (nothing runs), as for the GPU-hour budget: the culler stops a
        # user's priced servers when it runs out (its own query, asked of the demo's Prometheus,
        # which scrapes the hub)
        left = re.search(r'gpuspawner_cost_budget_remaining\{name="student1",user="student1",window="rolling-7d"\} (\S+)', metrics)
        assert left and float(left.group(1)) < 0.1
        assert 'gpuspawner_cost_budget_spend_rate{name="student1",user="student1",window="rolling-7d"} 0.0' in metrics
        figures = wait_for(
            lambda: culler_view(demo).cost_budgets.get("student1"), "student1's cost budget in the culler's view", timeout=120, interval=1
        )
        assert figures[0] < 0.1 and figures[1] == 0.0, figures
