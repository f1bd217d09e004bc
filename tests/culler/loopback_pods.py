"""Notebook "pods" and a GPU view on loopback, each a real HTTP server on a port of its
own in the test's process, for the culler's stall tests (tests/culler/test_culler_stall.py).

:class:`Pod` answers the Jupyter Server API paths the culler asks (``api/kernels``,
``api/status``, kernel shutdowns, the notice ``PUT``) as its user makes it: promptly
and honestly, listing thousands of kernels, holding every kernel request until the test
releases it (a pod that never answers), or holding shutdowns and then answering 503 (a
slow pod). It counts what it was sent and how many requests it holds open at once.

:class:`GpuAnswers` answers Prometheus' ``/api/v1/query`` with the rows of the culler's
query (``gpuspawner.culler.gpu_metrics.build_query``) for each pod the test set, in the
labels dcgm-exporter gives them (tests/culler/data/): the culler reads it as it reads
Prometheus. (The query's own PromQL is asked of the real Prometheus in
test_gpu_metrics.py and test_culler_integration.py.)
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tornado import web
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from gpuspawner.culler.gpu_query import ENGINE, FB_USED, SERIES_LABEL
from gpuspawner.names.vocabulary import BUDGET_REMAINING, BUDGET_SPEND_RATE, COST_BUDGET_REMAINING, COST_BUDGET_SPEND_RATE
from tests.culler.culler_hub import CONTRACT, EXAMPLE_ROLE, Hub, join_gpu_users


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def idle_kernels(n: int, idle_for: timedelta) -> list[dict]:
    when = _iso(datetime.now(UTC) - idle_for)
    return [
        {
            "id": f"k{i:05d}-0000-4000-8000-000000000000",
            "name": "python3",
            "execution_state": "idle",
            "last_activity": when,
            "connections": 0,
        }
        for i in range(n)
    ]


class Pod:
    """One user's server. ``kernels``: what ``api/kernels`` lists. ``hold``: which
    requests wait for :meth:`release` ("kernels": every kernel request; "shutdowns":
    kernel shutdowns, then answered ``shutdown_code``)."""

    def __init__(
        self,
        kernels: list[dict] | None = None,
        hold: str = "",
        shutdown_code: int = 204,
        refuse: int = 0,
        extension: bool = False,
    ) -> None:
        self.kernels = kernels or []
        self.hold = hold
        self.shutdown_code = shutdown_code
        #: answer every kernel request with this code (401/403: "not your token")
        self.refuse = refuse
        #: take the culler's notices (204, kept in ``notices``) as gpuspawner's extension does
        self.extension = extension
        self.notices: list[dict] = []
        self.sent: Counter[str] = Counter()
        self.open: Counter[str] = Counter()
        self.most_open: Counter[str] = Counter()
        self.released = asyncio.Event()
        self.status_activity = _iso(datetime.now(UTC) - timedelta(days=1))
        pod = self

        class Handler(web.RequestHandler):
            SUPPORTED_METHODS = ("GET", "PUT", "DELETE", "POST")

            def check_xsrf_cookie(self) -> None:
                pass

            async def _held(self, what: str) -> None:
                pod.sent[what] += 1
                if pod.refuse:
                    raise web.HTTPError(pod.refuse)
                pod.open[what] += 1
                pod.most_open[what] = max(pod.most_open[what], pod.open[what])
                try:
                    if pod.hold == "kernels" or (pod.hold == "shutdowns" and what == "DELETE kernel"):
                        await pod.released.wait()
                finally:
                    pod.open[what] -= 1

            async def get(self, path: str) -> None:
                if path.endswith("api/kernels"):
                    await self._held("GET kernels")
                    self.finish(json.dumps(pod.kernels))
                elif path.endswith("api/status"):
                    await self._held("GET status")
                    self.finish({"last_activity": pod.status_activity, "kernels": len(pod.kernels)})
                else:  # the hub's "is it up" check
                    self.finish({"version": "2.14.0"})

            async def delete(self, path: str) -> None:
                await self._held("DELETE kernel")
                self.set_status(pod.shutdown_code)
                self.finish()

            async def put(self, path: str) -> None:  # the culler's notices
                pod.sent["PUT notice"] += 1
                if pod.extension:
                    pod.notices.append(json.loads(self.request.body))
                self.set_status(204 if pod.extension else 404)
                self.finish()

            def post(self, path: str) -> None:
                self.finish({})

        sockets = bind_sockets(0, "127.0.0.1")
        self.port = sockets[0].getsockname()[1]
        self.server = HTTPServer(web.Application([(r"(.*)", Handler)]))
        self.server.add_sockets(sockets)

    def release(self) -> None:
        self.released.set()

    async def wait_open(self, what: str, n: int, guard_s: float = 120) -> None:
        """Until ``n`` requests ``what`` are held open at once (a hang guard, not a timing)."""
        deadline = time.monotonic() + guard_s
        while self.open[what] < n:
            assert time.monotonic() < deadline, f"{what}: {self.open[what]} open, never {n}"
            await asyncio.sleep(0.05)

    def close(self) -> None:
        self.release()
        self.server.stop()


class GpuAnswers:
    """Prometheus' HTTP API as the culler asks it: ``pods`` maps a pod name to its GPU's
    (engine activity mean, max, FB_USED MiB) over the window, 40 samples each."""

    def __init__(self, namespace: str = "jhub") -> None:
        self.namespace = namespace
        self.pods: dict[str, tuple[float, float, float]] = {}
        #: the hub's GPU-hour budgets, per user name: (hours left, GPU-hours spent per hour)
        self.budgets: dict[str, tuple[float, float]] = {}
        #: their cost budgets, per user name: (money left, money spent per hour)
        self.cost_budgets: dict[str, tuple[float, float]] = {}
        self.asked = 0
        answers = self

        class Query(web.RequestHandler):
            def get(self) -> None:
                answers.asked += 1
                self.finish({"status": "success", "data": {"resultType": "vector", "result": answers.rows()}})

        sockets = bind_sockets(0, "127.0.0.1")
        self.url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"
        self.server = HTTPServer(web.Application([(r"/api/v1/query", Query)]))
        self.server.add_sockets(sockets)

    def rows(self) -> list[dict]:
        out = []
        now = time.time()
        for i, (pod, (mean, peak, fb)) in enumerate(sorted(self.pods.items())):
            labels = {
                "exported_pod": pod,
                "exported_namespace": self.namespace,
                "Hostname": "gpu-node-1",
                "gpu": str(i),
                "UUID": f"GPU-{i:08d}-0000-0000-0000-000000000000",
                "modelName": "NVIDIA A100-SXM4-80GB",
            }
            for tag, value in (
                (f"{ENGINE}:avg", mean),
                (f"{ENGINE}:max", peak),
                (f"{ENGINE}:count", 40),
                (f"{FB_USED}:last", fb),
                (f"{FB_USED}:count", 40),
            ):
                out.append({"metric": {**labels, SERIES_LABEL: tag}, "value": [now, str(value)]})
        for user, (left, rate) in sorted(self.budgets.items()):  # as the hub exports them (gpuspawner.hub.budgets)
            labels = {"user": user, "name": user}
            out.append({"metric": {**labels, SERIES_LABEL: f"{BUDGET_REMAINING}:last"}, "value": [now, str(left)]})
            out.append({"metric": {**labels, SERIES_LABEL: f"{BUDGET_SPEND_RATE}:last"}, "value": [now, str(rate)]})
        for user, (left, rate) in sorted(self.cost_budgets.items()):
            labels = {"user": user, "name": user}
            out.append({"metric": {**labels, SERIES_LABEL: f"{COST_BUDGET_REMAINING}:last"}, "value": [now, str(left)]})
            out.append({"metric": {**labels, SERIES_LABEL: f"{COST_BUDGET_SPEND_RATE}:last"}, "value": [now, str(rate)]})
        return out

    def close(self) -> None:
        self.server.stop()


#: Hub config: servers are the loopback pods above, at the port the test names.
SPAWNER = (
    CONTRACT
    + """
from jupyterhub.spawner import Spawner


class LoopbackSpawner(Spawner):
    '''The server is already listening on the port the test names; this spawner
    points the hub at it, and records the contract as GPUSpawner does.'''

    running = False

    async def start(self):
        port = int(self.user_options["port"])
        self.running = True
        if self.user_options.get("offering"):
            self.user_options = with_contract(self, "127.0.0.1", port, self.user_options["offering"])
        return "127.0.0.1", port

    async def poll(self):
        return None if self.running else 0

    async def stop(self, now=False):
        self.running = False


c.JupyterHub.spawner_class = LoopbackSpawner
"""
    + EXAMPLE_ROLE
)


@asynccontextmanager
async def loopback_hub(tmp: Path, servers: dict[str, tuple[str, Pod]], gpus: GpuAnswers) -> AsyncIterator[Hub]:
    """A real JupyterHub whose users' servers are ``servers`` (user -> (offering or "" for a
    plain server, pod)), every user in the culler's group of GPU users, all running."""
    hub = Hub(tmp, SPAWNER)
    await hub.start()
    try:
        await hub.create_users(list(servers))
        await join_gpu_users(hub, list(servers))
        for user, (offering, pod) in servers.items():
            await hub.spawn(user, {"offering": offering, "port": pod.port} if offering else {"port": pod.port})
        yield hub
    finally:
        for _, pod in servers.values():
            pod.close()
        await hub.stop()
        gpus.close()
