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
    try:
        hours = float(env[v.ENV_BUDGET_HOURS])
        used_then = float(env[v.ENV_BUDGET_USED])
        cost = float(env.get(v.ENV_BUDGET_COST, "0") or 0)
        as_of = datetime.fromisoformat(env[v.ENV_BUDGET_AS_OF])
        elapsed = max(0.0, (now - as_of).total_seconds())
    except (KeyError, ValueError, TypeError):
        return None
    window = env.get(v.ENV_BUDGET_WINDOW, "")
    used = used_then + cost * elapsed / 3600
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
