"""What a user can run in their own pod, for the culler's trust tests.

``SNOOP_CONFIG`` is a ``~/.jupyter/jupyter_server_config.py`` a user can write in
their home: the real jupyterhub-singleuser then appends every request's headers
to ``~/headers.jsonl``. Run as a script, this module is a notebook server that
lies to keep its GPU: every kernel busy, activity in the future, its activity
reported to the hub every second -- and it records every header it receives
too. Neither is trusted by the culler: see docs/culler.md, "Threat model".
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

HEADER_LOG = "headers.jsonl"

SNOOP_CONFIG = """
import json, os
_LOG = os.path.join(os.path.expanduser("~"), "headers.jsonl")


def _record(handler):
    with open(_LOG, "a") as f:
        f.write(json.dumps({
            "method": handler.request.method,
            "uri": handler.request.uri,
            "status": handler.get_status(),
            "headers": list(handler.request.headers.get_all()),
        }) + "\\n")


c.ServerApp.tornado_settings = {"log_function": _record}
"""


def captured(home: Path) -> list[dict]:
    """Every request a hostile pod recorded, oldest first."""
    path = Path(home) / HEADER_LOG
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def main() -> None:  # pragma: no cover  (runs as the user's server, in its own process)
    from urllib.parse import quote, urlparse

    from tornado import ioloop, web
    from tornado.httpclient import AsyncHTTPClient, HTTPRequest

    service_url = urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
    log_path = Path(os.environ.get("HOME", ".")) / HEADER_LOG
    user = os.environ["JUPYTERHUB_USER"]
    server_name = os.environ.get("JUPYTERHUB_SERVER_NAME", "")

    def future() -> str:
        return _iso(datetime.now(UTC) + timedelta(days=1))

    class Liar(web.RequestHandler):
        SUPPORTED_METHODS = ("GET", "POST", "PUT", "DELETE")

        def check_xsrf_cookie(self) -> None:
            pass

        def prepare(self) -> None:
            with open(log_path, "a") as f:
                entry = {
                    "method": self.request.method,
                    "uri": self.request.uri,
                    "headers": list(self.request.headers.get_all()),
                }
                f.write(json.dumps(entry) + "\n")

        def get(self, path: str) -> None:
            if path.endswith("api/kernels"):
                kernel = {
                    "id": "0b5e55ed-0000-4000-8000-000000000001",
                    "name": "python3",
                    "execution_state": "busy",
                    "last_activity": future(),
                    "connections": 1,
                }
                self.finish(json.dumps([kernel]))
            elif path.endswith("api/status"):
                self.finish({"last_activity": future(), "kernels": 1, "connections": 1})
            else:
                self.finish({"version": "2.14.0"})

        def post(self, path: str) -> None:
            self.finish({})

        def put(self, path: str) -> None:  # the culler's notices: taken, and ignored
            self.set_status(204)
            self.finish()

        def delete(self, path: str) -> None:  # "shut down": nothing changes
            self.set_status(204)
            self.finish()

    async def report_activity() -> None:
        """What jupyterhub-singleuser does, every second and always "now"."""
        now = _iso(datetime.now(UTC))
        body = {"last_activity": now, "servers": {server_name: {"last_activity": now}}}
        req = HTTPRequest(
            f"{os.environ['JUPYTERHUB_API_URL']}/users/{quote(user, safe='')}/activity",
            method="POST",
            headers={"Authorization": f"token {os.environ['JUPYTERHUB_API_TOKEN']}"},
            body=json.dumps(body),
        )
        try:
            await AsyncHTTPClient().fetch(req)
        except Exception:
            pass

    app = web.Application([(r"(.*)", Liar)])
    app.listen(service_url.port, service_url.hostname)
    ioloop.PeriodicCallback(report_activity, 1000).start()
    ioloop.IOLoop.current().start()


if __name__ == "__main__":
    main()
