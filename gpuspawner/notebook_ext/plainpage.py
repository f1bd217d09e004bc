"""The plain page, ``{base_url}gpuspawner/``: the same data for classic-notebook users. Pure.

No JavaScript and no template engine: the status body (gpuspawner.notebook_ext.status)
as escaped HTML, reloaded every 30 seconds, with a form that POSTs "keep".
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any

from gpuspawner.notebook_ext.summary import gb

REFRESH_SECONDS = 30


def render_page(status: Mapping[str, Any], keep_url: str, xsrf: str) -> str:
    """The whole HTML page for ``status`` (the body of ``GET .../api/gpuspawner/status``)."""
    offering = status.get("offering") or {}
    rows = [
        ("Offering", str(offering.get("display_name", "none (this server was not started with a GPU offering)"))),
        ("What it gives", str(offering.get("words", ""))),
    ]
    culler = status.get("culler")
    if culler:
        rows += [
            ("Idle since", str(culler.get("idle_since") or "not idle")),
            (
                "Next reclaim",
                f"{culler['action']} at {culler['act_at']}" if culler.get("action") and culler.get("act_at") else "nothing planned",
            ),
            ("Why", str(culler.get("reason") or "")),
        ]
    else:
        rows.append(("Idle culler", "has not reported on this server yet"))
    notices = status.get("notices") or []
    # Keep only where activity can prevent the action (not a gpu_idle_limit stop or a GPU lease)
    warning = any(n.get("kind") == "warning" and n.get("keep", True) for n in notices)
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<meta http-equiv='refresh' content='{REFRESH_SECONDS}'>",
        "<title>Your GPU</title>",
        "<style>body{font-family:sans-serif;margin:2em;max-width:48em}td,th{padding:.2em .8em;text-align:left}"
        ".warning{background:#fff3cd;border:1px solid #c69500;padding:.6em}.reclaimed{background:#eef;padding:.6em}</style>",
        "</head><body>",
        f"<h1>Your GPU</h1><p id='summary'><strong>{escape(str(status.get('summary', '')))}</strong></p>",
    ]
    for n in notices:
        kind = "warning" if n.get("kind") == "warning" else "reclaimed"
        parts.append(f"<p class='{kind}'>{escape(str(n.get('text', '')))}</p>")
    lease = status.get("lease")
    if lease:
        link = ""
        if lease.get("can_extend") and lease.get("extend_url"):
            link = f" <a id='extend' href='{escape(str(lease['extend_url']))}' target='_blank'>Extend it on the hub</a>"
        parts.append(f"<p id='lease'>{escape(str(lease.get('words', '')))}{link}</p>")
    if warning:
        parts.append(
            f"<form method='post' action='{escape(keep_url)}'><input type='hidden' name='_xsrf' value='{escape(xsrf)}'>"
            "<button type='submit' id='keep'>Keep my work</button></form>"
        )
    parts.append("<table>" + "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in rows if v) + "</table>")
    parts.append("<h2>Devices</h2>" + _devices(status.get("devices")))
    parts.append(f"<p><small>As of {escape(str(status.get('now', '')))}; this page reloads every {REFRESH_SECONDS} s.</small></p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _devices(devices: Any) -> str:
    if isinstance(devices, Mapping):
        return f"<p>GPU figures unavailable: {escape(str(devices.get('unavailable', '')))}</p>"
    if not devices:
        return "<p>No GPU is visible in this container.</p>"
    head = "<tr><th>Device</th><th>Memory used</th><th>Utilisation</th></tr>"
    rows = []
    for d in devices:
        util = "not reported" if d.get("utilization_percent") is None else f"{d['utilization_percent']} %"
        mem = f"{gb(int(d['memory_used_bytes']))} / {gb(int(d['memory_total_bytes']))} GB"
        rows.append(
            f"<tr><td>{escape(str(d.get('name', '')))}<br><small>{escape(str(d.get('uuid', '')))}</small></td><td>{mem}</td><td>{util}</td></tr>"
        )
    return "<table>" + head + "".join(rows) + "</table>"
