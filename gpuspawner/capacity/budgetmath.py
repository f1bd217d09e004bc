"""GPU-hour budgets: how many weighted GPU-hours a user may use per window. Pure.

The admin's settings (docs/fair-turns.md): ``c.GPUSpawner.user_gpu_budget = {"hours": 20,
"window": "week"}`` for every user, ``c.GPUSpawner.group_gpu_budgets = {"students": {"hours":
10, "window": "day"}}`` per group. A user in several groups (or with the default and a group)
gets the most generous one: the most hours per day of its window. 0 hours or no setting: no
budget.

Windows (in ``c.GPUSpawner.site_timezone``):

- ``day``: since 00:00 today;
- ``week``: the calendar week, since Monday 00:00;
- ``rolling-7d``: the last 7 x 24 hours.

Usage is GPU-hours weighted per offering (``gpu_hour_cost``, default 1 per GPU unit held):
intervals of a server holding GPUs, each with its cost per hour. The hub measures it from
Prometheus or, when Prometheus cannot answer, from its own ledger (gpuspawner.hub.budgets);
this module only counts.

A cost budget (``"cost"`` in the same settings: ``{"hours": 20, "cost": 150, "window":
"week"}``) is the same in the site's money: an hour of an offering costs its ``price_per_hour``
per unit, an offering without a price costs nothing against it. It has the same windows, the
same "most generous" rule (the most money per day) and the same refusal; a budget setting may
hold either limit or both, and each is chosen on its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from gpuspawner.core.wording import money_words
from gpuspawner.names.vocabulary import BUDGET_COST, BUDGET_HOURS

DAY = "day"
WEEK = "week"
ROLLING_7D = "rolling-7d"
WINDOWS: dict[str, timedelta] = {DAY: timedelta(days=1), WEEK: timedelta(days=7), ROLLING_7D: timedelta(days=7)}
#: How the refusal and the page name a window.
WINDOW_WORDS = {DAY: "today", WEEK: "this week", ROLLING_7D: "in the last 7 days"}

#: The sources of a usage figure (said with every figure, in the metric and in the refusal).
PROMETHEUS = "prometheus"
HUB_RECORD = "hub-record"

#: What a budget limits: weighted GPU-hours (``hours``) or money (``cost``, at ``price_per_hour``).
HOURS = BUDGET_HOURS
COST = BUDGET_COST


@dataclass(frozen=True)
class Budget:
    """``hours`` weighted GPU-hours per ``window`` (a cost budget, ``measure`` :data:`COST`:
    ``hours`` is the money); ``source`` says where the setting came from ("user" or "group <name>")."""

    hours: float
    window: str
    source: str = "user"
    measure: str = HOURS

    @property
    def per_day(self) -> float:
        return self.hours / WINDOWS[self.window].days


def validate_budget(value: Any, where: str) -> None:
    """Raise ValueError naming ``where`` unless ``value`` is ``{"hours": >= 0, "cost": >= 0,
    "window": ...}`` (either limit may be left out; or empty)."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} must be a dict like {{'hours': 20, 'window': 'week'}}, got {value!r}")
    if not value:
        return
    unknown = set(value) - {HOURS, COST, "window"}
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {sorted(unknown)}; the keys are 'hours', 'cost' and 'window'")
    for key in [k for k in (HOURS, COST) if k in value] or [HOURS]:  # (one of the two at least)
        limit = value.get(key)
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not 0 <= limit < float("inf"):
            raise ValueError(f"{where}[{key!r}] must be a number >= 0 (0: no {_NAMES[key]}), got {limit!r}")
    window = value.get("window", WEEK)
    if window not in WINDOWS:
        raise ValueError(f"{where}['window'] must be one of {sorted(WINDOWS)}, got {window!r}")


def budget_problems(user_budget: Any, group_budgets: Any) -> list[str]:
    """What is wrong with the two settings (empty when nothing is)."""
    problems = []
    try:
        validate_budget(user_budget, "c.GPUSpawner.user_gpu_budget")
    except ValueError as exc:
        problems.append(str(exc))
    if not isinstance(group_budgets, Mapping):
        return [*problems, f"c.GPUSpawner.group_gpu_budgets must be a dict of group -> budget dict, got {group_budgets!r}"]
    for group, value in group_budgets.items():
        try:
            validate_budget(value, f"c.GPUSpawner.group_gpu_budgets[{group!r}]")
        except ValueError as exc:
            problems.append(str(exc))
    return problems


#: What each measure is called where a setting is wrong.
_NAMES = {HOURS: "budget", COST: "cost budget"}


def _budget(value: Mapping[str, Any], source: str, measure: str) -> Budget | None:
    limit = float(value.get(measure) or 0)
    return Budget(limit, value.get("window", WEEK), source, measure) if limit > 0 else None


def budget_for(
    user_budget: Mapping[str, Any], group_budgets: Mapping[str, Mapping[str, Any]], groups: Iterable[str], measure: str = HOURS
) -> Budget | None:
    """The user's budget of ``measure`` (GPU-hours, or money: :data:`COST`): the most generous of
    the default and their groups' (most per day; on a tie the longer window); None when none
    applies (no budget)."""
    found = [_budget(user_budget, "user", measure)] if user_budget else []
    found += [_budget(group_budgets[g], f"group {g}", measure) for g in sorted(set(groups)) if g in group_budgets]
    budgets = [b for b in found if b is not None]
    if not budgets:
        return None
    return max(budgets, key=lambda b: (b.per_day, WINDOWS[b.window], b.hours))


def window_start(window: str, now: datetime) -> datetime:
    """When ``window`` began, for ``now`` (an aware datetime in the site's time zone)."""
    if window == ROLLING_7D:
        return now - WINDOWS[ROLLING_7D]
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if window == DAY:
        return midnight
    return midnight - timedelta(days=now.weekday())


@dataclass(frozen=True)
class Use:
    """A server holding GPUs from ``start`` to ``end`` (None: still running) at ``cost`` per hour."""

    start: datetime
    end: datetime | None
    cost: float


def used_hours(uses: Iterable[Use], since: datetime, now: datetime) -> float:
    """Weighted GPU-hours of ``uses`` between ``since`` and ``now``."""
    total = 0.0
    for use in uses:
        start, end = max(use.start, since), min(use.end or now, now)
        if end > start:
            total += use.cost * (end - start).total_seconds() / 3600
    return total


@dataclass(frozen=True)
class Standing:
    """A user's budget: ``used`` of ``budget.hours`` in its window, measured from ``source`` at
    ``as_of``, while their running servers used ``rate`` GPU-hours per hour."""

    budget: Budget
    used: float
    source: str
    rate: float = 0.0
    as_of: datetime | None = None

    def at(self, now: datetime, rate: float | None = None) -> Standing:
        """The standing estimated at ``now`` (going on at ``rate`` from then, default the same):
        what ran since ``as_of`` is added; a day or week that started since then starts afresh."""
        if self.as_of is None or now <= self.as_of:
            return dataclasses.replace(self, rate=self.rate if rate is None else rate)
        used = self.used
        start = window_start(self.budget.window, now)
        if self.budget.window != ROLLING_7D and start > self.as_of:
            used = self.rate * (now - start).total_seconds() / 3600
        else:
            used += self.rate * (now - self.as_of).total_seconds() / 3600
        return Standing(self.budget, used, self.source, self.rate if rate is None else max(0.0, rate), now)

    @property
    def remaining(self) -> float:
        return max(0.0, self.budget.hours - self.used)

    def covers(self, hourly_cost: float) -> bool:
        """Whether the budget has one more hour at ``hourly_cost`` (a free offering always fits)."""
        return hourly_cost <= 0 or self.used + hourly_cost <= self.budget.hours + 1e-9


def frees_up_at(standing: Standing, hourly_cost: float, now: datetime, uses: Iterable[Use] = ()) -> datetime | None:
    """When the next hour at ``hourly_cost`` fits the budget again, if nothing more is used
    (None: it fits now, or never does, e.g. the hour costs more than the whole budget).

    A day or a week starts afresh at its next start. A rolling window frees what was used
    7 days before: the earliest time at which enough of ``uses`` has left the window.
    """
    budget = standing.budget
    if standing.covers(hourly_cost) or hourly_cost > budget.hours:
        return None
    if budget.window != ROLLING_7D:
        return window_start(budget.window, now) + WINDOWS[budget.window]
    needed = standing.used + hourly_cost - budget.hours  # hours that must leave the window
    since = window_start(ROLLING_7D, now)
    freed = 0.0
    for use in sorted(uses, key=lambda u: u.start):
        start, end = max(use.start, since), min(use.end or now, now)
        if end <= start or use.cost <= 0:
            continue
        hours = use.cost * (end - start).total_seconds() / 3600
        if freed + hours >= needed - 1e-9:  # (needed went through a sum: allow its rounding)
            left = max(0.0, needed - freed) / use.cost
            return start + timedelta(hours=left) + WINDOWS[ROLLING_7D]
        freed += hours
    return None  # measured elsewhere (Prometheus) or still running: no time to promise


def hours_text(hours: float) -> str:
    """``19.5``, ``20``, ``0.25``, ``less than 0.01``: a figure as a person writes it."""
    if 0 < hours < 0.005:
        return "less than 0.01"
    return f"{round(hours, 2):g}"


def when_text(when: datetime, now: datetime) -> str:
    """``"today at 17:00"``, ``"Monday 09:00"``, ``"3 March 09:00"`` (in ``now``'s time zone)."""
    when = when.astimezone(now.tzinfo)
    if when.date() == now.date():
        return f"today at {when:%H:%M}"
    if when - now < timedelta(days=7):
        return f"{when:%A %H:%M}"
    return f"{when.day} {when:%B %H:%M}"


def refusal_text(standing: Standing, offering_name: str, hourly_cost: float, now: datetime, frees: datetime | None) -> str:
    """The refusal: "You used 19.5 of 20 GPU-hours this week; an hour of H100 80GB costs 2
    GPU-hours; the next hour frees up on Monday 00:00." (with the source of the figure); of a
    cost budget: "You spent 95.00 of your cost budget of 100.00 this week; an hour of H100
    80GB costs 5.00; ..."."""
    budget = standing.budget
    if budget.measure == COST:
        words = (
            f"You spent {money_words(standing.used)} of your cost budget of {money_words(budget.hours)} "
            f"{WINDOW_WORDS[budget.window]}; an hour of {offering_name} costs {money_words(hourly_cost)}"
        )
    else:
        words = (
            f"You used {hours_text(standing.used)} of {hours_text(budget.hours)} GPU-hours "
            f"{WINDOW_WORDS[budget.window]}; an hour of {offering_name} costs {hours_text(hourly_cost)} GPU-hour{'' if hourly_cost == 1 else 's'}"
        )
    if frees is not None:
        words += f"; the next hour frees up {'on ' if not when_text(frees, now).startswith('today') else ''}{when_text(frees, now)}"
    elif hourly_cost > budget.hours:
        words += ", more than your whole budget"
    return words + f". (Usage {source_words(standing.source)}.)"


def cost_text(hourly_cost: float) -> str:
    """What the page says an offering's hour costs: "1 GPU-hour per hour", "0.25 GPU-hours per hour", "free"."""
    if hourly_cost <= 0:
        return "free of your GPU budget"
    return f"{hours_text(hourly_cost)} GPU-hour{'' if hourly_cost == 1 else 's'} of budget per hour"


def standing_text(standing: Standing) -> str:
    """What the spawn page shows: "Your GPU budget: 4.5 of 20 GPU-hours used this week (15.5 left)."
    (a cost budget: "Your cost budget: 12.00 of 100.00 spent this week (88.00 left; ...).")."""
    budget = standing.budget
    if budget.measure == COST:
        return (
            f"Your cost budget: {money_words(standing.used)} of {money_words(budget.hours)} spent "
            f"{WINDOW_WORDS[budget.window]} ({money_words(standing.remaining)} left; {source_words(standing.source)})."
        )
    return (
        f"Your GPU budget: {hours_text(standing.used)} of {hours_text(budget.hours)} GPU-hours used "
        f"{WINDOW_WORDS[budget.window]} ({hours_text(standing.remaining)} left; {source_words(standing.source)})."
    )


def source_words(source: str) -> str:
    """Which measurement a figure came from, in words."""
    return "measured by Prometheus" if source == PROMETHEUS else "from the hub's own record"


# --------------------------------------------------------------------------- the hub's own ledger

#: How long the ledger keeps a closed use: the longest window and a day to spare.
KEEP = timedelta(days=8)


def use_row(start: datetime, cost: float, price: float = 0.0) -> dict[str, Any]:
    """A ledger row for a server that started holding GPUs at ``start`` at ``cost`` weighted
    GPU-hours and ``price`` money per hour (JSON, for the hub's state)."""
    return {"start": start.isoformat(), "end": None, "cost": cost, "price": price}


def close_rows(rows: list[dict[str, Any]], end: datetime) -> list[dict[str, Any]]:
    """The ledger with every open row closed at ``end``."""
    return [{**r, "end": end.isoformat()} if r.get("end") is None else r for r in rows]


def kept_rows(rows: Iterable[Any], now: datetime) -> list[dict[str, Any]]:
    """The rows still needed at ``now`` (well-formed, open or closed within :data:`KEEP`)."""
    out = []
    for row, use in zip(rows, _uses(rows), strict=False):
        if use is not None and (use.end is None or now - use.end <= KEEP):
            out.append(row)
    return out


def uses_from_rows(rows: Iterable[Any], measure: str = HOURS) -> list[Use]:
    """The uses in ledger rows, each at its cost of ``measure`` per hour (money: its ``price``,
    0 in a row written before rows had one); a malformed row (hand-edited state) is skipped."""
    return [u for u in _uses(rows, measure) if u is not None]


def _uses(rows: Iterable[Any], measure: str = HOURS) -> list[Use | None]:
    out: list[Use | None] = []
    for row in rows:
        try:
            start = datetime.fromisoformat(row["start"])
            end = datetime.fromisoformat(row["end"]) if row.get("end") else None
            cost = float(row.get("cost", 1)) if measure == HOURS else float(row.get("price") or 0)
            out.append(Use(start, end, cost) if start.tzinfo is not None else None)
        except (TypeError, ValueError, KeyError, AttributeError):
            out.append(None)
    return out


def weighted_hours(unit_hours: Mapping[str, float], unit_cost: Mapping[str, float], unknown: float = 1.0) -> float:
    """GPU-hours per offering (Prometheus' unit-hours, by slug) weighted by each offering's cost of
    one unit's hour (an offering no longer in the catalog costs ``unknown``: 1 GPU-hour, no money)."""
    return sum(hours * unit_cost.get(slug, unknown) for slug, hours in unit_hours.items())


def usage_query(user: str, seconds: int, step: int, hub: str = "") -> str:
    """The PromQL for a user's unit-hours by offering over the last ``seconds``: the hub's
    ``gpuspawner_server_gpus`` (units held now, per pod) of this hub's pods only (``hub``: its
    identity, the series' ``hub`` label; "" selects the series without one, as a hub without an
    identity exports them), sampled every ``step`` seconds; each sample stands for ``step``
    seconds of holding (divide by 3600/step for hours). Each pod counts once however often it is
    scraped (one Prometheus scraping the hub twice, through two jobs or two replicas of a
    ServiceMonitor): the series are reduced to one per ``namespace``/``pod`` before the sum."""
    label = _quoted(user)
    selector = f'gpuspawner_server_gpus{{user="{label}",hub="{_quoted(hub)}"}}'
    inner = f"sum by (offering) (max by (namespace, pod, offering) ({selector}))"
    return f"sum by (offering) (sum_over_time(({inner})[{max(seconds, step)}s:{step}s]))"


def _quoted(value: str) -> str:
    """``value`` inside a PromQL string literal."""
    return value.replace("\\", "\\\\").replace('"', '\\"')
