"""``gpuspawner report``: GPU-hours held and used (and what they cost), per user, group or offering, from Prometheus.

An admin's questions, "who keeps GPUs idle?" and "which offering should we grow?",
answered without writing PromQL. Everything comes from series the hub and dcgm-exporter
already expose: the hub's ``gpuspawner_server_gpus`` (GPU units each notebook pod holds,
with its user, group and offering), dcgm-exporter's activity per device, and the
culler's reclaimed-memory counter. The cost is the held unit-hours times the offering's
price per unit-hour at each step, as the hub exports the admin's ``price_per_hour``
(``gpuspawner_offering_price_per_hour``); hours of an offering without a price cost nothing
and are said apart (``unpriced_h``), never guessed.

GPU-hours are integrated with a subquery: the value every ``step`` over the range, each
step standing for the ``step`` that ends at it. "Active" and "idle" follow the chart's
recording rules (charts/gpuspawner/monitoring/rules.yaml; the tests check that both say
the same): a server is active while any of its devices shows engine activity (or GPU
utilisation on a whole GPU), idle while all of them are quiet, and neither while
dcgm-exporter reports nothing for it.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from gpuspawner.names.vocabulary import COST_BUDGET, COST_BUDGET_USED, OFFERING_PRICE
from gpuspawner.tools import nodehours

BY = ("user", "group", "offering")
FORMATS = ("table", "csv", "json")

#: 1 per device of a notebook pod showing activity now, 0 when quiet (rules.yaml:
#: gpuspawner:gpu_device_active)
DEVICE_ACTIVE = """max by (namespace, pod, UUID, GPU_I_ID) (
  label_replace(label_replace(
    label_replace(DCGM_FI_PROF_GR_ENGINE_ACTIVE > bool 0, "signal", "engine", "", ""),
    "pod", "$1", "exported_pod", "(.+)"), "namespace", "$1", "exported_namespace", "(.+)")
  or
  label_replace(label_replace(
    label_replace(DCGM_FI_DEV_GPU_UTIL{GPU_I_ID=""} > bool 0, "signal", "util", "", ""),
    "pod", "$1", "exported_pod", "(.+)"), "namespace", "$1", "exported_namespace", "(.+)")
)"""
HELD = "gpuspawner_server_gpus"
#: rules.yaml: gpuspawner:server_gpus_active and gpuspawner:server_gpus_idle
ACTIVE = f"{HELD}\n  * on (namespace, pod) group_left () max by (namespace, pod) ({DEVICE_ACTIVE})"
IDLE = f"{HELD}\n  * on (namespace, pod) group_left () (1 - max by (namespace, pod) ({DEVICE_ACTIVE}))"
RECLAIMED = "gpuspawner_culler_gpu_memory_reclaimed_mib_total"
#: each offering's price per unit-hour, one series per hub and offering however often scraped
PRICE = f"max by (offering, hub) ({OFFERING_PRICE})"
#: what the held units cost per hour, and the held units that have a price
COST = f"{HELD}\n  * on (offering, hub) group_left () {PRICE}"
PRICED = f"{HELD}\n  and on (offering, hub) {PRICE}"
#: GPU-hour budgets, as the hub last measured them (gpuspawner.hub.budgets)
BUDGET_USED = "gpuspawner_budget_used_hours"
BUDGET_HOURS = "gpuspawner_budget_hours"

_DURATION = re.compile(r"^(\d+)([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class ReportError(RuntimeError):
    """Something the admin must fix; the message says what and how."""


@dataclass(frozen=True)
class Row:
    key: str
    held_h: float
    active_h: float
    idle_h: float
    #: what the held hours of priced offerings cost, and how many of the held hours had no price
    cost: float = 0.0
    unpriced_h: float = 0.0

    @property
    def unknown_h(self) -> float:
        """Held by servers dcgm-exporter reported nothing for."""
        return max(self.held_h - self.active_h - self.idle_h, 0.0)

    @property
    def idle_share(self) -> float | None:
        return self.idle_h / self.held_h if self.held_h else None


@dataclass(frozen=True)
class Report:
    by: str
    since_s: int
    until: float
    step_s: int
    rows: list[Row]
    #: MiB reclaimed by the culler over the range, by action (server_stop, kernel_shutdown)
    reclaimed_mib: dict[str, float]
    #: --by user: each user's GPU-hour budget as the hub last measured it in the range
    #: (gpuspawner_budget_*): user -> {"used", "hours", "window", "source"}
    budgets: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: whether any offering had a price in the range (else no cost is shown)
    priced: bool = False
    #: --by user: each user's cost budget as the hub last measured it, the same way
    cost_budgets: dict[str, dict[str, Any]] = field(default_factory=dict)


def parse_duration(text: str, flag: str = "--since") -> int:
    """ "7d", "12h", "90m" -> seconds."""
    m = _DURATION.match(text.strip())
    if not m or int(m[1]) == 0:
        raise ReportError(f"{flag} {text!r} is not a duration: write a number and a unit, e.g. 7d, 12h, 90m")
    return int(m[1]) * _UNIT_S[m[2]]


def parse_time(text: str) -> float:
    """An RFC 3339 time or Unix seconds."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ReportError(f"--until {text!r} is neither Unix seconds nor an RFC 3339 time such as 2026-05-04T12:00:00Z") from None
    return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()


def default_step(since_s: int) -> int:
    """One minute, or coarser so that a range has at most ~11,000 steps (Prometheus' limit)."""
    return max(60, math.ceil(since_s / 10_000 / 60) * 60)


def hours_query(expr: str, by: str, since_s: int, step_s: int) -> str:
    """GPU-hours of ``expr`` (GPU units) summed by ``by`` over the range."""
    return f"sum by ({by}) (sum_over_time(({expr})[{since_s}s:{step_s}s])) * {step_s} / 3600"


class PrometheusAPI:
    """Instant queries against Prometheus' HTTP API, with errors an admin can act on."""

    def __init__(self, url: str, timeout: float = 60.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"})
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as exc:
            try:
                detail = json.loads(exc.read()).get("error", "")
            except (ValueError, AttributeError):
                detail = ""
            raise ReportError(f"Prometheus at {self.url} answered {exc.code} {exc.reason}{': ' + detail if detail else ''}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ReportError(
                f"cannot reach Prometheus at {self.url} ({reason}): check --prometheus-url "
                "(or $GPUSPAWNER_PROMETHEUS_URL) and that this machine can reach it"
            ) from None
        except ValueError:
            raise ReportError(f"{self.url} did not answer with JSON: is it Prometheus' HTTP API (e.g. http://prometheus:9090)?") from None
        if body.get("status") != "success":
            raise ReportError(f"Prometheus at {self.url} refused the query: {body.get('error', body)}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result


def _by_key(result: Iterable[dict[str, Any]], by: str) -> dict[str, float]:
    return {item["metric"].get(by, "") or "(none)": float(item["value"][1]) for item in result}


def build_report(api: PrometheusAPI, by: str, since_s: int, until: float, step_s: int | None = None) -> Report:
    if by not in BY:
        raise ReportError(f"--by {by!r}: choose one of {', '.join(BY)}")
    step_s = step_s or default_step(since_s)
    held = _by_key(api.query(hours_query(HELD, by, since_s, step_s), until), by)
    if not held:
        window = f"the {format_duration(since_s)} before {datetime.fromtimestamp(until, UTC):%Y-%m-%d %H:%M}Z"
        raise ReportError(
            f"Prometheus at {api.url} holds no {HELD} samples in {window}. Is it scraping the hub's "
            "/hub/metrics (with honor_labels; the chart's serviceMonitor does), and did anyone hold a GPU then?"
        )
    active = _by_key(api.query(hours_query(ACTIVE, by, since_s, step_s), until), by)
    idle = _by_key(api.query(hours_query(IDLE, by, since_s, step_s), until), by)
    reclaimed = {
        item["metric"].get("action", ""): float(item["value"][1])
        for item in api.query(f"sum by (action) (increase({RECLAIMED}[{since_s}s]))", until)
    }
    cost = _by_key(api.query(hours_query(COST, by, since_s, step_s), until), by)
    priced = _by_key(api.query(hours_query(PRICED, by, since_s, step_s), until), by)
    rows = [Row(k, held[k], active.get(k, 0.0), idle.get(k, 0.0), cost.get(k, 0.0), max(held[k] - priced.get(k, 0.0), 0.0)) for k in held]
    rows.sort(key=lambda r: (-r.idle_h, -r.held_h, r.key))
    users = by == "user"
    return Report(
        by,
        since_s,
        until,
        step_s,
        rows,
        reclaimed,
        budgets_of(api, since_s, until) if users else {},
        bool(priced),
        budgets_of(api, since_s, until, COST_BUDGET_USED, COST_BUDGET) if users else {},
    )


def budgets_of(
    api: PrometheusAPI, since_s: int, until: float, used: str = BUDGET_USED, limit: str = BUDGET_HOURS
) -> dict[str, dict[str, Any]]:
    """Each user's budget and use as the hub last measured them in the range (none: no budgets);
    ``used``, ``limit``: the series of the cost budgets instead (their "hours" are money)."""
    out: dict[str, dict[str, Any]] = {}
    for item in api.query(f"last_over_time({used}[{since_s}s])", until):
        labels = item["metric"]
        out[labels.get("user", "")] = {
            "used": float(item["value"][1]),
            "hours": None,
            "window": labels.get("window", ""),
            "source": labels.get("source", ""),
        }
    for item in api.query(f"last_over_time({limit}[{since_s}s])", until):
        user = item["metric"].get("user", "")
        if user in out:
            out[user]["hours"] = float(item["value"][1])
    return out


def budget_lines(budgets: dict[str, dict[str, Any]], money: bool = False) -> list[str]:
    """The table's footer: "GPU-hour budgets (as last measured): alice 19.50 of 20 (week, prometheus)"
    (``money``: the cost budgets, "alice 120.00 of 500.00 (week, hub-record)")."""
    if not budgets:
        return []
    what = "Cost budgets, as the hub last measured them (spent" if money else "GPU-hour budgets, as the hub last measured them (used"
    lines = ["", f"{what} of budget, window, source):"]
    for user, b in sorted(budgets.items()):
        limit = "?" if b["hours"] is None else f"{b['hours']:,.2f}" if money else f"{b['hours']:g}"
        used = f"{b['used']:,.2f}" if money else f"{b['used']:.2f}"
        lines.append(f"  {user}  {used} of {limit}  ({b['window']}, {b['source']})")
    return lines


def format_duration(seconds: int) -> str:
    for unit in ("w", "d", "h", "m"):
        if seconds % _UNIT_S[unit] == 0:
            return f"{seconds // _UNIT_S[unit]}{unit}"
    return f"{seconds}s"


def _share(row: Row) -> str:
    return "-" if row.idle_share is None else f"{100 * row.idle_share:.0f}%"


def _cost(row: Row) -> str:
    """A row's cost in the table: "75.00"; "12.50*" where some of its hours had no price; "-" where none had."""
    if row.unpriced_h >= row.held_h - 0.005:
        return "-"
    return f"{row.cost:,.2f}" + ("*" if row.unpriced_h >= 0.005 else "")


def render(report: Report, fmt: str) -> str:
    header = [report.by, "gpu_hours_held", "gpu_hours_active", "gpu_hours_idle", "gpu_hours_unknown", "idle_share"]
    header += ["cost", "gpu_hours_unpriced"] if report.priced else []
    if fmt == "json":
        return json.dumps(
            {
                "by": report.by,
                "since_seconds": report.since_s,
                "until": report.until,
                "step_seconds": report.step_s,
                "rows": [{**asdict(r), "unknown_h": r.unknown_h, "idle_share": r.idle_share} for r in report.rows],
                "gpu_memory_reclaimed_mib": report.reclaimed_mib,
                "budgets": report.budgets,
                "priced": report.priced,
                "cost_budgets": report.cost_budgets,
            },
            indent=2,
        )
    if fmt == "csv":
        out = io.StringIO()
        w = csv.writer(out, lineterminator="\n")
        w.writerow(header)
        for r in report.rows:
            w.writerow(
                [
                    r.key,
                    f"{r.held_h:.2f}",
                    f"{r.active_h:.2f}",
                    f"{r.idle_h:.2f}",
                    f"{r.unknown_h:.2f}",
                    "" if r.idle_share is None else f"{r.idle_share:.4f}",
                    *([f"{r.cost:.2f}", f"{r.unpriced_h:.2f}"] if report.priced else []),
                ]
            )
        return out.getvalue().rstrip("\n")
    cells = [[report.by.upper(), "GPU-h HELD", "ACTIVE", "IDLE", "NO DATA", "IDLE SHARE", *(["COST"] if report.priced else [])]]
    total = Row("total", *(sum(getattr(r, f) for r in report.rows) for f in ("held_h", "active_h", "idle_h", "cost", "unpriced_h")))
    for r in [*report.rows, total]:
        cost = [_cost(r)] if report.priced else []
        cells.append([r.key, *(f"{h:.2f}" for h in (r.held_h, r.active_h, r.idle_h, r.unknown_h)), _share(r), *cost])
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))) for row in cells]
    lines.insert(len(lines) - 1, "-" * len(lines[0]))
    until = datetime.fromtimestamp(report.until, UTC)
    head = f"GPU use over the {format_duration(report.since_s)} up to {until:%Y-%m-%d %H:%M}Z (GPU units x hours, {report.step_s}s steps)"
    reclaimed = sum(report.reclaimed_mib.values())
    parts = ", ".join(f"{k}: {v / 1024:.1f} GiB" for k, v in sorted(report.reclaimed_mib.items()) if v)
    foot = f"GPU memory reclaimed by the culler: {reclaimed / 1024:.1f} GiB" + (f" ({parts})" if parts else "")
    unpriced = total.unpriced_h >= 0.005 and report.priced
    note = (
        [f"COST: at each offering's price per unit-hour; * {total.unpriced_h:.2f} GPU-hours were of offerings without a price"]
        if unpriced
        else []
    )
    return "\n".join([head, "", *lines, *note, "", foot, *budget_lines(report.budgets), *budget_lines(report.cost_budgets, money=True)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuspawner report", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--since", default="7d", help="how far back: 7d, 12h, 90m (default 7d)")
    parser.add_argument("--until", help="end of the range: RFC 3339 or Unix seconds (default: now)")
    parser.add_argument("--by", default="user", choices=BY, help="one row per user, group or offering (default user)")
    parser.add_argument("--format", default="table", choices=FORMATS, help="table (default), csv or json")
    parser.add_argument("--step", help="integration step, e.g. 1m (default: 1m, coarser for long ranges)")
    parser.add_argument(
        "--nodeclaims",
        metavar="FILE",
        help="Karpenter's NodeClaims as `gpuspawner record-nodeclaims` or `kubectl get nodeclaims -o json --watch` wrote them: "
        "GPU node-hours per pool (docs/autoscaling.md)",
    )
    parser.add_argument("--actions", metavar="FILE", help="the culler's action log (JSON lines): which nodes went after an idle reclaim")
    parser.add_argument("--pool-price", action="append", metavar="POOL=PRICE", help="a pool's price per node-hour (over the NodeClaim's)")
    parser.add_argument(
        "--release-window", default="30m", help="a node deleted this soon after an idle reclaim on it was let go by it (30m)"
    )
    parser.add_argument(
        "--prometheus-url",
        default=os.environ.get("GPUSPAWNER_PROMETHEUS_URL", ""),
        help="Prometheus' HTTP API, e.g. http://prometheus-server.monitoring.svc (default $GPUSPAWNER_PROMETHEUS_URL)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        since = parse_duration(args.since)
        until = parse_time(args.until) if args.until else time.time()
        step = parse_duration(args.step, "--step") if args.step else None
        nodes = node_section(args, since, until) if args.nodeclaims else None
        if not args.prometheus_url and nodes is None:
            raise ReportError("no Prometheus to read: pass --prometheus-url=http://... or set $GPUSPAWNER_PROMETHEUS_URL")
        report = build_report(PrometheusAPI(args.prometheus_url), args.by, since, until, step) if args.prometheus_url else None
    except (ReportError, nodehours.NodeHoursError) as exc:
        print(f"gpuspawner report: {exc}", file=sys.stderr)
        return 1
    print("\n\n".join(part for part in (render(report, args.format) if report else "", nodes or "") if part))
    return 0


def node_section(args: argparse.Namespace, since_s: int, until: float) -> str:
    """GPU node-hours per autoscaled pool from ``--nodeclaims`` (and ``--actions``): tools.nodehours."""
    window = parse_duration(args.release_window, "--release-window")
    prices: dict[str, float] = {}
    for item in args.pool_price or ():
        pool, _, value = item.partition("=")
        try:
            prices[pool] = float(value)
        except ValueError:
            raise ReportError(f"--pool-price {item!r}: write POOL=PRICE, e.g. gpu-h100=40.0") from None
    objects = nodehours.json_objects(_read(args.nodeclaims, "--nodeclaims"), args.nodeclaims)
    actions = nodehours.json_objects(_read(args.actions, "--actions"), args.actions) if args.actions else []
    end = datetime.fromtimestamp(until, UTC)
    pools = nodehours.measure(
        nodehours.node_lives(objects, prices),
        nodehours.idle_reclaims(actions),
        end - timedelta(seconds=since_s),
        end,
        timedelta(seconds=window),
    )
    return nodehours.render(pools, "json" if args.format == "json" else "table")


def _read(path: str, flag: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError) as error:
        raise ReportError(f"{flag} {path}: cannot read it ({error})") from error


if __name__ == "__main__":
    sys.exit(main())
