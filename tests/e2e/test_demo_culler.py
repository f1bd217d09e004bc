"""The GPU culler as the demo runs it (a managed hub service) with the real GPUSpawner:
an idle MIG server is stopped and its pod goes; a server whose GPU is busy stays,
whatever the hub's last activity says. GPU telemetry: the demo's dcgm-exporter stand-in,
scraped by the real Prometheus (there is no GPU here).

The same run then checks the admin's view: every panel of the Grafana dashboard and
the alerting rules' expressions (charts/gpuspawner/monitoring/) are evaluated by the
demo's Prometheus over what just happened, and return the series they should."""

from __future__ import annotations

import json
import math
import secrets
import time
import urllib.error
import urllib.request

import pytest

from gpuspawner.devcluster.ports import free_port
from gpuspawner.devcluster.prometheus import DASHBOARD_FILE, Prometheus
from gpuspawner.tools.demo import NAMESPACE, running_demo

pytestmark = pytest.mark.cluster
CULLER_ARGS = (
    "--cull-every=5 --timeout=900 --kernel-timeout=300 --kind-timeout=mig=15 --kind-timeout=full=15 "
    "--kind-timeout=shared=900 --gpu-window=40 --gpu-min-samples=3"
)


def call(demo, token, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        f"{demo.api_url}{path}", data=data, method=method, headers={"Authorization": f"token {token}", "Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else None


@pytest.mark.timeout(900)  # (three waits for events, each bounded for a loaded machine: a full run under load took 180 s)
def test_idle_mig_server_is_culled_and_a_busy_gpu_is_not():
    token = secrets.token_hex(16)
    env = {"GPUSPAWNER_DEMO_API_TOKEN": token, "GPUSPAWNER_DEMO_CULLER_ARGS": CULLER_ARGS}
    with running_demo(port=free_port(), hub_port=free_port(), quiet=True, extra_env=env, scrape_interval="1s") as demo:
        started = time.time()
        # The time-to-schedule series scraped at 0 before the first spawn (a series first scraped at 1
        # shows Prometheus no increase, and on a quiet machine both spawns can finish before the first
        # scrape of the hub)
        demo.prometheus.wait_for(
            lambda: len(demo.prometheus.query('gpuspawner_time_to_schedule_seconds_count{kind=~"mig|full"} == 0')) >= 2,
            "the hub's time-to-schedule series scraped at 0",
        )

        def pods():
            return {
                p["metadata"]["labels"]["hub.jupyter.org/username"]: p
                for p in demo.cluster.client().request(
                    "GET", f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=component=singleuser-server"
                )["items"]
            }

        call(demo, token, "POST", "/users/student1/server", {"offering": "mig-nvidia-a100-sxm4-40gb-1g-5gb"})
        deadline = time.monotonic() + 120
        while "student1" not in pods():
            assert time.monotonic() < deadline, (demo.state / "jupyterhub.log").read_text()[-3000:]
            time.sleep(0.2)
        # researcher1's GPU computes from the moment its pod runs. Its name: KubeSpawner's with the six
        # characters of the demo hub's identity that every pod name of this hub ends with (student1's).
        suffix = pods()["student1"]["metadata"]["name"].removeprefix("jupyter-student1-")
        assert len(suffix) == 6, suffix
        demo.telemetry.active.add(f"jupyter-researcher1-{suffix}")
        call(demo, token, "POST", "/users/researcher1/server", {"offering": "gpu-nvidia-h100-80gb-hbm3", "count": 1})
        deadline = time.monotonic() + 300  # both servers ready (each a real jupyterhub-singleuser: slow to start on a loaded machine)
        while not all(call(demo, token, "GET", f"/users/{u}")["servers"].get("", {}).get("ready") for u in ("student1", "researcher1")):
            assert time.monotonic() < deadline, (demo.state / "jupyterhub.log").read_text()[-3000:]
            time.sleep(1)
        assert pods()["researcher1"]["metadata"]["name"] in demo.telemetry.active

        deadline = time.monotonic() + 180
        while call(demo, token, "GET", "/users/student1")["servers"]:
            assert time.monotonic() < deadline, (
                "the idle MIG server was not culled:\n" + (demo.state / "jupyterhub.log").read_text()[-4000:]
            )
            time.sleep(2)
        while "student1" in pods():
            assert time.monotonic() < deadline, "the culled server's pod is still there"
            time.sleep(1)
        # The busy one outlived the same timeout by far, and is still running.
        assert call(demo, token, "GET", "/users/researcher1")["servers"][""]["ready"]
        assert "researcher1" in pods()
        log = (demo.state / "jupyterhub.log").read_text()
        assert "gpu-culler" in log

        # a third GPU beyond researcher1's quota of 2: refused, and counted
        try:
            call(demo, token, "POST", "/users/researcher1/servers/second", {"offering": "gpu-nvidia-h100-80gb-hbm3", "count": 2})
            refused = None
        except urllib.error.HTTPError as exc:
            refused = exc.code
        assert refused is not None and 400 <= refused < 500, refused
        check_dashboard_and_rules(demo.prometheus, started)


# -- the admin's view, from the real Prometheus ---------------------------------------------
MIG = "mig-nvidia-a100-sxm4-40gb-1g-5gb"
H100 = "gpu-nvidia-h100-80gb-hbm3"


def grafana(expr: str, range_s: int) -> str:
    """The panel's PromQL with Grafana's variables as Grafana fills them in (1 s steps)."""
    for var, value in (("$__rate_interval", "20s"), ("$__interval_ms", "1000"), ("$__interval", "1s"), ("$__range", f"{range_s}s")):
        expr = expr.replace(var, value)
    return expr


def panel_series(prom: Prometheus, panel: dict, start: float, end: float) -> dict[str, list[float]]:
    """legend -> the values over [start, end] of each of the panel's queries (Grafana's
    legendFormat filled in); instant panels are evaluated once, at ``end``."""
    out: dict[str, list[float]] = {}
    for target in panel["targets"]:
        expr = grafana(target["expr"], int(end - start))
        if target.get("instant"):
            results = [{"metric": r["metric"], "values": [r["value"]]} for r in prom.query(expr, at=end)]
        else:
            results = prom.query_range(expr, start, end, 1)
        for r in results:
            legend = target["legendFormat"]
            for k, v in r["metric"].items():
                legend = legend.replace("{{" + k + "}}", v)
            out[legend] = [float(v) for _, v in r["values"] if not math.isnan(float(v))]
    return out


def check_dashboard_and_rules(prom: Prometheus, started: float) -> None:
    # wait until the stop is counted in the culler's metrics and scraped
    prom.wait_for(lambda: prom.query('sum(gpuspawner_culler_server_stops_total{reason="idle",kind="mig"}) > 0'), "the cull scraped")
    prom.wait_scrapes("jupyterhub", 2)
    end = time.time()
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    panels = {p["title"]: panel_series(prom, p, started, end) for p in dashboard["panels"]}
    seen = {title: sorted(series) for title, series in panels.items()}

    capacity = panels["Capacity and free, by offering"]
    assert max(capacity[f"{MIG} capacity"]) >= 1 and max(capacity[f"{H100} capacity"]) >= 1, seen
    assert min(capacity[f"{H100} free"]) < max(capacity[f"{H100} capacity"]), "researcher1's H100 was never counted as taken"

    def peak(title: str, legend: str) -> float:
        values = panels[title].get(legend)
        assert values, f"{title!r} has no series {legend!r}: {seen[title]}"
        return max(values)

    by_offering = "GPUs held vs active, by offering"
    assert peak(by_offering, f"{H100} held") == 1 and peak(by_offering, f"{H100} active") == 1
    assert peak(by_offering, f"{MIG} held") == 1 and peak(by_offering, f"{MIG} active") == 0
    by_user = "GPUs held vs active, by user"
    assert peak(by_user, "student1 held") == 1 and peak(by_user, "student1 active") == 0
    assert peak(by_user, "researcher1 held") == 1 and peak(by_user, "researcher1 active") == 1
    by_group = "GPUs held vs active, by group"
    assert peak(by_group, "students held") == 1 and peak(by_group, "students active") == 0
    assert peak(by_group, "researchers held") == 1 and peak(by_group, "researchers active") == 1
    idle_hours = panels["Idle GPU-hours held, by user"]
    assert idle_hours["student1"][0] > 0 and idle_hours.get("researcher1", [0])[0] == 0, idle_hours
    memory = "GPU memory held idle, and reclaimed"
    assert peak(memory, f"{MIG} held idle") == 1536  # the stand-in's memory per notebook
    assert peak(memory, "reclaimed by server_stop") > 0, [
        (r["metric"]["__name__"], r["values"][:3], len(r["values"]))
        for r in prom.query_range(
            "gpuspawner_culler_gpu_memory_reclaimed_mib_total or gpuspawner_culler_server_stops_total", started, end, 1
        )
    ]
    assert peak("Culls and kernel reclaims, by reason", "server stop: idle (mig)") > 0
    assert peak("Spawn refusals, by reason", "quota") > 0
    assert any(panels["Time from spawn to scheduled"].get(f"p50 {kind}") for kind in ("mig", "full")), seen
    health = panels["Culler health"]
    assert health["GPU view up"][-1] == 1 and health["seconds since last cycle"][-1] >= 0

    # the alerts' expressions, on the same data: nothing fires (one idle GPU is below the
    # threshold, the culler runs and reads GPU metrics), while their inputs are there
    assert prom.query("sum(gpuspawner:server_gpus_idle) > 4", at=end) == []
    assert max(float(v) for _, v in prom.query_range("sum(gpuspawner:server_gpus_idle)", started, end, 1)[0]["values"]) == 1
    assert prom.query("max(gpuspawner_culler_gpu_view_up) == 0", at=end) == []
    assert (
        prom.query(
            "absent(gpuspawner_culler_last_cycle_timestamp_seconds) or "
            "(time() - max(gpuspawner_culler_last_cycle_timestamp_seconds) > 900)",
            at=end,
        )
        == []
    )
    firing = prom.api("alerts", {})["alerts"]
    assert [a for a in firing if a["state"] == "firing"] == []
    groups = {g["name"]: g for g in prom.api("rules", {})["groups"]}
    assert sorted(groups) == ["gpuspawner.alerts", "gpuspawner.recording"]
    assert all(r["health"] == "ok" for g in groups.values() for r in g["rules"]), groups
