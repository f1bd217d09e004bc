"""GPU-hour budgets, the pure part (gpuspawner.capacity.budgetmath): settings, windows, weights,
usage, "the next hour frees up at ...", the ledger rows and the words; and cost budgets
(``"cost"`` beside ``"hours"`` in the same settings, the money an hour of an offering costs at
its ``price_per_hour``: gpuspawner.hub.budgets.hourly, the ledger's prices, the words)."""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from gpuspawner.capacity.budgetmath import (
    COST,
    DAY,
    HOURS,
    HUB_RECORD,
    PROMETHEUS,
    ROLLING_7D,
    WEEK,
    Budget,
    Standing,
    Use,
    budget_for,
    budget_problems,
    close_rows,
    cost_text,
    frees_up_at,
    kept_rows,
    refusal_text,
    standing_text,
    usage_query,
    use_row,
    used_hours,
    uses_from_rows,
    weighted_hours,
    window_start,
)
from gpuspawner.capacity.checks import config_problems
from gpuspawner.core.model import Offering
from gpuspawner.core.noticewords import cost_budget_progress
from gpuspawner.core.wording import OVER_COST_BUDGET, money_words, price_words
from gpuspawner.hub.budgets import hourly
from gpuspawner.names.vocabulary import Kind
from gpuspawner.offerings.config import offering_from_config
from gpuspawner.offerings.entry import OfferingConfigError

ZURICH = ZoneInfo("Europe/Zurich")
UTC = ZoneInfo("UTC")
# Thursday 26 November 2026, 15:30 in Zurich
NOW = datetime(2026, 11, 26, 15, 30, tzinfo=ZURICH)


def at(day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 11, day, hour, minute, tzinfo=ZURICH)


# ---------------------------------------------------------------- settings


def test_settings_are_checked_with_the_setting_named():
    assert budget_problems({}, {}) == []
    assert budget_problems({"hours": 20, "window": "week"}, {"students": {"hours": 4, "window": "day"}}) == []
    problems = budget_problems({"hours": -1}, {"x": {"hours": 2, "window": "month"}, "y": "ten"})
    assert any("c.GPUSpawner.user_gpu_budget['hours']" in p for p in problems)
    assert any("c.GPUSpawner.group_gpu_budgets['x']['window']" in p and "rolling-7d" in p for p in problems)
    assert any("c.GPUSpawner.group_gpu_budgets['y']" in p for p in problems)
    assert budget_problems({"hours": 1, "windw": "day"}, {})[0].endswith("the keys are 'hours', 'cost' and 'window'")
    assert "group -> budget dict" in budget_problems({}, ["x"])[0]
    assert budget_problems({"hours": True}, {})


def test_the_hub_check_includes_the_budgets():
    problems = config_problems({"user_gpu_budget": {"hours": "lots"}})
    assert any("user_gpu_budget" in p for p in problems)


def test_no_budget_without_hours():
    assert budget_for({}, {}, ["students"]) is None
    assert budget_for({"hours": 0, "window": "day"}, {"students": {"hours": 0}}, ["students"]) is None


def test_the_most_generous_budget_wins():
    groups = {"students": {"hours": 4, "window": "day"}, "lab": {"hours": 20, "window": "week"}, "other": {"hours": 999}}
    default = {"hours": 10, "window": "week"}
    assert budget_for(default, groups, []) == Budget(10, WEEK, "user")
    # 4 a day (28 a week) beats 20 a week and 10 a week; groups the user is not in do not count
    assert budget_for(default, groups, ["lab", "students"]) == Budget(4, DAY, "group students")
    assert budget_for(default, groups, ["lab"]) == Budget(20, WEEK, "group lab")
    # a window defaults to the week
    assert budget_for({"hours": 3}, {}, []) == Budget(3, WEEK, "user")
    # on a tie per day, the longer window
    assert budget_for({"hours": 1, "window": "day"}, {"g": {"hours": 7, "window": "rolling-7d"}}, ["g"]).window == ROLLING_7D


# ---------------------------------------------------------------- windows and usage


def test_window_starts():
    assert window_start(DAY, NOW) == at(26, 0)
    assert window_start(WEEK, NOW) == at(23, 0)  # Monday
    assert window_start(WEEK, at(23, 0)) == at(23, 0)
    assert window_start(WEEK, at(29, 23, 59)) == at(23, 0)  # Sunday night is still that week
    assert window_start(ROLLING_7D, NOW) == NOW - timedelta(days=7)


def test_week_starts_on_monday_in_the_site_time_zone():
    # Monday 00:30 in Zurich is Sunday 23:30 UTC: the week began 30 minutes ago in Zurich
    now = datetime(2026, 11, 30, 0, 30, tzinfo=ZURICH)
    assert window_start(WEEK, now) == datetime(2026, 11, 30, tzinfo=ZURICH)
    assert window_start(WEEK, now.astimezone(UTC)) == datetime(2026, 11, 23, tzinfo=UTC)


def test_used_hours_clips_to_the_window_and_weights():
    uses = [
        Use(at(22, 20), at(23, 2), 2.0),  # Sunday 20:00 to Monday 02:00: 2 h this week at 2
        Use(at(25, 9), at(25, 10, 30), 1.0),  # 1.5 h
        Use(at(26, 15), None, 0.5),  # running since 15:00: 0.5 h at 0.5
        Use(at(26, 16), None, 1.0),  # starts after now: nothing
    ]
    assert used_hours(uses, window_start(WEEK, NOW), NOW) == pytest.approx(4 + 1.5 + 0.25)
    assert used_hours(uses, window_start(DAY, NOW), NOW) == pytest.approx(0.25)


def test_covers_one_more_hour():
    standing = Standing(Budget(20, WEEK), 19.5, PROMETHEUS)
    assert not standing.covers(1)
    assert standing.covers(0.5)
    assert standing.covers(0)  # a free offering always fits
    assert standing.remaining == 0.5
    assert Standing(Budget(20, WEEK), 25, PROMETHEUS).remaining == 0


def test_offering_costs():
    full = Offering(slug="h100", kind=Kind.FULL, display_name="H100", resources={"nvidia.com/gpu": 1}, counts=(1, 2))
    assert full.hourly_cost(2) == 2
    assert Offering(slug="cpu", kind=Kind.CPU, display_name="No GPU").hourly_cost() == 0
    weighted = offering_from_config({"slug": "h100", "kind": "full", "product": "H100", "gpu_hour_cost": 2, "counts": [1, 2]}, 0)
    assert weighted.hourly_cost(2) == 4
    share = offering_from_config({"slug": "t4", "kind": "shared", "sharing": "time-slicing", "replicas": 4, "gpu_hour_cost": 0.25}, 0)
    assert share.hourly_cost() == 0.25
    for wrong in (-1, "2", True, float("inf")):
        with pytest.raises(OfferingConfigError, match="gpu_hour_cost"):
            offering_from_config({"slug": "x", "kind": "full", "gpu_hour_cost": wrong}, 0)


# ---------------------------------------------------------------- when the next hour frees up


def test_a_day_or_week_frees_up_at_its_next_start():
    week = Standing(Budget(20, WEEK), 19.5, HUB_RECORD)
    assert frees_up_at(week, 1, NOW) == at(30, 0)  # next Monday 00:00
    day = Standing(Budget(4, DAY), 3.5, HUB_RECORD)
    assert frees_up_at(day, 1, NOW) == at(27, 0)
    assert frees_up_at(Standing(Budget(20, WEEK), 10, HUB_RECORD), 1, NOW) is None  # fits now
    assert frees_up_at(Standing(Budget(1, WEEK), 0.5, HUB_RECORD), 2, NOW) is None  # never: more than the budget


def test_a_rolling_window_frees_what_was_used_seven_days_before():
    uses = [Use(at(20, 9), at(20, 12), 2.0), Use(at(24, 10), at(24, 12), 1.0)]  # 6 + 2 = 8 GPU-hours
    standing = Standing(Budget(8, ROLLING_7D), used_hours(uses, window_start(ROLLING_7D, NOW), NOW), HUB_RECORD)
    assert standing.used == pytest.approx(8)
    # one more hour at 1 needs 1 GPU-hour to leave the window: half an hour of the first use at 2
    assert frees_up_at(standing, 1, NOW, uses) == at(27, 9, 30)
    # one more hour at 2 needs 2: the first hour of it
    assert frees_up_at(standing, 2, NOW, uses) == at(27, 10)
    # measured elsewhere with no ledger to tell: no time promised
    assert frees_up_at(standing, 1, NOW, []) is None


# ---------------------------------------------------------------- the ledger


def test_ledger_rows_open_close_and_expire():
    rows = [use_row(at(10, 9), 1.0)]
    assert uses_from_rows(rows) == [Use(at(10, 9), None, 1.0)]
    rows = close_rows(rows, at(10, 11))
    assert uses_from_rows(rows) == [Use(at(10, 9), at(10, 11), 1.0)]
    rows.append(use_row(at(26, 9), 2.0))
    assert kept_rows(rows, NOW) == [rows[1]]  # closed more than 8 days ago: dropped; open: kept
    assert close_rows(rows, NOW)[0] == rows[0]  # a closed row keeps its end
    assert uses_from_rows([{"start": "yesterday"}, {"end": None}, "x", {"start": "2026-11-26T10:00:00"}]) == []  # malformed, naive
    assert kept_rows([{"start": "x"}], NOW) == []


def test_prometheus_figures():
    assert weighted_hours({"h100": 3, "t4": 4, "gone": 1}, {"h100": 2, "t4": 0.25}) == pytest.approx(6 + 1 + 1)
    query = usage_query('ann"e', 3600, 60, "jhub.prod")
    inner = 'max by (namespace, pod, offering) (gpuspawner_server_gpus{user="ann\\"e",hub="jhub.prod"})'
    assert query == f"sum by (offering) (sum_over_time((sum by (offering) ({inner}))[3600s:60s]))"
    assert 'hub=""' in usage_query("a", 60, 60)  # a hub without an identity: the series without one
    assert "[60s:60s]" in usage_query("a", 5, 60)


# ---------------------------------------------------------------- the words


def test_the_refusal_says_the_numbers_the_time_and_the_source():
    standing = Standing(Budget(20, WEEK), 19.5, PROMETHEUS)
    words = refusal_text(standing, "NVIDIA H100 80GB", 1, NOW, at(30, 0))
    assert words == (
        "You used 19.5 of 20 GPU-hours this week; an hour of NVIDIA H100 80GB costs 1 GPU-hour; "
        "the next hour frees up on Monday 00:00. (Usage measured by Prometheus.)"
    )
    today = refusal_text(Standing(Budget(8, ROLLING_7D), 8, HUB_RECORD), "MIG 1g.10gb", 0.5, NOW, at(26, 17))
    assert "in the last 7 days" in today and "frees up today at 17:00" in today and "hub's own record" in today
    never = refusal_text(Standing(Budget(1, DAY), 0.5, HUB_RECORD), "4 x H100", 4, NOW, None)
    assert "today; an hour of 4 x H100 costs 4 GPU-hours, more than your whole budget." in never


def test_the_page_words():
    assert standing_text(Standing(Budget(20, WEEK), 4.5, PROMETHEUS)) == (
        "Your GPU budget: 4.5 of 20 GPU-hours used this week (15.5 left; measured by Prometheus)."
    )
    assert cost_text(1) == "1 GPU-hour of budget per hour"
    assert cost_text(0.25) == "0.25 GPU-hours of budget per hour"
    assert cost_text(0) == "free of your GPU budget"
    assert standing_text(Standing(Budget(0.5, DAY), 0.001, HUB_RECORD)).startswith("Your GPU budget: less than 0.01 of 0.5")


def test_a_standing_carries_on_at_the_rate_of_the_running_servers():
    measured = Standing(Budget(20, WEEK), 10, HUB_RECORD, rate=2, as_of=NOW)
    later = measured.at(NOW + timedelta(minutes=90))
    assert later.used == pytest.approx(13) and later.remaining == pytest.approx(7) and later.as_of == NOW + timedelta(minutes=90)
    # a server stopped: it goes on at the new rate from then
    stopped = later.at(NOW + timedelta(minutes=90), rate=0)
    assert stopped.at(NOW + timedelta(hours=5)).used == pytest.approx(13)
    # a new week: only what ran since Monday 00:00 counts
    monday = measured.at(at(30, 1))
    assert monday.used == pytest.approx(2)
    # a rolling window is carried on (what leaves it is not seen: conservative)
    rolling = Standing(Budget(20, ROLLING_7D), 10, PROMETHEUS, rate=1, as_of=NOW).at(NOW + timedelta(days=2))
    assert rolling.used == pytest.approx(58) and rolling.remaining == 0
    # nothing measured yet, or asked before it: as it is
    assert Standing(Budget(1, DAY), 0.5, HUB_RECORD).at(NOW).used == 0.5
    assert measured.at(NOW - timedelta(hours=1)).used == 10


def test_a_rolling_window_frees_up_despite_rounding():
    # used + cost - budget is not exactly used in floating point: it must still be found
    uses = [Use(NOW - timedelta(seconds=7.3), NOW - timedelta(seconds=1.1), 0.5)]
    standing = Standing(Budget(0.5, ROLLING_7D), used_hours(uses, window_start(ROLLING_7D, NOW), NOW), HUB_RECORD)
    frees = frees_up_at(standing, 0.5, NOW, uses)
    assert frees is not None and frees - timedelta(days=7) == pytest.approx(NOW - timedelta(seconds=1.1), abs=timedelta(milliseconds=1))


# ---------------------------------------------------------------- cost budgets


def test_a_cost_is_checked_like_the_hours():
    assert budget_problems({"cost": 150, "window": "week"}, {"lab": {"hours": 20, "cost": 400, "window": "day"}}) == []
    problems = budget_problems({"cost": -5}, {"x": {"hours": 2, "cost": "lots"}})
    assert any("c.GPUSpawner.user_gpu_budget['cost'] must be a number >= 0 (0: no cost budget)" in p for p in problems)
    assert any("c.GPUSpawner.group_gpu_budgets['x']['cost']" in p for p in problems)
    assert budget_problems({"cost": True}, {})
    assert budget_problems({"window": "week"}, {})  # neither limit: as before, the hours are asked for


def test_each_limit_is_chosen_on_its_own():
    default = {"hours": 20, "window": "week"}  # no cost budget for everyone
    groups = {"lab": {"cost": 70, "window": "day"}, "rich": {"cost": 300, "window": "week"}}
    assert budget_for(default, groups, ["lab"]) == Budget(20, WEEK, "user")
    assert budget_for(default, groups, []) is not None and budget_for(default, groups, [], COST) is None
    # 70 a day (490 a week) beats 300 a week
    assert budget_for(default, groups, ["lab", "rich"], COST) == Budget(70, DAY, "group lab", COST)
    assert budget_for({"cost": 0, "hours": 3}, {}, [], COST) is None  # 0: no cost budget
    assert budget_for({"cost": 50}, {}, [], HOURS) is None  # a cost budget alone: no GPU-hour budget


def test_what_an_hour_costs_in_money():
    h100 = Offering(slug="h100", kind=Kind.FULL, display_name="H100", resources={"nvidia.com/gpu": 1}, counts=(1, 2), price_per_hour=5.0)
    assert hourly(h100, 2, COST) == 10.0 and hourly(h100, 2) == 2.0
    unpriced = Offering(slug="t4", kind=Kind.FULL, display_name="T4", resources={"nvidia.com/gpu": 1})
    assert hourly(unpriced, 1, COST) == 0.0  # no price: free of a cost budget
    # Prometheus' unit-hours at the prices; an offering gone from the catalog costs nothing
    assert weighted_hours({"h100": 3, "gone": 4}, {"h100": 5.0}, 0.0) == 15.0


def test_the_ledger_keeps_the_price_of_an_hour():
    rows = close_rows([use_row(at(26, 9), 2.0, 10.0), {"start": at(26, 12).isoformat(), "end": None, "cost": 1.0}], at(26, 14))
    assert uses_from_rows(rows) == [Use(at(26, 9), at(26, 14), 2.0), Use(at(26, 12), at(26, 14), 1.0)]
    # money: the row's price; a row written before rows had one costs nothing
    uses = uses_from_rows(rows, COST)
    assert uses == [Use(at(26, 9), at(26, 14), 10.0), Use(at(26, 12), at(26, 14), 0.0)]
    assert used_hours(uses, window_start(DAY, NOW), NOW) == pytest.approx(50.0)


def test_the_refusal_and_the_page_in_money():
    spent = Standing(Budget(100, WEEK, measure=COST), 97.5, HUB_RECORD)
    assert not spent.covers(5.0) and spent.covers(2.5) and spent.covers(0)
    assert refusal_text(spent, "NVIDIA H100 80GB", 5.0, NOW, frees_up_at(spent, 5.0, NOW)) == (
        "You spent 97.50 of your cost budget of 100.00 this week; an hour of NVIDIA H100 80GB costs 5.00; "
        "the next hour frees up on Monday 00:00. (Usage from the hub's own record.)"
    )
    whole = refusal_text(Standing(Budget(30, ROLLING_7D, measure=COST), 0, PROMETHEUS), "8 x H100", 40.0, NOW, None)
    assert whole.endswith("costs 40.00, more than your whole budget. (Usage measured by Prometheus.)")
    assert standing_text(Standing(Budget(1250, DAY, measure=COST), 12, PROMETHEUS)) == (
        "Your cost budget: 12.00 of 1,250.00 spent today (1,238.00 left; measured by Prometheus)."
    )
    assert cost_budget_progress(12, 100, 5) == "Cost budget: 12.00 of 100.00 spent; this server costs 5.00 per hour."
    assert OVER_COST_BUDGET == "over your cost budget"
    assert money_words(1250) == "1,250.00" and price_words(5) == "5.00 per hour"


def test_the_cost_budgets_are_exported_beside_the_hours(monkeypatch):
    from gpuspawner.hub import budgets

    monkeypatch.setattr(budgets, "LAST_COST", {"ada": Standing(Budget(100, WEEK, measure=COST), 12.5, HUB_RECORD)})
    monkeypatch.setattr(budgets, "LAST", {})
    families = {f.name: f for f in budgets._BudgetCollector().collect()}
    [spent] = families["gpuspawner_cost_budget_used"].samples
    assert spent.labels == {"user": "ada", "window": "week", "source": "hub-record"} and spent.value == 12.5
    [limit] = families["gpuspawner_cost_budget"].samples
    assert limit.value == 100
    assert families["gpuspawner_budget_remaining_hours"].samples == []  # the culler reads GPU-hours only
