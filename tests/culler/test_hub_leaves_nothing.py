"""Ending a test hub (gpuspawner.devcluster.hub.HubProcess.end) ends every process it started.

JupyterHub starts each LocalProcessSpawner server and each managed service in a session of
its own (``start_new_session=True`` in jupyterhub/spawner.py and services/service.py), so the
SIGTERM to the hub's session misses them: the hub stops them in its own cleanup, one service
after another, each with SIGINT, then SIGTERM 30 s later, then SIGKILL 30 s after that. A hub
killed before its cleanup is done -- the tests give it 20 to 30 s -- left them running, with
whatever they had started (a server's kernels, in sessions of their own too).

Here the server and the managed service ignore SIGINT and SIGTERM, and each has started a
child in a session of its own that ignores SIGTERM: the hub's cleanup cannot finish within
``end``'s timeout, and a hub killed leaves all four behind unless ``end`` ends them itself.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import pytest_asyncio

from gpuspawner.devcluster.hub import alive
from tests.culler.culler_hub import Hub

pytestmark = pytest.mark.asyncio(loop_scope="session")

#: a server (or a managed service) that no polite signal stops, with a child of its own in a
#: session of its own (as a kernel is); the server answers HTTP at JUPYTERHUB_SERVICE_URL
STUBBORN = """
import os, signal, subprocess, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import urlparse

signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
CHILD = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)"
subprocess.Popen([sys.executable, "-c", CHILD, "stubborn-child"], start_new_session=True)


class Up(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"up")

    def log_message(self, *args):
        pass


url = os.environ.get("JUPYTERHUB_SERVICE_URL")
if url and "server" in sys.argv:
    HTTPServer(("127.0.0.1", urlparse(url).port), Up).serve_forever()
time.sleep(3600)
"""

CONFIG = """
import sys
from jupyterhub.spawner import SimpleLocalProcessSpawner

c.JupyterHub.spawner_class = SimpleLocalProcessSpawner
c.SimpleLocalProcessSpawner.home_dir_template = str(TMP / "home" / "{username}")
c.Spawner.cmd = [sys.executable, str(TMP / "stubborn.py"), "server"]
c.JupyterHub.services.append({"name": "stubborn", "command": [sys.executable, str(TMP / "stubborn.py"), "service"]})
"""


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest_asyncio.fixture(loop_scope="session")
async def hub(tmp_path):
    (tmp_path / "stubborn.py").write_text(STUBBORN)
    h = Hub(tmp_path, CONFIG, debug=False)
    try:
        await h.start()
        yield h
    finally:
        await h.stop()


async def test_ending_a_hub_ends_its_servers_services_and_their_children_even_if_it_is_killed(hub):
    await hub.create_users(["ann"])
    await hub.spawn("ann", {})
    started = hub.processes()
    names = [cmdline(pid) for pid, _ in started]
    # what the hub started: its proxy, the server and the service, and each one's child
    assert sum("configurable-http-proxy" in n for n in names) == 1, names
    assert sum("stubborn.py server" in n for n in names) == 1, names
    assert sum("stubborn.py service" in n for n in names) == 1, names
    assert sum("stubborn-child" in n for n in names) == 2, names
    try:
        # far less than the hub's cleanup needs for processes that ignore SIGINT and SIGTERM
        # (30 s, then 30 s more, for each): the hub is killed in the middle of it
        await hub.end_async(timeout=3)
        assert hub.proc is not None and hub.proc.returncode == -signal.SIGKILL, hub.log_tail()
        left = alive(started)
        assert left == [], [cmdline(pid) for pid, _ in left]
    finally:
        for pid, _ in alive(started):  # never leave them to the next test, even failing
            os.kill(pid, signal.SIGKILL)
