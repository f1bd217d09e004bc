"""``gpuspawner report`` against the real Prometheus, with a known history backfilled by
promtool: ten hours at one sample a minute, the expected GPU-hours worked out by hand.

The history (T0 = ten hours before the end; every series has one sample per minute,
stamped at the minute's end, from its start to its end):

* alice (researchers), 2 x H100 (full), T0 to T0+6h; both GPUs busy for the first 2 h
  then quiet: held 2 x 6 = 12, active 2 x 2 = 4, idle 2 x 4 = 8 GPU-hours.
* bob (students), one MIG 1g.10gb slice, the whole 10 h, quiet (engine 0, and GPU_UTIL
  reads 0 on MIG): held 10, active 0, idle 10. Scraped through a Service, so his
  dcgm-exporter series carry exported_pod/exported_namespace.
* carol (students), a time-sliced T4 share, T0+5h to T0+10h, busy by GPU_UTIL only
  (no PROF metrics on that GPU): held 5, active 5, idle 0.
* dave (researchers), one H100, T0+1h to T0+4h, no dcgm-exporter series at all:
  held 3, active 0, idle 0 (3 hours with no data).
* the culler reclaimed 5000 MiB (a server_stop) at T0+6h.
* the hub priced gpu-h100 at 5.00 and mig-1g-10gb at 1.25 per unit-hour the whole time, and
  t4-shared not at all: alice's 12 GPU-hours cost 60, bob's 10 cost 12.50, dave's 3 cost 15,
  carol's 5 have no price.

Each one-minute step counts the minute that ends at it; Prometheus runs with a 1 minute
look-back so that a series that ends is not carried on (a live Prometheus has staleness
markers for that; a backfill has none).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpuspawner.devcluster.prometheus import Prometheus
from gpuspawner.tools.report import ACTIVE, DEVICE_ACTIVE, IDLE, PrometheusAPI, ReportError, build_report, render

HOUR = 3600
STEP = 60


def _series(name: str, labels: dict[str, str], start: int, end: int, value) -> list[str]:
    text = ",".join(f'{k}="{v}"' for k, v in labels.items())
    # one sample per minute held, stamped at the minute's end
    return [f"{name}{{{text}}} {value(t)} {t}" for t in range(start + STEP, end + 1, STEP)]


def history(t0: int) -> str:
    h = lambda n: t0 + int(n * HOUR)  # noqa: E731
    server = lambda user, group, offering, kind, pod: {  # noqa: E731
        "namespace": "jhub",
        "pod": pod,
        "user": user,
        "group": group,
        "offering": offering,
        "kind": kind,
    }
    gpus = []
    gpus += _series("gpuspawner_server_gpus", server("alice", "researchers", "gpu-h100", "full", "jupyter-alice"), h(0), h(6), lambda t: 2)
    gpus += _series("gpuspawner_server_gpus", server("bob", "students", "mig-1g-10gb", "mig", "jupyter-bob"), h(0), h(10), lambda t: 1)
    gpus += _series("gpuspawner_server_gpus", server("carol", "students", "t4-shared", "shared", "jupyter-carol"), h(5), h(10), lambda t: 1)
    gpus += _series("gpuspawner_server_gpus", server("dave", "researchers", "gpu-h100", "full", "jupyter-dave"), h(1), h(4), lambda t: 1)
    engine, util = [], []
    for i in range(2):
        dev = {"gpu": str(i), "UUID": f"GPU-alice-{i}", "Hostname": "h100-node", "namespace": "jhub", "pod": "jupyter-alice"}
        engine += _series("DCGM_FI_PROF_GR_ENGINE_ACTIVE", dev, h(0), h(6), lambda t: "0.700000" if t <= h(2) else "0.000000")
        util += _series("DCGM_FI_DEV_GPU_UTIL", dev, h(0), h(6), lambda t: 70 if t <= h(2) else 0)
    bob = {
        "gpu": "0",
        "UUID": "GPU-mig-node",
        "GPU_I_PROFILE": "1g.10gb",
        "GPU_I_ID": "7",
        "Hostname": "a100-node",
        "namespace": "gpu-operator",
        "pod": "nvidia-dcgm-exporter-7xk2p",
        "exported_namespace": "jhub",
        "exported_pod": "jupyter-bob",
    }
    engine += _series("DCGM_FI_PROF_GR_ENGINE_ACTIVE", bob, h(0), h(10), lambda t: "0.000000")
    util += _series("DCGM_FI_DEV_GPU_UTIL", bob, h(0), h(10), lambda t: 0)
    carol = {"gpu": "0", "UUID": "GPU-t4", "Hostname": "t4-node", "namespace": "jhub", "pod": "jupyter-carol", "vgpu": "2"}
    util += _series("DCGM_FI_DEV_GPU_UTIL", carol, h(5), h(10), lambda t: 40)
    reclaimed = _series(
        "gpuspawner_culler_gpu_memory_reclaimed_mib_total",
        {"action": "server_stop", "kind": "full"},
        h(0),
        h(10),
        lambda t: 5000 if t >= h(6) else 0,
    )
    # alice's GPU-hour budget as the hub measured it (gpuspawner.hub.budgets): 12.5 of 20 by the end
    mine = {"user": "alice", "window": "week"}
    budget_used = _series("gpuspawner_budget_used_hours", {**mine, "source": "prometheus"}, h(0), h(9), lambda t: 12.5 if t > h(6) else 1)
    budget_hours = _series("gpuspawner_budget_hours", mine, h(0), h(9), lambda t: 20)
    # her cost budget too: 60 of 500 spent by the end
    cost_used = _series("gpuspawner_cost_budget_used", {**mine, "source": "hub-record"}, h(0), h(9), lambda t: 60 if t > h(6) else 5)
    cost_budget = _series("gpuspawner_cost_budget", mine, h(0), h(9), lambda t: 500)
    price = _series("gpuspawner_offering_price_per_hour", {"offering": "gpu-h100", "kind": "full"}, h(0), h(10), lambda t: 5)
    price += _series("gpuspawner_offering_price_per_hour", {"offering": "mig-1g-10gb", "kind": "mig"}, h(0), h(10), lambda t: 1.25)
    families = [
        ("gpuspawner_cost_budget_used", "gauge", cost_used),
        ("gpuspawner_cost_budget", "gauge", cost_budget),
        ("gpuspawner_offering_price_per_hour", "gauge", price),
        ("gpuspawner_budget_used_hours", "gauge", budget_used),
        ("gpuspawner_budget_hours", "gauge", budget_hours),
        ("gpuspawner_server_gpus", "gauge", gpus),
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", engine),
        ("DCGM_FI_DEV_GPU_UTIL", "gauge", util),
        ("gpuspawner_culler_gpu_memory_reclaimed_mib", "counter", reclaimed),
    ]
    out = []
    for name, kind, lines in families:
        out += [f"# TYPE {name} {kind}", *lines]
    return "\n".join(out + ["# EOF"]) + "\n"


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory):
    end = (int(__import__("time").time()) // HOUR - 2) * HOUR  # a whole hour, two hours ago or more
    t0 = end - 10 * HOUR
    prom = Prometheus(tmp_path_factory.mktemp("report") / "prometheus", [], extra_args=["--query.lookback-delta=1m"])
    prom.backfill(history(t0))
    with prom:
        yield prom, end


def rows(report) -> dict[str, tuple[float, float, float]]:
    return {r.key: (round(r.held_h, 6), round(r.active_h, 6), round(r.idle_h, 6)) for r in report.rows}


def test_budgets_as_the_hub_last_measured_them(backfilled):
    prom, end = backfilled
    api = PrometheusAPI(prom.url)
    report = build_report(api, "user", 10 * HOUR, end, STEP)
    assert report.budgets == {"alice": {"used": 12.5, "hours": 20.0, "window": "week", "source": "prometheus"}}
    assert "  alice  12.50 of 20  (week, prometheus)" in render(report, "table")
    assert json.loads(render(report, "json"))["budgets"]["alice"]["used"] == 12.5
    assert build_report(api, "group", 10 * HOUR, end, STEP).budgets == {}
    assert report.cost_budgets == {"alice": {"used": 60.0, "hours": 500.0, "window": "week", "source": "hub-record"}}
    assert render(report, "table").endswith(
        "Cost budgets, as the hub last measured them (spent of budget, window, source):\n  alice  60.00 of 500.00  (week, hub-record)"
    )


def costs(report) -> dict[str, tuple[float, float]]:
    return {r.key: (round(r.cost, 6), round(r.unpriced_h, 6)) for r in report.rows}


def test_the_cost_of_the_held_hours_at_each_offerings_price(backfilled):
    prom, end = backfilled
    api = PrometheusAPI(prom.url)
    by_user = build_report(api, "user", 10 * HOUR, end, STEP)
    assert by_user.priced
    assert costs(by_user) == {"alice": (60, 0), "bob": (12.5, 0), "carol": (0, 5), "dave": (15, 0)}
    assert costs(build_report(api, "offering", 10 * HOUR, end, STEP)) == {
        "gpu-h100": (75, 0),
        "mig-1g-10gb": (12.5, 0),
        "t4-shared": (0, 5),
    }
    by_group = build_report(api, "group", 10 * HOUR, end, STEP)
    assert costs(by_group) == {"researchers": (75, 0), "students": (12.5, 5)}
    table = render(by_group, "table").splitlines()
    assert table[2].split()[-1] == "COST"
    assert [line.split()[-1] for line in table[3:5]] == ["12.50*", "75.00"]  # students (most idle first): carol's hours had no price
    assert "* 5.00 GPU-hours were of offerings without a price" in render(by_group, "table")
    assert {r["key"]: r["cost"] for r in json.loads(render(by_user, "json"))["rows"]}["carol"] == 0


def test_gpu_hours_by_user_group_and_offering_as_worked_out_by_hand(backfilled):
    prom, end = backfilled
    api = PrometheusAPI(prom.url)
    by_user = build_report(api, "user", 10 * HOUR, end, STEP)
    assert rows(by_user) == {"alice": (12, 4, 8), "bob": (10, 0, 10), "carol": (5, 5, 0), "dave": (3, 0, 0)}
    assert [r.key for r in by_user.rows] == ["bob", "alice", "carol", "dave"]  # most idle first
    assert {r.key: r.unknown_h for r in by_user.rows}["dave"] == 3
    assert rows(build_report(api, "group", 10 * HOUR, end, STEP)) == {"researchers": (15, 4, 8), "students": (15, 5, 10)}
    assert rows(build_report(api, "offering", 10 * HOUR, end, STEP)) == {
        "gpu-h100": (15, 4, 8),
        "mig-1g-10gb": (10, 0, 10),
        "t4-shared": (5, 5, 0),
    }
    # increase() extrapolates to the range's ends: 5000 MiB, give or take one step in 600
    assert 5000 <= by_user.reclaimed_mib["server_stop"] <= 5000 * 600 / 599 + 1e-6
    # the last 4 hours: alice gone, carol busy, bob idle
    assert rows(build_report(api, "user", 4 * HOUR, end, STEP)) == {"bob": (4, 0, 4), "carol": (4, 4, 0)}


def test_the_command_prints_table_csv_and_json(backfilled):
    prom, end = backfilled
    base = [
        sys.executable,
        "-m",
        "gpuspawner.tools.cli",
        "report",
        f"--prometheus-url={prom.url}",
        "--since=10h",
        f"--until={end}",
        "--step=1m",
    ]
    table = subprocess.run(base, capture_output=True, text=True, check=True).stdout
    lines = table.splitlines()
    assert lines[0].startswith("GPU use over the 10h up to ")
    assert lines[2].split() == ["USER", "GPU-h", "HELD", "ACTIVE", "IDLE", "NO", "DATA", "IDLE", "SHARE", "COST"]
    assert lines[3].split() == ["bob", "10.00", "0.00", "10.00", "0.00", "100%", "12.50"]
    assert lines[4].split() == ["alice", "12.00", "4.00", "8.00", "0.00", "67%", "60.00"]
    assert lines[8].split() == ["total", "30.00", "9.00", "18.00", "3.00", "60%", "87.50*"]
    assert table.rstrip().endswith(
        "GPU memory reclaimed by the culler: 4.9 GiB (server_stop: 4.9 GiB)\n\n"
        "GPU-hour budgets, as the hub last measured them (used of budget, window, source):\n"
        "  alice  12.50 of 20  (week, prometheus)\n\n"
        "Cost budgets, as the hub last measured them (spent of budget, window, source):\n"
        "  alice  60.00 of 500.00  (week, hub-record)"
    )
    csv_out = subprocess.run(base + ["--by=offering", "--format=csv"], capture_output=True, text=True, check=True).stdout
    assert csv_out.splitlines()[0] == (
        "offering,gpu_hours_held,gpu_hours_active,gpu_hours_idle,gpu_hours_unknown,idle_share,cost,gpu_hours_unpriced"
    )
    assert "mig-1g-10gb,10.00,0.00,10.00,0.00,1.0000,12.50,0.00" in csv_out.splitlines()
    data = json.loads(subprocess.run(base + ["--by=group", "--format=json"], capture_output=True, text=True, check=True).stdout)
    assert {r["key"]: r["held_h"] for r in data["rows"]} == {"researchers": 15.0, "students": 15.0}


def test_no_data_and_unreachable_prometheus_are_clear_errors(backfilled, tmp_path):
    prom, end = backfilled
    with pytest.raises(ReportError, match="holds no gpuspawner_server_gpus samples in the 1h before .* scraping the hub's"):
        build_report(PrometheusAPI(prom.url), "user", HOUR, end - 11 * HOUR, STEP)
    gone = Prometheus(tmp_path / "p", [])  # a port nothing listens on
    proc = subprocess.run(
        [sys.executable, "-m", "gpuspawner.tools.cli", "report", f"--prometheus-url={gone.url}"], capture_output=True, text=True
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"gpuspawner report: cannot reach Prometheus at {gone.url}")
    proc = subprocess.run(
        [sys.executable, "-m", "gpuspawner.tools.cli", "report", "--since=week", f"--prometheus-url={prom.url}"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1 and "--since 'week' is not a duration" in proc.stderr
    with pytest.raises(ReportError, match="answered 400 Bad Request: .*parse error"):
        PrometheusAPI(prom.url).query("sum(", end)


def test_the_report_and_the_recording_rules_say_the_same():
    """One definition of "active" and "idle": the chart's rules.yaml records exactly the
    expressions the report integrates."""
    import yaml

    from gpuspawner.devcluster.prometheus import RULES_FILE

    rules = {r.get("record"): r["expr"] for g in yaml.safe_load(RULES_FILE.read_text())["groups"] for r in g["rules"]}
    norm = lambda e: " ".join(e.split())  # noqa: E731
    assert norm(rules["gpuspawner:gpu_device_active"]) == norm(DEVICE_ACTIVE)
    assert norm(rules["gpuspawner:server_gpus_active"]) == norm(ACTIVE.replace(f"({DEVICE_ACTIVE})", "(gpuspawner:gpu_device_active)"))
    assert norm(rules["gpuspawner:server_gpus_idle"]) == norm(IDLE.replace(f"({DEVICE_ACTIVE})", "(gpuspawner:gpu_device_active)"))
