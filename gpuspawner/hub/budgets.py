"""GPU-hour and cost budgets on this hub: a user's usage measured (Prometheus first, the hub's
own ledger when Prometheus is not set or does not answer in time), a spawn the budget does not
cover refused with 429, the ledger kept in each server's saved state, and the figures
exported for the culler (``gpuspawner_budget_*``; the cost budget's as
``gpuspawner_cost_budget_*``: the culler stops a user's servers when either runs out). The
counting is :mod:`gpuspawner.capacity.budgetmath`'.

A cost budget (``"cost"`` in ``user_gpu_budget`` or a group's) is measured the same way, the
hours of each offering at its ``price_per_hour`` per unit (an offering without one costs
nothing against it); a spawn must fit both budgets, the GPU-hour one first.

The ledger: each GPU server's saved state (the hub's database, beside its record) keeps
``gpu_usage``, rows of ``{"start", "end", "cost", "price"}``: opened when a server with a GPU
has started, closed when it stops, kept 8 days (JupyterHub keeps a stopped server's state, so
it survives a stop and a hub restart; deleting the server, or the user, deletes it).

The spawner is read through the seam (``spawner``: :class:`gpuspawner.hub.seam.Spawner`) for the
user, the traits and the ledger.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import aiohttp
from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily

from gpuspawner.capacity.budgetmath import (
    COST,
    HOURS,
    HUB_RECORD,
    PROMETHEUS,
    Budget,
    Standing,
    Use,
    budget_for,
    close_rows,
    frees_up_at,
    kept_rows,
    refusal_text,
    usage_query,
    use_row,
    used_hours,
    uses_from_rows,
    weighted_hours,
    window_start,
)
from gpuspawner.core.model import Offering
from gpuspawner.core.noticewords import budget_progress, cost_budget_progress
from gpuspawner.hub import catalogs, metrics, spawnview
from gpuspawner.hub.scheduling import SpawnRefused
from gpuspawner.hub.seam import Spawner
from gpuspawner.hub.spawnstate import user_label
from gpuspawner.names import vocabulary as v
from gpuspawner.names.vocabulary import BUDGET_LEDGER_KEY, Refusal

#: the user's label -> their standing as last measured (the form POST's check, the metrics)
LAST: dict[str, Standing] = {}
#: the same of their cost budget
LAST_COST: dict[str, Standing] = {}
#: the user's label -> their name in the hub (the culler matches the figures to servers by it)
NAMES: dict[str, str] = {}


def budget(spawner: Spawner, measure: str = HOURS) -> Any:
    """The user's budget of ``measure`` (GPU-hours; :data:`COST`: money) (None: no budget)."""
    groups = [name for name, _ in spawnview.user_groups(spawner)]
    return budget_for(spawner.user_gpu_budget, spawner.group_gpu_budgets, groups, measure)


def any_budget(spawner: Spawner) -> bool:
    """Whether the user has a GPU-hour or a cost budget."""
    return budget(spawner) is not None or budget(spawner, COST) is not None


def hourly(offering: Offering, count: int, measure: str = HOURS) -> float:
    """What an hour of ``count`` x ``offering`` costs against a budget of ``measure``: weighted
    GPU-hours, or its price (0 where the offering has none)."""
    if measure == COST:
        return (offering.price_per_hour or 0.0) * count
    return offering.hourly_cost(count)


def _last(measure: str) -> dict[str, Standing]:
    return LAST_COST if measure == COST else LAST


def ledger_uses(spawner: Spawner, measure: str = HOURS) -> list[Use]:
    """Every use in the ledgers of the user's servers: this one's as it is now, the others' as saved."""
    rows = list(spawner.gpu_usage)
    orm_user = getattr(spawner.user, "orm_user", None)
    others = getattr(orm_user, "orm_spawners", None) or {}  # JupyterHub: {server name: orm.Spawner}
    for orm_spawner in others.values() if isinstance(others, Mapping) else others:
        if orm_spawner is not getattr(spawner, "orm_spawner", None):
            rows += list((getattr(orm_spawner, "state", None) or {}).get(BUDGET_LEDGER_KEY) or ())
    return uses_from_rows(rows, measure)


async def prometheus_hours(spawner: Spawner, since: datetime, now: datetime, catalog: list[Offering], measure: str = HOURS) -> float | None:
    """Weighted GPU-hours (or money, ``measure`` :data:`COST`) since ``since`` from Prometheus;
    None when it is not set, does not answer within ``budget_prometheus_timeout``, or answers
    with an error (logged)."""
    url = spawner.budget_prometheus_url.rstrip("/")
    if not url:
        return None
    step = spawner.budget_prometheus_step
    query = usage_query(user_label(spawner.user.name), int((now - since).total_seconds()), step, spawner.hub_id)  # this hub's pods only
    timeout = aiohttp.ClientTimeout(total=spawner.budget_prometheus_timeout)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.get(f"{url}/api/v1/query", params={"query": query, "time": f"{now.timestamp():.3f}"}) as answer:
                body = await answer.json(content_type=None)
        if body.get("status") != "success":
            raise ValueError(body.get("error") or body)
        unit_hours = {r["metric"].get("offering", ""): float(r["value"][1]) * step / 3600 for r in body["data"]["result"]}
    except (TimeoutError, aiohttp.ClientError, ValueError, KeyError, TypeError, AttributeError) as exc:
        spawner.log.warning(
            "GPUSpawner: GPU-hour budgets: Prometheus at %s gave no usage (%s); using the hub's own record", url, exc or type(exc).__name__
        )
        return None
    return weighted_hours(unit_hours, {o.slug: hourly(o, 1, measure) for o in catalog}, 0.0 if measure == COST else 1.0)


async def standing(spawner: Spawner, catalog: list[Offering], measure: str = HOURS) -> Standing | None:
    """The user's budget of ``measure`` and usage now, and where the usage came from (None: no
    budget, or a measurement that failed unexpectedly: logged, and the spawn is not held up by it)."""
    try:
        chosen = budget(spawner, measure)
        return None if chosen is None else await _standing(spawner, catalog, chosen)
    except Exception:
        spawner.log.exception("GPUSpawner: could not measure %s's %s budget; not enforcing it this time", spawner.user.name, measure)
        return None


async def _standing(spawner: Spawner, catalog: list[Offering], chosen: Budget) -> Standing:
    now = spawner.now()
    since = window_start(chosen.window, now)
    used = await prometheus_hours(spawner, since, now, catalog, chosen.measure)
    source = PROMETHEUS
    uses = ledger_uses(spawner, chosen.measure)
    if used is None:
        used, source = used_hours(uses, since, now), HUB_RECORD
    rate = sum(u.cost for u in uses if u.end is None)  # the user's running GPU servers, per hour
    found = Standing(chosen, used, source, rate, now)
    _last(chosen.measure)[user_label(spawner.user.name)] = found
    NAMES[user_label(spawner.user.name)] = spawner.user.name
    return found


#: How often a running server's poll measures its user's budget again (for the exported figures).
REFRESH_SECONDS = 300


async def refresh(spawner: Spawner) -> None:
    """Measure the user's budget again if their exported figures are missing (a restarted hub)
    or older than :data:`REFRESH_SECONDS`; called from a running server's poll."""

    def due(measure: str) -> bool:
        if budget(spawner, measure) is None:
            return False
        found = _last(measure).get(user_label(spawner.user.name))
        return found is None or found.as_of is None or (spawner.now() - found.as_of).total_seconds() >= REFRESH_SECONDS

    measures = [measure for measure in (HOURS, COST) if due(measure)]
    if not measures:
        return
    try:
        catalog = await catalogs.catalog(spawner)  # (once for both budgets)
    except Exception:  # a broken config is logged where it is used; nothing to measure with
        return
    for measure in measures:
        await standing(spawner, catalog, measure)


def refusal(spawner: Spawner, found: Standing, offering: Offering, count: int) -> SpawnRefused | None:
    """The 429 for a spawn of ``count`` x ``offering`` that ``found`` does not cover (None if it does)."""
    cost = hourly(offering, count, found.budget.measure)
    if found.covers(cost):
        return None
    now = spawner.now()
    frees = frees_up_at(found, cost, now, ledger_uses(spawner, found.budget.measure))
    name = offering.display_name if count == 1 else f"{count} x {offering.display_name}"
    return SpawnRefused(refusal_text(found, name, cost, now, frees), Refusal.BUDGET)


async def check(spawner: Spawner, offering: Offering, count: int, catalog: list[Offering]) -> None:
    """Refuse (429) a spawn the user's GPU-hour or cost budget does not cover; an offering free
    of a budget is never refused by it."""
    for measure in (HOURS, COST):
        per_hour = hourly(offering, count, measure)
        if per_hour <= 0:
            continue
        found = await standing(spawner, catalog, measure)
        refused = refusal(spawner, found, offering, count) if found is not None else None
        if refused is not None:
            metrics.refused(offering, Refusal.BUDGET)
            raise refused
        if found is None:
            continue
        state = spawner.spawn_state
        if state.pod_changes is not None:  # the user's GPU view reads the figures (no credential goes in)
            extra = env(found, per_hour, spawner.now())
            state.pod_changes = dataclasses.replace(state.pod_changes, env={**state.pod_changes.env, **extra})
        progress = cost_budget_progress if measure == COST else budget_progress
        state.messages.append(progress(found.used, found.budget.hours, per_hour))


def check_now(spawner: Spawner, offering: Offering, count: int) -> None:
    """The form POST's check, from the standings measured for the page (nothing is awaited)."""
    for measure in (HOURS, COST):
        found = _last(measure).get(user_label(spawner.user.name))
        if found is None or found.budget != budget(spawner, measure):
            continue  # the start measures it
        found = found.at(spawner.now())  # carried on to now at the user's running servers' rate
        refused = refusal(spawner, found, offering, count)
        if refused is not None:
            raise refused


def opened(spawner: Spawner, offering: Offering, count: int) -> None:
    """A server with ``count`` x ``offering`` has started: a ledger row from now (and the
    exported standing goes on at the user's new rate)."""
    cost, price = offering.hourly_cost(count), hourly(offering, count, COST)
    if cost > 0 or price > 0:
        now = spawner.now()
        spawner.gpu_usage = [*kept_rows(close_rows(spawner.gpu_usage, now), now), use_row(now, cost, price)]
        _rate_changed(spawner, now)


def closed(spawner: Spawner, at: datetime | None = None) -> None:
    """The server has stopped: its open row ends now (or ``at``, when its pod left the cluster
    behind the hub's back: its deletion began then)."""
    if spawner.gpu_usage:
        now = spawner.now()
        end = min(at, now) if at is not None else now
        spawner.gpu_usage = kept_rows(close_rows(spawner.gpu_usage, end), now)
        _rate_changed(spawner, now)


def _rate_changed(spawner: Spawner, now: datetime) -> None:
    """The user's running servers changed: their last standing goes on at the new rate."""
    user = user_label(spawner.user.name)
    for measure in (HOURS, COST):
        found = _last(measure).get(user)
        if found is not None:
            _last(measure)[user] = found.at(now, sum(u.cost for u in ledger_uses(spawner, measure) if u.end is None))


#: Each measure's env names, in :func:`env`'s order: the budget, its window, what was used, the
#: rate per hour, when and from where it was measured.
_ENV_NAMES = {
    HOURS: (v.ENV_BUDGET_HOURS, v.ENV_BUDGET_WINDOW, v.ENV_BUDGET_USED, v.ENV_BUDGET_COST, v.ENV_BUDGET_AS_OF, v.ENV_BUDGET_SOURCE),
    COST: (
        v.ENV_COST_BUDGET,
        v.ENV_COST_BUDGET_WINDOW,
        v.ENV_COST_BUDGET_SPENT,
        v.ENV_COST_BUDGET_PRICE,
        v.ENV_COST_BUDGET_AS_OF,
        v.ENV_COST_BUDGET_SOURCE,
    ),
}


def env(found: Standing | None, per_hour: float, now: datetime) -> dict[str, str]:
    """What the user's GPU view reads to show a budget's running total (no credential: figures
    only): the GPU-hour budget's ``GPUSPAWNER_BUDGET_*`` or the cost budget's
    ``GPUSPAWNER_COST_BUDGET_*``, by the budget's measure; ``per_hour``: what an hour of this server
    costs against it."""
    if found is None:
        return {}
    values = (f"{found.budget.hours:g}", found.budget.window, f"{found.used:.4f}", f"{per_hour:g}", now.isoformat(), found.source)
    return dict(zip(_ENV_NAMES[found.budget.measure], values, strict=True))


class _BudgetCollector:
    """``gpuspawner_budget_remaining_hours{user,window,name}``, ``gpuspawner_budget_used_hours{user,window,source}``,
    ``gpuspawner_budget_hours{user,window}`` and ``gpuspawner_budget_spend_rate{user,window,name}``
    (``user``: the user's pod label; ``name``: their name in the hub): each user's standing as last measured (at the
    spawn page or a spawn) and carried on to the scrape at the rate of their running GPU
    servers (:meth:`Standing.at`), for the culler and the dashboard."""

    def collect(self) -> Any:
        remaining = GaugeMetricFamily(
            v.BUDGET_REMAINING,
            "GPU-hours left in each user's budget: as last measured, carried on at the rate of their running GPU servers",
            labels=["user", "window", "name"],
        )
        used = GaugeMetricFamily(
            "gpuspawner_budget_used_hours",
            "Weighted GPU-hours each user has used in their budget's window, as last measured",
            labels=["user", "window", "source"],
        )
        limit = GaugeMetricFamily("gpuspawner_budget_hours", "Each user's GPU-hour budget", labels=["user", "window"])
        spend = GaugeMetricFamily(
            v.BUDGET_SPEND_RATE,
            "Weighted GPU-hours per hour each user's running servers spend now (the culler stops them when the budget runs out)",
            labels=["user", "window", "name"],
        )
        for user, found in _now(LAST):
            remaining.add_metric([user, found.budget.window, NAMES.get(user, user)], found.remaining)
            used.add_metric([user, found.budget.window, found.source], found.used)
            limit.add_metric([user, found.budget.window], found.budget.hours)
            spend.add_metric([user, found.budget.window, NAMES.get(user, user)], found.rate)
        yield remaining
        yield used
        yield limit
        yield spend
        # the cost budgets, the same way: for the culler (left, and the rate it goes at), the
        # report and the dashboard
        cost_left = GaugeMetricFamily(
            v.COST_BUDGET_REMAINING,
            "Money left in each user's cost budget: as last measured, carried on at the rate of their running servers",
            labels=["user", "window", "name"],
        )
        spent = GaugeMetricFamily(
            v.COST_BUDGET_USED,
            "What each user's servers cost in their cost budget's window, as last measured",
            labels=["user", "window", "source"],
        )
        cost_limit = GaugeMetricFamily(v.COST_BUDGET, "Each user's cost budget, in the site's money", labels=["user", "window"])
        cost_rate = GaugeMetricFamily(
            v.COST_BUDGET_SPEND_RATE,
            "Money per hour each user's running servers spend now (the culler stops them when the cost budget runs out)",
            labels=["user", "window", "name"],
        )
        for user, found in _now(LAST_COST):
            cost_left.add_metric([user, found.budget.window, NAMES.get(user, user)], found.remaining)
            spent.add_metric([user, found.budget.window, found.source], found.used)
            cost_limit.add_metric([user, found.budget.window], found.budget.hours)
            cost_rate.add_metric([user, found.budget.window, NAMES.get(user, user)], found.rate)
        yield cost_left
        yield spent
        yield cost_limit
        yield cost_rate


def _now(last: dict[str, Standing]) -> list[tuple[str, Standing]]:
    """Each user's standing in ``last`` carried on to now at their running servers' rate."""
    return [(user, found.at(datetime.now(found.as_of.tzinfo)) if found.as_of is not None else found) for user, found in list(last.items())]


REGISTRY.register(_BudgetCollector())
