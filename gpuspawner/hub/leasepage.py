"""The hub's page where a user sees and extends their GPU leases: ``/hub/gpuspawner/leases``.

The user is the hub's logged-in user (its session cookie, and JupyterHub's XSRF check on the
form's POST); the extension is asked of the culler by the hub, with the hub-side token of
:mod:`.culleractions` (scope ``custom:gpu-culler:extend-leases``), naming that user -- never
a name from the request. The notebook's "Extend" links here: the pod never extends anything.
The home page shows the same leases with the same form (``gpuspawner_leases.html``).

``Accept: application/json`` gets ``{"message", "leases"}`` instead of the page, with the same
status: 200 extended, 404 no lease runs on that server, 409 not now (nobody may extend while
someone waits for the offering; no extension left; the lease has ended), 503 the culler is
not there.

``c.JupyterHub.extra_handlers``, which adds this page to the hub, is deprecated since
JupyterHub 3.1 in favour of services (the hub logs so at start) but still served in 6.x; the
page lives in the hub because the home page's form posts to it with the hub's own session and
XSRF token, which a service would need its own OAuth login for (docs/fair-turns.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from jupyterhub.handlers.base import BaseHandler
from tornado import web


def running_servers(user: Any) -> set[str] | None:
    """The names of ``user``'s servers that run or start now, from the hub's own User (its
    ``spawners``); None where the object does not say (then nothing is left out). The culler
    forgets a stopped server's lease at its next cycle: until then, its row is not shown."""
    spawners = getattr(user, "spawners", None)
    if not isinstance(spawners, Mapping):
        return None
    return {name for name, spawner in spawners.items() if getattr(spawner, "active", False)}


#: where the page is, under the hub's prefix (``c.JupyterHub.extra_handlers`` adds ``/hub``)
LEASES_PATH = r"/gpuspawner/leases"


class LeasesPage(BaseHandler):  # type: ignore[misc]
    def initialize(self, source: Callable[[], Any]) -> None:
        """``source``: returns the hub's :class:`gpuspawner.hub.culleractions.CullerActions` (the
        one its pages use now), or None when no culler is wired."""
        self.source = source

    @web.authenticated
    async def get(self) -> None:
        await self._answer(200, "")

    @web.authenticated
    async def post(self) -> None:
        server = self.get_body_argument("server", "") or self.get_argument("server", "")
        actions = self.source()
        if actions is None:
            status, message = 503, "GPU leases are not wired on this hub (no GPU culler is configured)"
        else:
            status, message = await actions.extend(self.current_user.name, server)
        self.log.info("GPU lease of %s/%s: extend asked on the hub's page: %s %s", self.current_user.name, server, status, message)
        await self._answer(status, message)

    async def _answer(self, status: int, message: str) -> None:
        actions = self.source()
        leases: list[dict[str, Any]] = await actions.leases_for(self.current_user.name) if actions is not None else []
        running = running_servers(self.current_user)  # (not a server stopped since the culler's last cycle)
        leases = leases if running is None else [lease for lease in leases if lease.get("server", "") in running]
        self.set_status(status)
        self.set_header("Cache-Control", "no-store")
        if "application/json" in self.request.headers.get("Accept", ""):
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps({"message": message, "leases": leases}))
            return
        html = await self.render_template("gpuspawner_leases_page.html", message=message, ok=status == 200, leases=leases)
        self.finish(html)
