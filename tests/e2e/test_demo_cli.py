"""`python -m gpuspawner.tools.demo`: prints where to go, and Ctrl-C leaves no process and no files behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from gpuspawner.devcluster.hub import descendants, process_stat
from gpuspawner.devcluster.ports import free_port

pytestmark = pytest.mark.cluster


def processes_mentioning(text: str) -> list[str]:
    """Processes whose command line names ``text`` or that run inside it (the hub's services do)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                cwd = os.readlink(proc / "cwd")
            except OSError:
                continue
            if text in cmdline or cwd.startswith(text):
                found.append(f"{proc.name}: {cmdline[:160]}")
    return found


def test_demo_starts_and_ctrl_c_cleans_up(devcluster):  # devcluster: the binaries are built
    port = free_port()
    demo = subprocess.Popen(
        [sys.executable, "-m", "gpuspawner.tools.demo", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines = []
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            line = demo.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "Press Ctrl-C" in line:
                break
        output = "".join(lines)
        assert f"JupyterHub with GPUSpawner is running: http://127.0.0.1:{port}" in output, output
        assert "student1" in output and "researcher1" in output and "password: gpu" in output
        state = re.search(r"Hub log: (\S+)/jupyterhub.log", output).group(1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/hub/login", timeout=10) as resp:
            assert resp.status == 200
        prometheus = re.search(r"Prometheus: (http://127.0.0.1:\d+)", output).group(1)
        with urllib.request.urlopen(f"{prometheus}/-/ready", timeout=10) as resp:
            assert resp.status == 200
        # the stand-in's access log is a file in the scratch folder, not on the console
        assert (Path(state) / "dcgm-exporter.access.log").exists() and "GET /metrics" not in output
        running = processes_mentioning(state)
        assert any("gpuspawner.culler" in p for p in running), running  # the hub's managed service too
        # Everything the demo started, however deep: the control plane, the pod runner's
        # servers, the hub, and the proxy and culler that the hub starts in sessions of their own.
        started = descendants(demo.pid)
        names = " ".join(Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace") for pid, _ in started)
        assert "configurable-http-proxy" in names and "gpuspawner.culler" in names and "kube-apiserver" in names
        assert "/prometheus\x00--config.file=" in names

        os.killpg(demo.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends to the foreground group
        assert demo.wait(timeout=90) == 0
        assert "demo stopped" in demo.stdout.read()
        leftovers = processes_mentioning(state)
        assert leftovers == [], leftovers
        alive = [pid for pid, since in started if (process_stat(pid) or (0, None))[1] == since]
        assert alive == [], [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in alive]
        assert not Path(state).exists()
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
