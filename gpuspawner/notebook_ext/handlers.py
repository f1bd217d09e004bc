"""The extension's HTTP handlers, on the single-user server (docs/user-gpu-view.md, "The API").

All are authenticated as every Jupyter Server API is (``@web.authenticated``): under
jupyterhub-singleuser only the server's owner, and tokens with
``access:servers!server=<user>/<name>`` (the culler's per-server token), get in.

Reading the status and the culler's PUT are not user activity (``_track_activity``
False): the status bar polls, and the culler must not keep alive what it watches. "Keep"
is activity, and made to look like it everywhere the culler looks.
"""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime
from typing import Any

from jupyter_server.base.handlers import APIHandler, JupyterHandler
from jupyter_server.utils import url_path_join
from tornado import web

from gpuspawner.notebook_ext.nvmldevices import Devices
from gpuspawner.notebook_ext.offering import budget_from_env, cost_budget_from_env, offering_from_env, with_choice
from gpuspawner.notebook_ext.plainpage import render_page
from gpuspawner.notebook_ext.status import leases_url, status_body
from gpuspawner.notebook_ext.view import NoticeBoard, ViewError, parse_culler_view

#: The web app's settings key holding this extension's state.
SETTINGS_KEY = "gpuspawner_notebook"


class State:
    """One server's GPU view: its devices' reader and the culler's notices."""

    def __init__(self) -> None:
        self.devices = Devices()
        self.board = NoticeBoard()

    async def status(self) -> dict[str, Any]:
        devices = await asyncio.to_thread(self.devices.read)
        shown = devices.to_json() if not isinstance(devices, list) else [d.to_json() for d in devices]
        now = datetime.now(UTC)
        return status_body(
            with_choice(offering_from_env(os.environ), shown),
            shown,
            self.board,
            now,
            budget_from_env(os.environ, now),
            leases_url(os.environ),
            cost_budget_from_env(os.environ, now),
        )


class _Base(APIHandler):
    @property
    def state(self) -> State:
        return self.settings[SETTINGS_KEY]  # type: ignore[no-any-return]

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """A JSON message, never a traceback (the culler logs what it is told)."""
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = exc.log_message if isinstance(exc, web.HTTPError) and exc.log_message else self._reason
        self.set_header("Content-Type", "application/json")
        self.finish({"message": message})


class StatusHandler(_Base):
    _track_activity = False

    @web.authenticated
    async def get(self) -> None:
        self.finish(await self.state.status())


class CullerHandler(_Base):
    _track_activity = False

    @web.authenticated
    def put(self) -> None:
        try:
            view = parse_culler_view(self.request.body, datetime.now(UTC))
        except ViewError as e:
            raise web.HTTPError(e.status, str(e)) from None
        self.state.board.post(view)
        self.set_status(204)
        self.finish()


def keep(handler: JupyterHandler, state: State) -> None:
    """The user is here: count it as activity where the culler looks, and drop the warning.

    The server's ``last_activity`` in ``/api/status`` (which jupyterhub-singleuser reports
    to the hub) and every kernel's ``last_activity`` in ``/api/kernels`` are moved to now,
    as running a cell would move them.
    """
    now = datetime.now(UTC)
    handler.settings["api_last_activity"] = now
    manager = handler.kernel_manager
    for kernel_id in list(manager.list_kernel_ids()):
        kernel: Any = manager.get_kernel(kernel_id)  # (a ServerKernelManager, with last_activity; typed as its base)
        kernel.last_activity = now
    state.board.keep()


class KeepHandler(_Base):
    @web.authenticated
    async def post(self) -> None:
        keep(self, self.state)
        self.finish(await self.state.status())


class PageHandler(JupyterHandler):
    """The plain page for classic-notebook users, and its "keep" form."""

    @property
    def state(self) -> State:
        return self.settings[SETTINGS_KEY]  # type: ignore[no-any-return]

    @web.authenticated
    async def get(self) -> None:
        keep_url = url_path_join(self.base_url, "gpuspawner", "keep")
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.finish(render_page(await self.state.status(), keep_url, self.xsrf_token.decode()))

    @web.authenticated
    def post(self) -> None:
        keep(self, self.state)
        self.redirect(url_path_join(self.base_url, "gpuspawner/"))


def handlers(base_url: str, state: State) -> list[tuple[str, type, dict[str, Any]]]:
    """The routes under the server's base_url."""
    routes = [
        ("api/gpuspawner/status", StatusHandler),
        ("api/gpuspawner/culler", CullerHandler),
        ("api/gpuspawner/keep", KeepHandler),
        ("gpuspawner/?", PageHandler),
        ("gpuspawner/keep", PageHandler),
    ]
    return [(url_path_join(base_url, path), cls, {}) for path, cls in routes]
