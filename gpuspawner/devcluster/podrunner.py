"""Make the devcluster's notebook pods real: run each one's server on its pod IP.

kwok marks a scheduled pod Running with an IP from its node's loopback pod CIDR,
but runs nothing. For every Running pod labelled ``component=singleuser-server``,
this starts the pod's own command (``jupyterhub-singleuser`` from this Python
environment) with the pod's environment, bound to the pod's IP, so the hub's
token and URLs work and a browser reaches a real JupyterLab. When the pod is
deleted, the server is stopped. Nothing else runs: a pod whose command is not
found here (say a Bitfusion wrapper) is reported and left alone.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

from gpuspawner.devcluster.clusterstate import KubeHTTP

log = logging.getLogger("gpuspawner.podrunner")
SELECTOR = "component=singleuser-server"


@dataclass
class RunningServer:
    uid: str
    name: str
    ip: str
    process: subprocess.Popen[bytes]
    workdir: Path


def pod_command(pod: dict[str, Any]) -> list[str]:
    """The notebook container's command and args (the image's default is jupyterhub-singleuser)."""
    container = pod["spec"]["containers"][0]
    argv = [*(container.get("command") or []), *(container.get("args") or [])]
    return argv or ["jupyterhub-singleuser"]


def pod_env(pod: dict[str, Any], ip: str) -> dict[str, str]:
    """The container's plain env values, with the bind URL moved from 0.0.0.0 to the pod IP."""
    env = {}
    for item in pod["spec"]["containers"][0].get("env") or []:
        if "value" in item:
            env[item["name"]] = str(item["value"])
    url = env.get("JUPYTERHUB_SERVICE_URL")
    if url:
        parts = urlparse(url)
        env["JUPYTERHUB_SERVICE_URL"] = urlunparse(parts._replace(netloc=f"{ip}:{parts.port or 8888}"))
    return env


class PodRunner:
    """Polls the API server for notebook pods and keeps one local server per Running pod."""

    def __init__(self, kube: KubeHTTP, bin_dir: str | None = None, interval: float = 0.1, root: Path | None = None):
        self.kube = kube
        self.interval = interval
        self.bin_dir = bin_dir or str(Path(sys.executable).parent)
        self.servers: dict[str, RunningServer] = {}
        self.refused: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.root = Path(root) if root else Path(tempfile.mkdtemp(prefix="gpuspawner-pods-"))
        self.root.mkdir(parents=True, exist_ok=True)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="podrunner", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for uid in list(self.servers):
            self._end(uid)
        shutil.rmtree(self.root, ignore_errors=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except Exception as exc:  # the API server may restart: keep going
                log.warning("podrunner: %s", exc)
            self._stop.wait(self.interval)

    def sync(self) -> None:
        pods = self.kube.request("GET", f"/api/v1/pods?labelSelector={SELECTOR}")["items"]
        live = {}
        for pod in pods:
            uid = pod["metadata"]["uid"]
            ip = (pod.get("status") or {}).get("podIP")
            if pod["status"].get("phase") == "Running" and ip and "deletionTimestamp" not in pod["metadata"]:
                live[uid] = pod
        for uid in list(self.servers):
            if uid not in live:
                self._end(uid)
        for uid, pod in live.items():
            if uid not in self.servers and uid not in self.refused:
                self._begin(pod)

    def _begin(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        name = f"{meta['namespace']}/{meta['name']}"
        argv = pod_command(pod)
        program = shutil.which(argv[0], path=f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
        if program is None:
            log.warning("podrunner: %s wants %r, which this machine does not have; not running it", name, argv[0])
            self.refused.add(meta["uid"])
            return
        ip = pod["status"]["podIP"]
        workdir = self.root / meta["uid"]
        workdir.mkdir(parents=True, exist_ok=True)
        env = {
            "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            "HOME": str(workdir),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "JUPYTER_RUNTIME_DIR": str(workdir / ".runtime"),
            **pod_env(pod, ip),
        }
        logfile = open(workdir / "server.log", "ab")
        extra = [f"--ServerApp.root_dir={workdir}"]
        if os.geteuid() == 0:  # in a real pod the notebook runs as jovyan; here it may be root
            extra.append("--allow-root")
        process = subprocess.Popen(
            [program, *argv[1:], *extra],
            env=env,
            cwd=workdir,
            stdout=logfile,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        logfile.close()
        self.servers[meta["uid"]] = RunningServer(meta["uid"], name, ip, process, workdir)
        log.info("podrunner: started %s at %s (pid %d)", name, ip, process.pid)

    def _end(self, uid: str) -> None:
        """Kill the pod's server and its kernels at once. kwok hands a deleted pod's IP to
        the next pod straight away (a real node releases it only once the pod's network is
        torn down), so a server still shutting down would answer the hub's check of the
        next notebook on that IP, and the user would be sent to a server that is going."""
        server = self.servers.pop(uid)
        if server.process.poll() is None:
            try:
                os.killpg(server.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            server.process.wait(timeout=10)
        log.info("podrunner: stopped %s", server.name)
