"""A real JupyterHub behind a real configurable-http-proxy, in a child process, for the
culler's tests and benchmark (tests/culler, bench/culler_bench.py).

It runs from a clone of the repository only (configurable-http-proxy comes from the
repository's ``node_modules``, the example culler config from ``hub_config/``), so it is
left out of the wheel, like the demo.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from gpuspawner.devcluster.ports import free_port

#: the repository (this module runs from a clone only: it is left out of the wheel, like the demo)
REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
CHP = REPO / "node_modules" / ".bin" / "configurable-http-proxy"


class Hub:
    """One JupyterHub process. ``extra_config`` is Python appended to its config
    (it can use the names TMP, VENV_BIN, REPO)."""

    def __init__(self, tmp: Path, extra_config: str = "", api_page_max: int = 200, debug: bool = True) -> None:
        self.debug = debug
        self.tmp = Path(tmp)
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.hub_port = free_port()
        self.proxy_port = free_port()
        self.proxy_api_port = free_port()
        self.admin_token = uuid.uuid4().hex
        self.culler_token = uuid.uuid4().hex
        self.extra_config = extra_config
        self.api_page_max = api_page_max
        self.api_url = f"http://127.0.0.1:{self.hub_port}/hub/api"
        self.public_url = f"http://127.0.0.1:{self.proxy_port}"
        self.log_path = self.tmp / "hub.log"
        self.proc: subprocess.Popen | None = None
        self.client = AsyncHTTPClient(force_instance=True, max_clients=64)

    def config_text(self) -> str:
        return textwrap.dedent(
            f"""
            import sys
            from pathlib import Path
            TMP = Path({str(self.tmp)!r})
            VENV_BIN = Path({str(VENV_BIN)!r})
            REPO = Path({str(REPO)!r})
            EXAMPLE = REPO / "hub_config" / "culler_service_example.py"
            c = get_config()  # noqa
            c.JupyterHub.ip = "127.0.0.1"
            c.JupyterHub.port = {self.proxy_port}
            c.JupyterHub.hub_ip = "127.0.0.1"
            c.JupyterHub.hub_port = {self.hub_port}
            c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{self.proxy_api_port}"
            c.ConfigurableHTTPProxy.command = [{str(CHP)!r}]
            c.JupyterHub.db_url = "sqlite:///" + str(TMP / "jupyterhub.sqlite")
            c.JupyterHub.cookie_secret_file = str(TMP / "cookie_secret")
            c.JupyterHub.pid_file = str(TMP / "hub.pid")
            c.JupyterHub.authenticator_class = "dummy"
            c.Authenticator.allow_all = True
            c.JupyterHub.allow_named_servers = True
            c.JupyterHub.last_activity_interval = 3600
            c.JupyterHub.api_page_max_limit = {self.api_page_max}
            c.JupyterHub.authenticate_prometheus = False
            c.JupyterHub.services = [
                {{"name": "test-admin", "api_token": {self.admin_token!r}}},
            ]
            c.JupyterHub.load_roles = [
                {{"name": "admin", "services": ["test-admin"]}},
            ]
            c.JupyterHub.concurrent_spawn_limit = 0
            c.JupyterHub.active_server_limit = 0
            c.Spawner.start_timeout = 240
            c.Spawner.http_timeout = 240
            c.Spawner.poll_interval = 3600
            CULLER_TOKEN = {self.culler_token!r}
            """
        ) + textwrap.dedent(self.extra_config)

    async def start(self, timeout: float = 120) -> None:
        cfg = self.tmp / "jupyterhub_config.py"
        cfg.write_text(self.config_text())
        env = dict(os.environ)
        env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '')}"
        env["PYTHONPATH"] = str(REPO)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [str(VENV_BIN / "jupyterhub"), "-f", str(cfg)] + (["--debug"] if self.debug else []),
            cwd=self.tmp,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"hub exited {self.proc.returncode}:\n{self.log_tail()}")
            try:
                await self.api("GET", "/")
                return
            except (OSError, HTTPClientError) as e:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"hub did not come up:\n{self.log_tail()}") from e
                await asyncio.sleep(0.5)

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            for _ in range(100):
                if self.proc.poll() is not None:
                    break
                await asyncio.sleep(0.2)
            else:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.client.close()
        if getattr(self, "_log", None):
            self._log.close()

    async def api(
        self,
        method: str,
        path: str,
        body: Any = None,
        token: str | None = None,
        url: str | None = None,
    ) -> Any:
        req = HTTPRequest(
            (url or self.api_url) + path,
            method=method,
            headers={"Authorization": f"token {token or self.admin_token}"},
            body=None if body is None else json.dumps(body),
            allow_nonstandard_methods=True,
            request_timeout=120,
        )
        resp = await self.client.fetch(req)
        return json.loads(resp.body) if resp.body else None

    async def user(self, name: str) -> dict:
        return await self.api("GET", f"/users/{quote(name)}")

    async def server(self, user: str, name: str = "") -> dict | None:
        return (await self.user(user)).get("servers", {}).get(name)

    async def create_users(self, names: list[str]) -> None:
        for i in range(0, len(names), 500):
            try:
                await self.api("POST", "/users", {"usernames": names[i : i + 500]})
            except HTTPClientError as e:
                if e.code != 409:
                    raise

    async def spawn(self, user: str, options: dict, name: str = "", wait: bool = True, timeout: float = 240) -> dict | None:
        path = f"/users/{quote(user)}/servers/{quote(name)}" if name else f"/users/{quote(user)}/server"
        try:
            await self.api("POST", path, options)
        except HTTPClientError as e:
            if e.code != 400 or b"already running" not in (e.response.body if e.response else b""):
                raise
        if not wait:
            return None
        return await self.wait_ready(user, name, timeout)

    async def wait_ready(self, user: str, name: str = "", timeout: float = 240) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            s = await self.server(user, name)
            if s and s.get("ready"):
                return s
            if time.monotonic() > deadline:
                raise RuntimeError(f"server {user}/{name} not ready: {s}\n{self.log_tail()}")
            await asyncio.sleep(0.5)

    async def wait_stopped(self, user: str, name: str = "", timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while await self.server(user, name) is not None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"server {user}/{name} did not stop")
            await asyncio.sleep(0.3)

    async def stop_server(self, user: str, name: str = "") -> None:
        path = f"/users/{quote(user)}/servers/{quote(name)}" if name else f"/users/{quote(user)}/server"
        try:
            await self.api("DELETE", path)
        except HTTPClientError as e:
            if e.code not in (400, 404):
                raise
        await self.wait_stopped(user, name)
