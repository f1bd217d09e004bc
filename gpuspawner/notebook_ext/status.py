"""The body of ``GET {base_url}api/gpuspawner/status``, made from its parts. Pure.

One function makes it, so the REST API, JupyterLab's status bar and the plain page show
the same thing (docs/user-gpu-view.md, "The API").
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from gpuspawner.notebook_ext.summary import notices, status_line
from gpuspawner.notebook_ext.view import NoticeBoard


def status_body(
    offering: Mapping[str, Any] | None,
    devices: list[dict[str, Any]] | dict[str, Any],
    board: NoticeBoard,
    now: datetime,
    budget: Mapping[str, Any] | None = None,
    extend_url: str = "",
    cost_budget: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """What the notebook knows about its GPU and the culler, with the status line to show (and,
    with a GPU-hour or cost budget, its running total: ``offering.budget_from_env``,
    ``offering.cost_budget_from_env``). ``extend_url``: the hub's page where the user extends a
    GPU lease (``leases_url``)."""
    summary = " · ".join(
        [status_line(offering, devices, board.view, now, board.reclaimed), *(found["text"] for found in (budget, cost_budget) if found)]
    )
    lease = board.view.lease if board.view else None
    return {
        "offering": dict(offering) if offering else None,
        "devices": devices,
        "culler": board.view.to_json() if board.view else None,
        "lease": {**lease, "extend_url": extend_url} if lease else None,
        "notices": notices(board.view, board.reclaimed, now, extend_url),
        "summary": summary,
        "budget": dict(budget) if budget else None,
        "cost_budget": dict(cost_budget) if cost_budget else None,
        "now": now.isoformat().replace("+00:00", "Z"),
    }


def leases_url(environ: Mapping[str, str]) -> str:
    """The hub's page where a user sees and extends their GPU leases, as a path on the hub's
    own address (the notebook is served behind the same proxy): ``$JUPYTERHUB_BASE_URL`` +
    ``hub/gpuspawner/leases``; "" outside a hub."""
    if "JUPYTERHUB_API_URL" not in environ:
        return ""
    base = environ.get("JUPYTERHUB_BASE_URL") or "/"
    return base.rstrip("/") + "/hub/gpuspawner/leases"
