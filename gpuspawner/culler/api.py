"""The culler service's HTTP face: ``/metrics`` and the action log's JSON API.

``GET <prefix>api/actions`` lists the culler's recent actions, newest first, as
:func:`.notices.action_record` writes them. Authenticated by JupyterHub's own
service auth (:class:`jupyterhub.services.auth.HubAuth`: ``Authorization: token
<hub token>``, checked against the hub, cached briefly), which admits tokens with
``access:services!service=<this service>``. What a caller sees then depends on
its scopes:

* anyone admitted: their own actions only (``?user=`` may name only themselves);
* with ``custom:gpu-culler:read-actions`` (a JupyterHub custom scope) or
  ``admin:users``: everyone's, filtered by ``?user=`` when given.

``?limit=`` (1..1000, default 100). Errors are JSON ``{"status", "message"}``.

``GET <prefix>api/turns`` says, per offering, when an idle server will make room for the
spawns waiting for it (:class:`TurnsHandler`).

``GET <prefix>api/leases`` lists running servers' GPU leases (when each ends, the extensions
left, why one cannot be extended now), with the same rule of whose; ``POST
<prefix>api/leases?user=<name>&server=<name>`` extends one by one extension: a user their own,
a holder of ``custom:gpu-culler:extend-leases`` (the hub's pages) anyone's
(:class:`LeasesHandler`). 404 no lease runs, 409 not now (the words say why).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, NoReturn

from jupyterhub.services.auth import HubAuth, HubAuthenticated, UserNotAllowed
from tornado import web

from gpuspawner.culler.actionlog import ActionLog
from gpuspawner.culler.cullmetrics import CullerMetrics, MetricsHandler
from gpuspawner.culler.leases import LeaseRefused

#: the custom scope that lets its holder read every user's actions
READ_ALL_SCOPE = "custom:gpu-culler:read-actions"
#: the custom scope that lets its holder extend any user's GPU lease (the hub's pages, on the user's behalf)
EXTEND_ALL_SCOPE = "custom:gpu-culler:extend-leases"
#: scopes that read every user's actions (an admin's ``admin:users`` too)
DEFAULT_READ_ALL_SCOPES: tuple[str, ...] = (READ_ALL_SCOPE, "admin:users")
MAX_LIMIT = 1000


class ActionsHandler(HubAuthenticated, web.RequestHandler):
    """``GET api/actions``: a user's own actions, or everyone's for readers of all."""

    def initialize(self, actions: ActionLog, hub_auth: HubAuth, read_all_scopes: tuple[str, ...]) -> None:
        self.actions = actions
        self.hub_auth = hub_auth
        self.read_all_scopes = read_all_scopes

    async def prepare(self) -> None:
        # HubAuthenticated.get_current_user asks the hub synchronously (in a
        # thread); here it is awaited, and the mixin's own check admits it.
        try:
            model = await self.hub_auth.get_user(self, sync=False)
        except web.HTTPError as e:  # the hub did not answer: not this service's fault, nor the caller's
            if e.status_code < 500:
                raise
            self._refuse(503, "the hub could not be asked whose token this is; try again shortly")
        if model:
            try:
                model = self.check_hub_user(model)
            except UserNotAllowed:
                model = None
                self._refuse(403, "this token may not use the gpu-culler service: it needs access:services!service=<the culler's name>")
        self._hub_auth_user_cache = model

    def _refuse(self, status: int, message: str) -> NoReturn:
        raise web.HTTPError(status, reason=None, log_message=message)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = getattr(exc, "log_message", None) or self._reason
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"status": status_code, "message": message}))

    def _reads_all(self, model: dict[str, Any]) -> bool:
        return any(self.hub_auth.check_scopes({s}, model) for s in self.read_all_scopes)

    def get(self) -> None:
        model = self.current_user
        if not model:
            self._refuse(403, "no valid hub token: send 'Authorization: token <your JupyterHub API token>'")
        raw_limit = self.get_argument("limit", "100")
        try:
            limit = int(raw_limit)
            if not 1 <= limit <= MAX_LIMIT:
                raise ValueError
        except ValueError:
            self._refuse(400, f"limit={raw_limit!r}: give a whole number from 1 to {MAX_LIMIT}")
        wanted = self.get_argument("user", None)
        is_user = model.get("kind", "user") == "user"
        if self._reads_all(model):
            user = wanted
        elif is_user and wanted in (None, model["name"]):
            user = model["name"]
        elif is_user:
            self._refuse(403, f"you may read only your own actions (user={model['name']!r}); reading {wanted!r}'s needs {READ_ALL_SCOPE}")
        else:
            self._refuse(403, f"this service has no user's actions of its own; reading all needs {READ_ALL_SCOPE}")
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps({"actions": self.actions.entries(user, limit), "user": user}))


class TurnsHandler(ActionsHandler):
    """``GET api/turns``: per offering slug, when an idle server in turn will make room for
    the spawns waiting for it (``{"turns": {slug: ISO time}}``), for the hub to tell the
    waiting. Offerings and times only, nobody's name: any token admitted to the service
    reads it."""

    def initialize(self, turns: Callable[[], Mapping[str, datetime]], hub_auth: HubAuth) -> None:  # type: ignore[override]
        self.turns = turns
        self.hub_auth = hub_auth

    def get(self) -> None:
        if not self.current_user:
            self._refuse(403, "no valid hub token: send 'Authorization: token <your JupyterHub API token>'")
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps({"turns": {slug: at.isoformat() for slug, at in self.turns().items()}}))


class LeasesHandler(ActionsHandler):
    """``GET api/leases``: running servers' GPU leases (a user's own, or everyone's for readers
    of all); ``POST api/leases?user=&server=``: extend one."""

    def initialize(  # type: ignore[override]
        self,
        leases: Callable[[str | None], list[dict[str, Any]]],
        extend: Callable[[str, str], dict[str, Any]],
        hub_auth: HubAuth,
        read_all_scopes: tuple[str, ...],
    ) -> None:
        self.leases = leases
        self.extend = extend
        self.hub_auth = hub_auth
        self.read_all_scopes = read_all_scopes

    def _whose(self, model: dict[str, Any], scopes: tuple[str, ...], verb: str) -> str | None:
        wanted = self.get_argument("user", None)
        is_user = model.get("kind", "user") == "user"
        if any(self.hub_auth.check_scopes({s}, model) for s in scopes):
            return wanted
        if is_user and wanted in (None, model["name"]):
            return str(model["name"])
        if is_user:
            self._refuse(403, f"you may {verb} only your own GPU leases (user={model['name']!r}), not {wanted!r}'s")
        self._refuse(403, f"this service has no GPU lease of its own; to {verb} a user's it needs {scopes[0]}")
        return None  # not reached

    def get(self) -> None:
        model = self.current_user
        if not model:
            self._refuse(403, "no valid hub token: send 'Authorization: token <your JupyterHub API token>'")
        user = self._whose(model, self.read_all_scopes, "read")
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps({"leases": self.leases(user), "user": user}))

    def post(self) -> None:
        model = self.current_user
        if not model:
            self._refuse(403, "no valid hub token: send 'Authorization: token <your JupyterHub API token>'")
        user = self._whose(model, (EXTEND_ALL_SCOPE,), "extend")
        if user is None:
            self._refuse(400, "name the lease's user: ?user=<name>&server=<server name, empty for the default server>")
        server = self.get_argument("server", "")
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        try:
            answer = self.extend(user, server)
        except LeaseRefused as e:
            self._refuse(e.status, str(e))
        self.finish(json.dumps(answer))


def make_service_app(
    metrics: CullerMetrics,
    prefix: str = "/",
    actions: ActionLog | None = None,
    hub_auth: HubAuth | None = None,
    read_all_scopes: tuple[str, ...] = DEFAULT_READ_ALL_SCOPES,
    turns: Callable[[], Mapping[str, datetime]] | None = None,
    leases: Callable[[str | None], list[dict[str, Any]]] | None = None,
    extend: Callable[[str, str], dict[str, Any]] | None = None,
) -> web.Application:
    """Serve ``<prefix>metrics`` and, with an action log and a :class:`HubAuth`,
    ``<prefix>api/actions`` (both at ``/`` too: the hub's proxy forwards the
    service's prefix, a scraper or the hub's pages may ask the address itself)."""
    prefix = "/" + prefix.strip("/") + "/" if prefix.strip("/") else "/"
    routes: list[Any] = [(r"/metrics", MetricsHandler, {"metrics": metrics})]
    if prefix != "/":
        routes.append((prefix + "metrics", MetricsHandler, {"metrics": metrics}))
    if actions is not None and hub_auth is not None:
        kw = {"actions": actions, "hub_auth": hub_auth, "read_all_scopes": tuple(read_all_scopes)}
        for base in sorted({"/", prefix}):
            routes.append((base + "api/actions", ActionsHandler, kw))
            if turns is not None:
                routes.append((base + "api/turns", TurnsHandler, {"turns": turns, "hub_auth": hub_auth}))
            if leases is not None and extend is not None:
                lease_kw = {"leases": leases, "extend": extend, "hub_auth": hub_auth, "read_all_scopes": tuple(read_all_scopes)}
                routes.append((base + "api/leases", LeasesHandler, lease_kw))
    return web.Application(routes)
