"""The culler's integration tests: a real JupyterHub (gpuspawner.devcluster.hub), a
culler in the test's process, and a client for a real single-user server's kernels."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from datetime import timedelta
from typing import Any

from jupyterhub_idle_culler import utcnow
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect

from gpuspawner.culler import GpuCuller
from gpuspawner.culler.cycle import Culler
from gpuspawner.culler.settings import GPU_USERS_GROUP
from gpuspawner.devcluster.hub import CHP, REPO, VENV_BIN, Hub  # noqa: F401 (the tests import them from here)

#: Hub config text (the tests' spawners are SimpleLocalProcessSpawner subclasses): the
#: ``user_options["gpuspawner"]`` GPUSpawner fills for each server, the culler's contract
#: (docs/culler.md), for the offerings ``a100-80gb`` (a whole GPU) and ``t4-shared``.
CONTRACT = """
KINDS = {"a100-80gb": "full", "t4-shared": "shared"}
RESOURCES = {"full": {"nvidia.com/gpu": "1"}, "shared": {"nvidia.com/gpu.shared": "1"}}
PRICES = {"a100-80gb": 5.0, "t4-shared": 0.0}  # against a cost budget (the T4 share has no price)


def with_contract(spawner, ip, port, slug):
    # the spawner's user_options, with user_options["gpuspawner"] as GPUSpawner fills it
    opts = dict(spawner.user_options)
    opts["gpuspawner"] = {
        "offering": slug, "kind": KINDS[slug], "resources": RESOURCES[KINDS[slug]],
        "pod": "jupyter-" + spawner.user.name, "namespace": "jhub",
        "url": f"http://{ip}:{port}{spawner.server.base_url}",
        "price_per_hour": PRICES[slug],
    }
    return opts
"""


#: Hub config: the culler's role exactly as hub_config/culler_service_example.py writes it,
#: held by the test's in-process cullers (service "gpu-culler-test", token CULLER_TOKEN);
#: the example's managed service itself is not run.
EXAMPLE_ROLE = """
exec(compile(EXAMPLE.read_text(), str(EXAMPLE), "exec"))
c.JupyterHub.services = [s for s in c.JupyterHub.services if s["name"] != "gpu-culler"]
role = next(r for r in c.JupyterHub.load_roles if r["name"] == "gpu-culler")
role["services"] = ["gpu-culler-test"]
c.JupyterHub.services.append({"name": "gpu-culler-test", "api_token": CULLER_TOKEN})
"""


# --------------------------------------------------------------------------
# the culler, in the test's process
# --------------------------------------------------------------------------
class Records(logging.Handler):
    """Every log record of one culler."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def text(self, level: int = logging.DEBUG) -> str:
        return "\n".join(r.getMessage() for r in self.records if r.levelno >= level)


def in_process_culler(
    api_url: str, prometheus_url: str, token: str, *argv: str, skew: timedelta = timedelta(0)
) -> tuple[Culler, Records, GpuCuller]:
    """A culler built from command-line options as the service's would be, with
    fast retries, its log recorded, and its clock ``skew`` ahead of ours."""
    app = GpuCuller()
    app.initialize(
        [
            f"--url={api_url}",
            f"--prometheus-url={prometheus_url}",
            f"--GpuCuller.api_token={token}",
            "--offering-timeout",
            "t4-shared=14400",
            "--GpuCuller.retry_base_delay=0.05",
            "--GpuCuller.retry_max_delay=0.2",
            # A bound a loaded machine keeps to: at 5 s a notebook that answered slowly beside a scale benchmark
            # was a kernel view that failed (its busy kernel not seen, an idle one not reclaimed). A server
            # that cannot be reached is refused at once (a closed port); tests/culler/test_culler_stall.py
            # sets its own bound for one that never answers.
            *(() if any("server_request_timeout" in a for a in argv) else ("--GpuCuller.server_request_timeout=60",)),
            *(() if any("action_log_path" in a for a in argv) else ("--GpuCuller.action_log_path=",)),  # in memory
            *argv,
        ]
    )
    rec = Records()
    app.log.addHandler(rec)
    app.log.setLevel(logging.DEBUG)
    c = app.make_culler()
    c.clock = lambda: utcnow() + skew
    return c, rec, app


async def join_gpu_users(hub: Hub, users: list[str]) -> None:
    """Put ``users`` in the group whose kernels the culler's role may read
    (``tokens!group=gpu-users``, hub_config/culler_service_example.py), as an admin would."""
    try:
        await hub.api("POST", f"/groups/{GPU_USERS_GROUP}")
    except HTTPClientError as e:
        if e.code != 409:
            raise
    await hub.api("POST", f"/groups/{GPU_USERS_GROUP}/users", {"users": users})


# --------------------------------------------------------------------------
# talking to a real single-user server and its kernels, directly
# --------------------------------------------------------------------------
class Jupyter:
    def __init__(self, base_url: str, token: str) -> None:
        self.base_url = base_url
        self.token = token
        self.client = AsyncHTTPClient()

    async def _json(self, method: str, path: str, body: Any = None) -> Any:
        req = HTTPRequest(
            self.base_url + path,
            method=method,
            headers={"Authorization": f"token {self.token}"},
            body=None if body is None else json.dumps(body),
            allow_nonstandard_methods=True,
            request_timeout=120,
        )
        resp = await self.client.fetch(req)
        return json.loads(resp.body) if resp.body else None

    async def kernels(self) -> list[dict]:
        return await self._json("GET", "api/kernels?no_track_activity=1")

    async def start_kernel(self) -> str:
        k = await self._json("POST", "api/kernels", {"name": "python3"})
        return k["id"]

    async def execute(self, kernel_id: str, code: str, wait_idle: bool) -> None:
        """Send `code`; return once the kernel went busy (wait_idle False) or is idle
        again after running it (wait_idle True)."""
        ws_url = self.base_url.replace("http://", "ws://") + f"api/kernels/{kernel_id}/channels"
        req = HTTPRequest(ws_url, headers={"Authorization": f"token {self.token}"}, request_timeout=120)
        conn = await websocket_connect(req)
        try:
            msg_id = uuid.uuid4().hex
            await conn.write_message(
                json.dumps(
                    {
                        "header": {
                            "msg_id": msg_id,
                            "username": "test",
                            "session": uuid.uuid4().hex,
                            "msg_type": "execute_request",
                            "version": "5.3",
                        },
                        "parent_header": {},
                        "metadata": {},
                        "channel": "shell",
                        "buffers": [],
                        "content": {
                            "code": code,
                            "silent": False,
                            "store_history": False,
                            "user_expressions": {},
                            "allow_stdin": False,
                            "stop_on_error": True,
                        },
                    }
                )
            )
            want = "idle" if wait_idle else "busy"
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                raw = await asyncio.wait_for(conn.read_message(), 120)
                if raw is None:
                    raise RuntimeError("kernel websocket closed")
                if isinstance(raw, bytes):
                    continue
                msg = json.loads(raw)
                if (
                    msg.get("msg_type") == "status"
                    and msg.get("parent_header", {}).get("msg_id") == msg_id
                    and msg["content"].get("execution_state") == want
                ):
                    return
            raise RuntimeError("kernel never reached " + want)
        finally:
            conn.close()

    async def wait_state(self, kernel_id: str, state: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            ks = {k["id"]: k for k in await self.kernels()}
            if ks.get(kernel_id, {}).get("execution_state") == state:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"kernel {kernel_id} not {state}: {ks.get(kernel_id)}")
            await asyncio.sleep(0.3)
