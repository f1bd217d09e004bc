"""TEST DOUBLE for the other half of issue #17: a minimal Jupyter Server extension
that answers the culler's ``PUT {base_url}api/gpuspawner/culler`` as the real
notebook extension's contract says (docs/culler.md, "Warnings") and records
each notice it is given. It is NOT gpuspawner's notebook extension: it only lets
the culler's tests watch what reaches a real, hub-authenticated jupyter_server.

Loaded by ``jupyterhub-singleuser --ServerApp.jpserver_extensions=...``; it
writes ``~/notices.jsonl``: the body, who sent it (the token's user), and which
kernels were alive when it arrived (so a test can tell a notice of reclaimed
kernels came *before* their shutdown).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

LOG = "notices.jsonl"


def recorded(home: Path) -> list[dict]:
    path = Path(home) / LOG
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class NoticeHandler(APIHandler):
    @web.authenticated
    def put(self) -> None:
        try:
            body = json.loads(self.request.body or b"null")
        except ValueError:
            raise web.HTTPError(400, "not JSON") from None
        if not isinstance(body, dict):
            raise web.HTTPError(400, "the notice must be a JSON object")
        alive = sorted(self.kernel_manager.list_kernel_ids())
        entry = {"body": body, "by": self.current_user.username, "kernels_alive": alive, "uri": self.request.uri}
        with open(Path(os.path.expanduser("~")) / LOG, "a") as f:
            f.write(json.dumps(entry) + "\n")
        self.set_status(204)
        self.finish()


def _jupyter_server_extension_points() -> list[dict]:
    return [{"module": "notice_double"}]


def _load_jupyter_server_extension(serverapp) -> None:
    base = serverapp.web_app.settings["base_url"]
    serverapp.web_app.add_handlers(".*$", [(url_path_join(base, "api/gpuspawner/culler"), NoticeHandler)])
