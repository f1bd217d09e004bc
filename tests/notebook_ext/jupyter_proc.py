"""A real Jupyter Server (or JupyterLab) in a subprocess, with gpuspawner's extension and
NVIDIA's library replaced by the stand-in (nvml_standin.py) through its config file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from gpuspawner.devcluster.ports import free_port

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
BUILT = REPO / "gpuspawner" / "notebook_ext" / "labextension"

MIG_ENV = {
    "GPUSPAWNER_OFFERING": "a100-mig-1g.10gb",
    "GPUSPAWNER_KIND": "mig",
    "GPUSPAWNER_GPU_COUNT": "1",
    "GPUSPAWNER_DISPLAY_NAME": "MIG 1g.10gb",
    "GPUSPAWNER_OFFERING_WORDS": "10 GB GPU memory · 1/7 of the GPU's compute · hardware isolated (own memory and compute)",
}


class Response:
    def __init__(self, status: int, body: bytes, headers: Any) -> None:
        self.status, self.body, self.headers = status, body, headers

    def json(self) -> Any:
        return json.loads(self.body)


class JupyterProcess:
    """``jupyter server`` (``app="lab"``: ``jupyter lab``) at ``/user/ada/`` with token auth.

    ``gpus``: the stand-in's GPUs, as Python source (a name from nvml_standin), or None for
    this machine's real lack of NVML.
    """

    def __init__(self, tmp: Path, gpus: str | None = "MIG_1G_10GB", app: str = "server", env: dict[str, str] | None = None) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.token = "ada-" + os.urandom(8).hex()
        self.base = f"http://127.0.0.1:{self.port}/user/ada/"
        self.app = app
        self.gpus = gpus
        self.env = dict(MIG_ENV if env is None else env)
        self.proc: subprocess.Popen | None = None
        self.log = tmp / "server.log"

    def start(self) -> JupyterProcess:
        (self.tmp / "root").mkdir(exist_ok=True)
        standin = ""
        if self.gpus:
            standin = f"from tests.notebook_ext.nvml_standin import StandInLib, install, {self.gpus}\ninstall(StandInLib({self.gpus}))\n"
        config = self.tmp / "jupyter_server_config.py"
        config.write_text(
            f"import sys\nsys.path.insert(0, {str(REPO)!r})\n{standin}"
            + textwrap.dedent(
                f"""
                c.ServerApp.ip = "127.0.0.1"
                c.ServerApp.port = {self.port}
                c.ServerApp.port_retries = 0
                c.ServerApp.base_url = "/user/ada/"
                c.ServerApp.open_browser = False
                c.ServerApp.allow_root = True
                c.ServerApp.root_dir = {str(self.tmp / "root")!r}
                c.IdentityProvider.token = {self.token!r}
                c.ServerApp.jpserver_extensions = {{"gpuspawner.notebook_ext": True}}
                c.LabApp.news_url = None
                c.LabApp.check_for_updates_class = "jupyterlab.NeverCheckForUpdate"
                """
            )
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSPAWNER_") and k != "PYTHONPATH"}
        env.update(self.env)
        env.update(
            {
                "JUPYTER_CONFIG_DIR": str(self.tmp / "config"),
                "JUPYTER_DATA_DIR": str(self.tmp / "data"),
                "JUPYTER_RUNTIME_DIR": str(self.tmp / "runtime"),
                # jupyter_core prefers the venv's share/jupyter over JUPYTER_DATA_DIR in a venv: a
                # `pip install -e .` copy of an older build there would hide the one under test
                "JUPYTER_PREFER_ENV_PATH": "0",
                "PATH": f"{VENV_BIN}:{env.get('PATH', '')}",
            }
        )
        if self.app == "lab":
            # a user who answered JupyterLab's "official Jupyter news?" prompt already (no news
            # toast over the notifications under test, or in the screenshots in docs/img)
            news = self.tmp / "config" / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
            news.mkdir(parents=True, exist_ok=True)
            (news / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
        if self.app == "lab":  # the prebuilt extension, as the wheel installs it (share/jupyter/labextensions)
            ext = self.tmp / "data" / "labextensions"
            ext.mkdir(parents=True, exist_ok=True)
            (ext / "gpuspawner-gpu-view").symlink_to(BUILT)
        self._out = open(self.log, "ab")
        self.proc = subprocess.Popen(
            [str(VENV_BIN / "jupyter"), self.app, f"--config={config}"],
            cwd=self.tmp,
            env=env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 120
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter {self.app} exited {self.proc.returncode}:\n{self.log_text()[-4000:]}")
            try:
                if self.fetch("api/status").status == 200:
                    return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"jupyter {self.app} did not come up:\n{self.log_text()[-4000:]}")
            time.sleep(0.3)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if getattr(self, "_out", None):
            self._out.close()

    def fetch(self, path: str, method: str = "GET", body: Any = None, token: str | None = "", raw: bytes | None = None) -> Response:
        """``path`` under the base URL; ``token`` None sends none ("" sends this server's)."""
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        request = urllib.request.Request(self.base + path, data=data, method=method)
        if token is not None:
            request.add_header("Authorization", f"token {token or self.token}")
        opener = urllib.request.build_opener(NoRedirect)
        try:
            with opener.open(request, timeout=60) as r:
                return Response(r.status, r.read(), r.headers)
        except urllib.error.HTTPError as e:
            return Response(e.code, e.read(), e.headers)


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None
