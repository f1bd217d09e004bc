"""The culler's recent actions on the hub's own pages: "Your server 'train' was
stopped at 14:02: the whole GPU was idle for 30 minutes (limit 30)."

Hub side, in the hub's process: ``c.JupyterHub.template_vars`` gets a callable
(:func:`template_vars`) that JupyterHub calls with the *logged-in user* of each
page; it returns a coroutine function the page's template calls (JupyterHub
renders its templates with Jinja's async mode, which awaits it), so the hub's
event loop never blocks. That function asks the culler's ``api/actions`` for
**that user's** actions only (``?user=<the page's user>``), with a hub-side token
whose role holds ``custom:gpu-culler:read-actions`` -- a token that never leaves
the hub. The user's name comes from the hub's own session, never from the
request, so a page can only ever show its own user's actions. The templates
(``ui/hub_templates``: ``home.html``, ``spawn.html``) extend JupyterHub's own.

If the culler is down or slow, the page shows nothing about it (logged once),
never an error: the pages must work without the culler.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from gpuspawner.core.noticewords import when_words

#: the name templates use
TEMPLATE_VAR = "gpuspawner_culler_actions"
#: the name of the user's GPU leases in templates (``api/leases``)
LEASES_VAR = "gpuspawner_leases"
log = logging.getLogger("gpuspawner.hub.culleractions")


def hub_templates_dir() -> str:
    """The template folder for ``c.JupyterHub.template_paths``: inside the installed
    package (wheel), else the repository's."""
    package = Path(__file__).resolve().parents[1]  # gpuspawner/
    for candidate in (package / "ui" / "hub_templates", package.parent / "ui" / "hub_templates"):
        if (candidate / "gpuspawner_culler_actions.html").is_file():
            return str(candidate)
    raise FileNotFoundError(f"gpuspawner's hub page templates are missing under {package}: reinstall gpuspawner.")


def sentence(record: Mapping[str, Any], at: str) -> str:
    """ "Your server 'train' was stopped at 14:02: the whole GPU was idle for 30
    minutes (limit 30).\""""
    return f"{record.get('what', 'The culler acted on your server')} at {at}: {record.get('why', 'idle')}."


def page_items(records: list[Mapping[str, Any]], now: datetime, days: float) -> list[dict[str, str]]:
    """What the page shows: the sentence and its time, for actions of the last ``days``."""
    out = []
    for r in records:
        try:
            when = datetime.fromisoformat(str(r.get("time"))).astimezone(UTC)
        except ValueError:
            continue
        if now - when > timedelta(days=days):
            continue
        out.append({"text": sentence(r, when_words(str(r.get("time")), now)), "time": when.isoformat()})
    return out


class CullerActions:
    """Fetches one user's recent actions from the culler, for the hub's pages, and when an
    idle server will make room for the spawns waiting for an offering (``api/turns``)."""

    #: the one :func:`configure_hub` set up in this hub's process (None: no culler wired)
    latest: CullerActions | None = None

    def __init__(self, url: str, token: str, *, limit: int = 5, days: float = 7.0, timeout: float = 3.0) -> None:
        if not url or not token:
            raise ValueError("CullerActions needs the culler's api/actions URL and a hub token that may read actions")
        self.url = url
        self.token = token
        self.limit = limit
        self.days = days
        self.timeout = timeout
        #: what cannot be had from the culler now (each logged once until it answers again)
        self._failing: set[str] = set()

    async def _get(self, url: str, shown: str) -> Any:
        """The culler's JSON answer at ``url``, or None when it cannot be had: logged once
        per thing ``shown`` until it answers again (the pages work without the culler)."""
        req = HTTPRequest(
            url,
            headers={"Authorization": f"token {self.token}"},
            request_timeout=self.timeout,
            connect_timeout=self.timeout,
            follow_redirects=False,
        )
        try:
            body = json.loads((await AsyncHTTPClient().fetch(req)).body)
        except (HTTPClientError, OSError, ValueError) as e:
            if shown not in self._failing:
                log.warning("the culler's %s: %s %s", shown, url, e)
            self._failing.add(shown)
            return None
        self._failing.discard(shown)
        return body

    async def for_user(self, name: str) -> list[dict[str, str]]:
        body = await self._get(f"{self.url}?{urlencode({'user': name, 'limit': self.limit})}", "actions are not shown on the hub's pages")
        actions = body.get("actions", []) if isinstance(body, dict) else []
        records: list[Mapping[str, Any]] = (
            [r for r in actions if isinstance(r, dict) and r.get("user") == name] if isinstance(actions, list) else []
        )
        return page_items(records, datetime.now(UTC), self.days)

    def _base(self) -> str:
        """The culler's API root (``.../api/actions`` without ``api/actions``)."""
        return self.url[: -len("api/actions")] if self.url.endswith("api/actions") else self.url.rstrip("/") + "/"

    async def leases_for(self, name: str) -> list[dict[str, Any]]:
        """``name``'s running servers' GPU leases (``api/leases``); [] when the culler cannot be asked."""
        body = await self._get(f"{self._base()}api/leases?{urlencode({'user': name})}", "GPU leases are not shown on the hub's pages")
        leases = body.get("leases") if isinstance(body, dict) else None
        return [lease for lease in leases if isinstance(lease, dict) and lease.get("user") == name] if isinstance(leases, list) else []

    async def extend(self, name: str, server: str) -> tuple[int, str]:
        """Extend ``name``'s ``server``'s GPU lease on their behalf: (HTTP status, the words to
        show): 200 and what was granted, or the culler's refusal (404, 409), or 503 when the
        culler cannot be asked."""
        req = HTTPRequest(
            f"{self._base()}api/leases?{urlencode({'user': name, 'server': server})}",
            method="POST",
            body=b"",
            headers={"Authorization": f"token {self.token}"},
            request_timeout=self.timeout,
            connect_timeout=self.timeout,
            follow_redirects=False,
        )
        try:
            response = await AsyncHTTPClient().fetch(req)
        except HTTPClientError as e:
            if e.response is not None and e.code < 500:
                try:
                    message = str(json.loads(e.response.body).get("message") or e.message)
                except (ValueError, AttributeError):
                    message = str(e.message)
                return e.code, message
            log.warning("the culler could not extend %s's GPU lease: %s", name, e)
            return 503, "the GPU culler did not answer; try again in a minute"
        except OSError as e:
            log.warning("the culler could not extend %s's GPU lease: %s", name, e)
            return 503, "the GPU culler cannot be reached; try again in a minute"
        try:
            return 200, str(json.loads(response.body).get("message") or "The GPU lease was extended.")
        except ValueError:
            return 200, "The GPU lease was extended."

    async def turns(self) -> dict[str, datetime]:
        """Per offering slug, when the culler plans to stop an idle server for the spawns
        waiting for it; {} when it plans none, or cannot be asked (logged once)."""
        body = await self._get(self._base() + "api/turns", "planned turns are not shown to waiting spawns")
        raw = body.get("turns") if isinstance(body, dict) else None
        try:
            return {str(slug): datetime.fromisoformat(at) for slug, at in raw.items()} if isinstance(raw, dict) else {}
        except (TypeError, ValueError):
            return {}


def template_vars(url: str, token: str, **kw: Any) -> dict[str, Callable[[Any], Callable[[], Awaitable[list[Any]]]]]:
    """``c.JupyterHub.template_vars.update(template_vars(url, token))``: the pages'
    ``gpuspawner_culler_actions()`` and ``gpuspawner_leases()``, bound to each page's
    logged-in user."""
    source = CullerActions.latest = CullerActions(url, token, **kw)

    def bound(fetch: Callable[[str], Awaitable[list[Any]]]) -> Callable[[Any], Callable[[], Awaitable[list[Any]]]]:
        """A template var: for each page's logged-in user, ``fetch`` of that user's name ([] without one)."""

        def bind(user: Any) -> Callable[[], Awaitable[list[Any]]]:
            async def items() -> list[Any]:
                if user is None or not getattr(user, "name", None):
                    return []
                return await fetch(user.name)

            return items

        return bind

    def running_leases(user: Any) -> Callable[[], Awaitable[list[Any]]]:
        """The user's leases, of servers that run now only: the culler forgets a stopped server's
        lease at its next cycle, and until then its row lingered on the home page."""
        fetch = bound(source.leases_for)(user)

        async def items() -> list[Any]:
            from gpuspawner.hub.leasepage import running_servers  # (it imports JupyterHub's handlers)

            leases = await fetch()
            running = running_servers(user)
            return leases if running is None else [lease for lease in leases if lease.get("server", "") in running]

        return items

    return {TEMPLATE_VAR: bound(source.for_user), LEASES_VAR: running_leases}


#: the custom scope that reads every user's actions (the culler's ``actions_read_all_scopes``)
READ_ALL_ACTIONS = "custom:gpu-culler:read-actions"
#: the custom scope that extends any user's GPU lease (the hub's pages, on the user's behalf)
EXTEND_LEASES = "custom:gpu-culler:extend-leases"


def _configured(section: Any, name: str, empty: Any) -> Any:
    """What the config already set for ``section.<name>`` (appended to or not), or ``empty``."""
    value = section[name] if name in section else empty
    return value.get_value(empty) if hasattr(value, "get_value") else value


def configure_hub(c: Any, actions_url: str, *, service: str = "gpu-culler", pages_token: str | None = None) -> str:
    """Wire the culler's action log and GPU leases into a hub's config ``c``: the custom
    scopes that read every user's actions and extend any user's lease, access to the
    culler's service for every user (who then read their own), a ``<service>-pages``
    service whose token the hub's pages use (``$GPUSPAWNER_CULLER_PAGES_TOKEN``, else a new
    one at each hub start), the page templates and ``template_vars``, and the hub's page
    ``/hub/gpuspawner/leases`` where users extend their leases. Returns the pages'
    token. ``actions_url``: the culler's ``api/actions`` as the hub's process reaches it."""
    hub = c.JupyterHub
    access = f"access:services!service={service}"
    hub.custom_scopes = {
        **_configured(hub, "custom_scopes", {}),
        READ_ALL_ACTIONS: {"description": f"Read every user's actions in the {service} service's action log."},
        EXTEND_LEASES: {"description": f"Extend any user's GPU lease in the {service} service (the hub's pages, on the user's behalf)."},
    }
    roles = list(_configured(hub, "load_roles", []))
    user_role = next((r for r in roles if r["name"] == "user"), None)
    if user_role is None:
        roles.append({"name": "user", "scopes": ["self", access]})
    elif access not in user_role.get("scopes", []):
        user_role["scopes"] = [*user_role.get("scopes", ["self"]), access]
    token = pages_token or os.environ.get("GPUSPAWNER_CULLER_PAGES_TOKEN") or secrets.token_hex(32)
    pages = f"{service}-pages"
    roles.append(
        {
            "name": pages,
            "description": f"the hub's pages read each user's {service} actions",
            "scopes": [READ_ALL_ACTIONS, EXTEND_LEASES, access],
            "services": [pages],
        }
    )
    hub.load_roles = roles
    hub.services = [*_configured(hub, "services", []), {"name": pages, "api_token": token, "display": False}]
    hub.template_paths = [hub_templates_dir(), *_configured(hub, "template_paths", [])]
    hub.template_vars = {**_configured(hub, "template_vars", {}), **template_vars(actions_url, token)}
    from gpuspawner.hub.leasepage import LEASES_PATH, LeasesPage  # (it imports JupyterHub's handlers)

    hub.extra_handlers = [*_configured(hub, "extra_handlers", []), (LEASES_PATH, LeasesPage, {"source": lambda: CullerActions.latest})]
    return token
