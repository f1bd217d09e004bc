"""The offering this server holds, from the environment GPUSpawner gave the container. Pure.

GPUSpawner sets ``GPUSPAWNER_*`` in the notebook container (gpuspawner.pod.podspec); a server
not started by GPUSpawner has none, and its offering is ``None``. The values are the
spawn page's words: the notebook says what the user chose, as they chose it. They are
what the user's own pod says, shown to that user only; nothing trusts them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from gpuspawner.names import vocabulary as v
from gpuspawner.names.vocabulary import ENV_CHOICES, ENV_COUNT, ENV_DISPLAY_NAME, ENV_KIND, ENV_OFFERING, ENV_WORDS

#: How the status line names a budget's window.
_WINDOW_WORDS = {"day": "today", "week": "this week", "rolling-7d": "in 7 days"}


def offering_from_env(env: Mapping[str, str]) -> dict[str, Any] | None:
    """``{"slug", "display_name", "kind", "count", "words"}`` (and ``"choices"`` for an offering with
    alternatives) or ``None`` without GPUSpawner's env."""
    slug = env.get(ENV_OFFERING, "").strip()
    if not slug:
        return None
    count = env.get(ENV_COUNT, "").strip()
    offering: dict[str, Any] = {
        "slug": slug,
        "display_name": env.get(ENV_DISPLAY_NAME, "").strip() or slug,
        "kind": env.get(ENV_KIND, "").strip(),
        "count": int(count) if count.isdigit() else None,
        "words": env.get(ENV_WORDS, "").strip(),
    }
    choices = _choices(env.get(ENV_CHOICES, ""))
    if choices:
        offering["choices"] = choices
    return offering


def _choices(raw: str) -> list[dict[str, str]]:
    """An offering's alternatives (``[[label, match], ...]`` -> ``[{"label", "match"}]``); [] without them or when unreadable."""
    try:
        parsed = json.loads(raw) if raw.strip() else []
    except ValueError:
        return []
    if not isinstance(parsed, list):
        return []
    return [{"label": str(c[0]), "match": str(c[1])} for c in parsed if isinstance(c, list) and len(c) == 2]


def with_choice(offering: dict[str, Any] | None, devices: Any) -> dict[str, Any] | None:
    """The offering with ``got``: of its alternatives, the one the devices NVML reports are (the first
    whose ``match`` a device's name contains; none while NVML is unavailable). The status line names it."""
    if not offering or not offering.get("choices") or not isinstance(devices, list):
        return offering
    names = [str(d.get("name", "")) for d in devices if isinstance(d, Mapping)]
    got = next((c["label"] for c in offering["choices"] if c["match"] and any(c["match"] in n for n in names)), None)
    return {**offering, "got": got} if got else offering


def budget_from_env(env: Mapping[str, str], now: datetime) -> dict[str, Any] | None:
    """The running total of the user's GPU-hour budget: what the hub measured at spawn plus this
    server's cost per hour since then (an estimate: other servers of the user, and a new window,
    are not seen from here). ``None`` without a budget (or with figures that do not parse).

    ``{"hours", "window", "used", "cost_per_hour", "source", "as_of", "text"}``.
    """
    found = _running_total(env, now, (v.ENV_BUDGET_HOURS, v.ENV_BUDGET_USED, v.ENV_BUDGET_COST, v.ENV_BUDGET_AS_OF))
    if found is None:
        return None
    hours, used, cost, as_of = found
    window = env.get(v.ENV_BUDGET_WINDOW, "")
    text = f"GPU budget {used:.1f} / {hours:g} h {_WINDOW_WORDS.get(window, '')}".rstrip()
    return {
        "hours": hours,
        "window": window,
        "used": round(used, 4),
        "cost_per_hour": cost,
        "source": env.get(v.ENV_BUDGET_SOURCE, ""),
        "as_of": as_of.isoformat(),
        "text": text,
    }


def cost_budget_from_env(env: Mapping[str, str], now: datetime) -> dict[str, Any] | None:
    """The running total of the user's cost budget (in the site's money), as :func:`budget_from_env`
    does the GPU-hour one's: spent at spawn plus this server's price per hour since then.

    ``{"budget", "window", "spent", "price_per_hour", "source", "as_of", "text"}``.
    """
    found = _running_total(env, now, (v.ENV_COST_BUDGET, v.ENV_COST_BUDGET_SPENT, v.ENV_COST_BUDGET_PRICE, v.ENV_COST_BUDGET_AS_OF))
    if found is None:
        return None
    budget, spent, price, as_of = found
    window = env.get(v.ENV_COST_BUDGET_WINDOW, "")
    text = f"Cost budget {spent:.2f} / {budget:.2f} {_WINDOW_WORDS.get(window, '')}".rstrip()
    return {
        "budget": budget,
        "window": window,
        "spent": round(spent, 4),
        "price_per_hour": price,
        "source": env.get(v.ENV_COST_BUDGET_SOURCE, ""),
        "as_of": as_of.isoformat(),
        "text": text,
    }


def _running_total(env: Mapping[str, str], now: datetime, names: tuple[str, str, str, str]) -> tuple[float, float, float, datetime] | None:
    """(the budget, what was used then plus the rate since, the rate per hour, when it was measured)
    from the env ``names`` (budget, used, rate, as of); None where one is missing or does not parse."""
    limit, used, rate, when = names
    try:
        budget, used_then = float(env[limit]), float(env[used])
        per_hour = float(env.get(rate, "0") or 0)
        as_of = datetime.fromisoformat(env[when])
        elapsed = max(0.0, (now - as_of).total_seconds())
    except (KeyError, ValueError, TypeError):
        return None
    return budget, used_then + per_hour * elapsed / 3600, per_hour, as_of
