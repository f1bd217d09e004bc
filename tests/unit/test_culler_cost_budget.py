"""The culler stops a server whose user's COST budget ran out exactly as it does for a spent
GPU-hour budget (gpuspawner/culler/policy.py, decide.py, notices.py): warned first, then stopped
whatever it does, with words that say it was the cost budget, an action-log record and the
home page's sentence; only a server that costs something against it (its record's
``price_per_hour``); whichever budget runs out first is the one named. The hub exports the
cost budget's figures as it does the GPU-hour budget's (gpuspawner/hub/budgets.py), and the
culler's one query reads them (gpu_query.py, gpu_metrics.py). The same with a real hub and
culler: tests/culler/test_culler_leases.py; through the real Prometheus: tests/e2e/test_budgets.py."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import jinja2
from prometheus_client import REGISTRY

from gpuspawner.capacity.budgetmath import COST, HOURS, Budget, Standing
from gpuspawner.culler.contract import parse_offering
from gpuspawner.culler.decide import decide, upcoming
from gpuspawner.culler.gpu_metrics import parse_query_response
from gpuspawner.culler.gpu_query import SERIES_LABEL, GpuQuerySettings, build_query
from gpuspawner.culler.notices import action_record, keepable, notice, why_words
from gpuspawner.culler.policy import COST as COST_MEASURE
from gpuspawner.culler.policy import KEEP, STOP, BudgetRunway, Policy
from gpuspawner.culler.records import BUDGET
from gpuspawner.hub import budgets as hub_budgets
from gpuspawner.hub.culleractions import hub_templates_dir, page_items
from gpuspawner.names.record import GpuRecord
from gpuspawner.names.vocabulary import (
    BUDGET_REMAINING,
    BUDGET_SPEND_RATE,
    COST_BUDGET_REMAINING,
    COST_BUDGET_SPEND_RATE,
    RECORD_PRICE,
)
from tests.culler.test_decide import NOW, H, M, gpu, kernel, kv, server

BUSY = kv(kernel("busy", idle=0 * M, kid="k1"))


def h100(price: float | None = 5.0):
    s = server("full", idle=0 * M, slug="h100", started=NOW - H)
    return replace(s, offering=replace(s.offering, hourly_cost=1.0, hourly_price=price))


def cost_budget(left: float, rate: float = 5.0, noticed=None, notice_s: int = 0, **kw) -> Policy:
    return Policy(
        cost_budgets={"alice": BudgetRunway(left, rate, NOW, COST_MEASURE)},
        cost_budget_noticed={"alice": noticed} if noticed else {},
        turn_notice=notice_s,
        **kw,
    )


def test_a_spent_cost_budget_stops_the_server_whatever_it_does_in_words_of_money():
    s = h100()
    assert decide(s, BUSY, gpu("active"), cost_budget(2.5), NOW).action == KEEP  # half an hour at 5.00 an hour
    d = decide(s, BUSY, gpu("active"), cost_budget(2.5), NOW + 30 * M)
    assert d.action == STOP and d.stop_reason == BUDGET and not keepable(d)
    assert "its user's cost budget ran out (2.50 left at 12:00 UTC, spending 5 per hour)" in d.summary()
    assert why_words(s, d, cost_budget(2.5)) == ("your cost budget ran out (spending 5 per hour); a new start is refused until it frees up")
    record = action_record(s, d, cost_budget(2.5), NOW + 30 * M, gpu("active"))
    assert record["reason"] == BUDGET and record["what"] == "Your server was stopped"
    # the home page's notice: the record's sentence, under the culler's markup
    [item] = page_items([record], NOW + 31 * M, days=1)
    assert item["text"].startswith("Your server was stopped at ") and item["text"].endswith(
        ": your cost budget ran out (spending 5 per hour); a new start is refused until it frees up."
    )
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(hub_templates_dir()), autoescape=True)
    page = env.get_template("gpuspawner_culler_actions.html").render(gpuspawner_culler_actions=lambda: [item])
    assert "your cost budget ran out" in page


def test_a_cost_budget_found_spent_already_is_warned_first_then_stopped():
    s = h100()
    p = cost_budget(-0.5, noticed=NOW, notice_s=300)
    assert decide(s, BUSY, gpu("active"), p, NOW).action == KEEP
    coming = upcoming(s, BUSY, gpu("active"), p, NOW, horizon_s=300)
    assert coming is not None and coming.at == NOW + 5 * M and coming.decision.stop_reason == BUDGET
    body = notice(s, coming, p, NOW, None, gpu("active"))
    assert body["warning"] is True and body["keepable"] is False and body["cause"] == BUDGET
    assert body["reason"] == "your cost budget runs out (spending 5 per hour); a new start is refused until it frees up"
    assert decide(s, BUSY, gpu("active"), p, NOW + 5 * M).stop_reason == BUDGET


def test_only_a_server_that_costs_something_is_stopped_for_the_cost_budget():
    # an offering without a price costs nothing against it (its record says 0); a CPU server never
    assert decide(h100(price=0.0), BUSY, gpu("active"), cost_budget(-1.0), NOW).action == KEEP
    assert decide(server("plain", idle=0 * M), BUSY, None, cost_budget(-1.0), NOW).action == KEEP
    # a record of a hub older than cost budgets (no price written) is stopped, as for GPU-hours
    assert decide(h100(price=None), BUSY, gpu("active"), cost_budget(-1.0), NOW).stop_reason == BUDGET
    # money left and nothing spent per hour: it never runs out
    assert decide(h100(), BUSY, gpu("active"), cost_budget(1.0, rate=0.0), NOW + 9 * H).action == KEEP


def test_whichever_budget_runs_out_first_stops_the_server_and_is_named():
    s = h100()
    both = replace(cost_budget(5.0), budgets={"alice": BudgetRunway(0.5, 1.0, NOW)})  # GPU-hours out at 12:30, money at 13:00
    at, runway = both.budget_stop(s) or (None, None)
    assert at == NOW + 30 * M and runway is not None and not runway.is_cost
    assert "GPU-hour budget ran out" in decide(s, BUSY, gpu("active"), both, NOW + 30 * M).summary()
    money_first = replace(cost_budget(1.0), budgets={"alice": BudgetRunway(0.5, 1.0, NOW)})  # money out at 12:12
    d = decide(s, BUSY, gpu("active"), money_first, NOW + 12 * M)
    assert d.action == STOP and "cost budget ran out" in d.summary()
    assert why_words(s, d, money_first).startswith("your cost budget ran out")
    # a server free of GPU-hours is still stopped by the cost budget it spends
    free_hours = replace(s, offering=replace(s.offering, hourly_cost=0.0))
    assert decide(free_hours, BUSY, gpu("active"), money_first, NOW + 12 * M).stop_reason == BUDGET
    assert decide(free_hours, BUSY, gpu("active"), replace(money_first, cost_budgets={}), NOW + 12 * M).action == KEEP


def test_the_record_carries_the_servers_price_and_the_culler_reads_it():
    raw = GpuRecord(offering="h100", kind="full", count=2, cost=2.0, price=10.0).to_json()
    assert raw[RECORD_PRICE] == 10.0
    offering = parse_offering({"offering": "h100", "gpuspawner": raw})
    assert (offering.hourly_cost, offering.hourly_price) == (2.0, 10.0)
    assert parse_offering({"gpuspawner": {**raw, RECORD_PRICE: -1}}).hourly_price is None  # (said, and not read)
    assert parse_offering({"gpuspawner": {k: v for k, v in raw.items() if k != RECORD_PRICE}}).hourly_price is None


def test_the_hub_exports_the_cost_budget_as_the_gpu_hour_one_and_the_culler_reads_both():
    user = "alice-40example-2ecom"
    hub_budgets.NAMES[user] = "alice@example.com"
    now = datetime.now(UTC)
    hub_budgets.LAST_COST[user] = Standing(Budget(12.5, "rolling-7d", measure=COST), 12.0, "prometheus", 5.0, now)
    hub_budgets.LAST[user] = Standing(Budget(4.0, "rolling-7d", measure=HOURS), 3.0, "prometheus", 1.0, now)
    try:
        labels = {"user": user, "window": "rolling-7d", "name": "alice@example.com"}
        left = REGISTRY.get_sample_value(COST_BUDGET_REMAINING, labels)
        assert left is not None and 0.4 < left <= 0.5  # 0.50, carried on at 5.00 an hour since
        assert REGISTRY.get_sample_value(COST_BUDGET_SPEND_RATE, labels) == 5.0
        assert REGISTRY.get_sample_value(BUDGET_SPEND_RATE, labels) == 1.0
    finally:
        del hub_budgets.LAST_COST[user], hub_budgets.LAST[user], hub_budgets.NAMES[user]

    query = build_query(GpuQuerySettings())
    assert f"min by (user, name) ({COST_BUDGET_REMAINING})" in query and f"max by (user, name) ({COST_BUDGET_SPEND_RATE})" in query

    def row(metric, value, **lab):
        return {"metric": {SERIES_LABEL: f"{metric}:last", **lab}, "value": [0, str(value)]}

    body = {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [
                row(BUDGET_REMAINING, 1.0, user=user, name="alice@example.com"),
                row(BUDGET_SPEND_RATE, 1, user=user, name="alice@example.com"),
                row(COST_BUDGET_REMAINING, 0.5, user=user, name="alice@example.com"),
                row(COST_BUDGET_SPEND_RATE, 5, user=user, name="alice@example.com"),
                row(COST_BUDGET_REMAINING, "NaN", user="carol", name="carol"),
            ],
        },
    }
    view = parse_query_response(body, GpuQuerySettings())
    assert view.budgets == {"alice@example.com": (1.0, 1.0)}
    assert view.cost_budgets == {"alice@example.com": (0.5, 5.0)}
