"""The notebooks of a scale run: one process answers for every pod.

kwok gives each notebook pod an address of this machine (``127.X.Y.Z``) and runs nothing. A real
``jupyterhub-singleuser`` per pod (the pod runner of the demo) would spend the 2-core machine on
600 Python processes, and the benchmark measures the hub, not the notebook. So one tornado
process listens on the spawners' ``port`` on every address (``0.0.0.0``: all of ``127.0.0.0/8``
reaches it) and answers the requests a hub and a culler make of a Jupyter server: the server's
URL (the hub's readiness check), ``api``, ``api/status`` and ``api/kernels`` (one idle kernel).

    python -m bench.scale.notebooks PORT
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from datetime import UTC, datetime

from tornado import web

STARTED = time.time()


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


class Server(web.RequestHandler):
    def check_xsrf_cookie(self) -> None:
        pass

    def get(self, user: str, path: str) -> None:
        self.set_header("Content-Type", "application/json")
        if path.startswith("api/kernels"):
            kernels = [{"id": f"k-{user}", "name": "python3", "last_activity": _iso(STARTED), "execution_state": "idle", "connections": 1}]
            self.finish(json.dumps(kernels))
        elif path.startswith("api/status"):
            self.finish({"started": _iso(STARTED), "last_activity": _iso(STARTED), "connections": 1, "kernels": 1})
        else:
            self.finish({"version": "2.14.0"})

    def delete(self, user: str, path: str) -> None:
        self.set_status(204)
        self.finish()


async def serve(port: int) -> None:
    app = web.Application([(r"/user/([^/]+)/?(.*)", Server)], log_function=lambda handler: None)
    app.listen(port, "0.0.0.0")
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1])))
