"""A real JupyterHub behind a real configurable-http-proxy, in a child process: the one
launcher the tests (tests/culler, tests/api, tests/compat, tests/notebook_ext), the benchmark
(bench/culler_bench.py) and the demo (gpuspawner/tools/demo.py) start their hubs with.

:class:`HubProcess` is the process: ports, the settings every such hub shares
(:meth:`HubProcess.base_config`), its log, start and stop (with every process it started: its
proxy, its servers, its managed services; no process left behind). :class:`Hub` is the
culler's hub on top of it (an admin service, an asyncio client).

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
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from gpuspawner.devcluster.ports import free_ports

#: the repository (this module runs from a clone only: it is left out of the wheel, like the demo)
REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
CHP = REPO / "node_modules" / ".bin" / "configurable-http-proxy"


def end_process(pid: int) -> None:
    """SIGTERM, then SIGKILL after 5 s, unless it is already gone."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        for _ in range(50):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def end_proxy(pid_file: Path) -> None:
    """The hub stops its proxy on a clean exit; make sure of it (no process left behind)."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return
    end_process(pid)


def process_stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a live process, from /proc/PID/stat; None
    for one that is gone or a zombie (dead, waiting for its parent to read its exit)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()  # the name may hold ')'
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else (int(fields[1]), int(fields[19]))


def descendants(pid: int) -> list[tuple[int, int]]:
    """Every live process below ``pid``, as (pid, start time): the start time tells a
    process from a later one that got the same pid."""
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in Path("/proc").iterdir():
        stat = process_stat(int(entry.name)) if entry.name.isdigit() else None
        if stat is not None:
            children.setdefault(stat[0], []).append((int(entry.name), stat[1]))
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop(0)
        found.append(child)
        todo.extend(children.get(child[0], []))
    return found


def alive(processes: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Those of ``processes`` (pid, start time) still running: the same pid and start time."""
    return [(pid, started) for pid, started in processes if (process_stat(pid) or (0, None))[1] == started]


def end_processes(processes: Iterable[tuple[int, int]], grace: float = 5) -> None:
    """End every one of ``processes`` (pid, start time) still running: SIGTERM to all at
    once, SIGKILL to those left after ``grace`` seconds. A pid that now names another
    process (another start time) is left alone."""
    left = alive(processes)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid, _ in left:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while (left := alive(left)) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not left:
            return


class HubProcess:
    """One JupyterHub process, in a session of its own (its proxy, servers and managed services
    each run in theirs), started in ``tmp`` with its log in ``log_path``; ``port`` is the proxy's public port."""

    def __init__(
        self,
        tmp: Path,
        port: int | None = None,
        hub_port: int | None = None,
        proxy_api_port: int | None = None,
        log_path: Path | None = None,
    ) -> None:
        self.tmp = Path(tmp)
        self.tmp.mkdir(parents=True, exist_ok=True)
        # Three distinct ports, chosen together: three calls of free_port() may return one port
        # twice (the OS may hand a closed port out again), and a proxy whose API port is its own
        # public port answers the hub's route list with a 404 (a hub that never started, once).
        picked = free_ports(["proxy", "hub", "proxy_api"])
        self.port = port or picked["proxy"]
        self.hub_port = hub_port or picked["hub"]
        self.proxy_api_port = proxy_api_port or picked["proxy_api"]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path or self.tmp / "hub.log"
        self.proxy_pid_file = self.tmp / "proxy.pid"
        self.proc: subprocess.Popen[bytes] | None = None

    def base_config(self) -> str:
        """The settings every test and benchmark hub shares: loopback ports, the repository's
        configurable-http-proxy, state in ``tmp``, the dummy authenticator for everyone."""
        tmp = self.tmp
        return textwrap.dedent(
            f"""
            c = get_config()  # noqa
            c.JupyterHub.ip = "127.0.0.1"
            c.JupyterHub.port = {self.port}
            c.JupyterHub.hub_ip = "127.0.0.1"
            c.JupyterHub.hub_port = {self.hub_port}
            c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{self.proxy_api_port}"
            c.ConfigurableHTTPProxy.command = [{str(CHP)!r}]
            c.ConfigurableHTTPProxy.pid_file = {str(self.proxy_pid_file)!r}
            c.JupyterHub.db_url = "sqlite:///" + {str(tmp / "jupyterhub.sqlite")!r}
            c.JupyterHub.cookie_secret_file = {str(tmp / "cookie_secret")!r}
            c.JupyterHub.pid_file = {str(tmp / "hub.pid")!r}
            c.JupyterHub.authenticator_class = "dummy"
            c.Authenticator.allow_all = True
            c.JupyterHub.allow_named_servers = True
            c.JupyterHub.concurrent_spawn_limit = 0
            c.JupyterHub.active_server_limit = 0
            c.JupyterHub.last_activity_interval = 3600
            c.Spawner.poll_interval = 3600
            """
        )

    def launch(self, config: Path | str, env: Mapping[str, str] | None = None, debug: bool = False) -> subprocess.Popen[bytes]:
        """Start ``jupyterhub -f config`` (``config``: a file, or the config's text to write to
        ``tmp/jupyterhub_config.py``) with ``env`` (default: ours); it does not wait for it."""
        if isinstance(config, str):
            path = self.tmp / "jupyterhub_config.py"
            path.write_text(config)
        else:
            path = config
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "jupyterhub", "-f", str(path)] + (["--debug"] if debug else []),
                cwd=self.tmp,
                env=dict(os.environ if env is None else env),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return self.proc

    def check_running(self) -> None:
        """Raise (with the log's tail) if the hub has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"the hub exited with {self.proc.returncode}:\n{self.log_tail()}")

    def processes(self) -> list[tuple[int, int]]:
        """The hub's live descendants, as (pid, start time): its proxy, its servers (a
        LocalProcessSpawner's each in a session of its own), its managed services, and
        whatever they started (kernels). Empty once the hub is gone: its orphans belong
        to init then, so note them while it runs."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        return descendants(self.proc.pid)

    def _ending(self, started: set[tuple[int, int]], timeout: float) -> Iterator[None]:
        """SIGTERM to the hub's session, SIGKILL after ``timeout``; it yields whenever the
        caller is to wait 0.2 s, and adds to ``started`` every process below the hub meanwhile."""
        if self.proc is None or self.proc.poll() is not None:
            return
        started.update(self.processes())  # before the signal: the hub's cleanup orphans them
        os.killpg(self.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            started.update(self.processes())  # any started meanwhile
            yield
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def end(self, timeout: float = 30) -> None:
        """End the hub and every process it started. SIGTERM to the hub's session: the hub
        stops its managed services, its servers (``cleanup_servers``) and its proxy, each in
        a session of its own that a signal to the hub's misses; SIGKILL after ``timeout``.
        Then every process noted below the hub while it ran that is still running (the hub
        was killed, or its cleanup gave up on one), and the proxy, if left."""
        started: set[tuple[int, int]] = set()
        for _ in self._ending(started, timeout):
            time.sleep(0.2)
        end_processes(started)
        end_proxy(self.proxy_pid_file)

    async def end_async(self, timeout: float = 30) -> None:
        """:meth:`end`, waiting without blocking the event loop (its servers may run on it)."""
        started: set[tuple[int, int]] = set()
        for _ in self._ending(started, timeout):
            await asyncio.sleep(0.2)
        await asyncio.to_thread(end_processes, started)
        await asyncio.to_thread(end_proxy, self.proxy_pid_file)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


class Hub(HubProcess):
    """The culler's hub: an admin service (``admin_token``), ``CULLER_TOKEN`` for its cullers.
    ``extra_config`` is Python appended to its config (it can use the names TMP, VENV_BIN, REPO)."""

    def __init__(self, tmp: Path, extra_config: str = "", api_page_max: int = 200, debug: bool = True) -> None:
        super().__init__(tmp)
        self.debug = debug
        self.proxy_port = self.port
        self.admin_token = uuid.uuid4().hex
        self.culler_token = uuid.uuid4().hex
        self.extra_config = extra_config
        self.api_page_max = api_page_max
        self.api_url = f"http://127.0.0.1:{self.hub_port}/hub/api"
        self.public_url = self.url
        self.client = AsyncHTTPClient(force_instance=True, max_clients=64)

    def config_text(self) -> str:
        return (
            self.base_config()
            + textwrap.dedent(
                f"""
            import sys
            from pathlib import Path
            TMP = Path({str(self.tmp)!r})
            VENV_BIN = Path({str(VENV_BIN)!r})
            REPO = Path({str(REPO)!r})
            EXAMPLE = REPO / "hub_config" / "culler_service_example.py"
            c.JupyterHub.api_page_max_limit = {self.api_page_max}
            c.JupyterHub.authenticate_prometheus = False
            c.JupyterHub.services = [
                {{"name": "test-admin", "api_token": {self.admin_token!r}}},
            ]
            c.JupyterHub.load_roles = [
                {{"name": "admin", "services": ["test-admin"]}},
            ]
            c.Spawner.start_timeout = 240
            c.Spawner.http_timeout = 240
            CULLER_TOKEN = {self.culler_token!r}
            """
            )
            + textwrap.dedent(self.extra_config)
        )

    async def start(self, timeout: float = 120) -> None:
        env = dict(os.environ)
        env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '')}"
        env["PYTHONPATH"] = str(REPO)
        self.launch(self.config_text(), env, debug=self.debug)
        deadline = time.monotonic() + timeout
        try:
            while True:
                self.check_running()
                try:
                    await self.api("GET", "/")
                    return
                except (OSError, HTTPClientError) as e:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"hub did not come up:\n{self.log_tail()}") from e
                    await asyncio.sleep(0.5)
        except BaseException:  # a hub that never came up is ended here: its caller has no hub to stop
            await self.end_async()
            raise

    async def stop(self) -> None:
        await self.end_async()
        self.client.close()

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

    async def user(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = await self.api("GET", f"/users/{quote(name)}")
        return found

    async def server(self, user: str, name: str = "") -> dict[str, Any] | None:
        found: dict[str, Any] | None = (await self.user(user)).get("servers", {}).get(name)
        return found

    async def create_users(self, names: list[str]) -> None:
        for i in range(0, len(names), 500):
            try:
                await self.api("POST", "/users", {"usernames": names[i : i + 500]})
            except HTTPClientError as e:
                if e.code != 409:
                    raise

    async def spawn(
        self, user: str, options: dict[str, Any], name: str = "", wait: bool = True, timeout: float = 240
    ) -> dict[str, Any] | None:
        path = f"/users/{quote(user)}/servers/{quote(name)}" if name else f"/users/{quote(user)}/server"
        try:
            await self.api("POST", path, options)
        except HTTPClientError as e:
            if e.code != 400 or b"already running" not in (e.response.body if e.response else b""):
                raise
        if not wait:
            return None
        return await self.wait_ready(user, name, timeout)

    async def wait_ready(self, user: str, name: str = "", timeout: float = 240) -> dict[str, Any]:
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
