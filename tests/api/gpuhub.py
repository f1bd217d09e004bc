"""A real JupyterHub (subprocess, real configurable-http-proxy, sqlite, dummy authenticator)
with GPUSpawner on the test devcluster, for the REST API and form tests of tests/api.

Its policy, stated here once and read by the tests as the oracle (not computed by
gpuspawner's own code):

* students: No GPU, the T4 time-slice and the A100 MIG 1g.5gb slice, one at a time;
* researchers: those, the MIG 3g.20gb slice, and 1, 2 or 4 whole H100s;
* every other discovered offering belongs to a group nobody is in;
* ``closed-cpu`` is open only on a day that is not today (a closed window);
* ``fpga`` (researchers) asks for a node label no node has: the real scheduler refuses its pod;
* a user may hold 2 GPU units at once (``user_quota``);
* KubeSpawner profiles ``python`` (default) and ``pytorch`` (option ``image``).
"""

from __future__ import annotations

import html
import json
import os
import re
import secrets
import textwrap
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urljoin

import requests

from gpuspawner.devcluster.hub import HubProcess

PASSWORD = "gpu"
STUDENTS = [f"student{i}" for i in range(1, 201)]
RESEARCHERS = [f"researcher{i}" for i in range(1, 201)]
OTHER_DAY = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")[(datetime.now(UTC).weekday() + 3) % 7]


@dataclass(frozen=True)
class Allowed:
    """What a pod of this offering must ask for: its extended resource per unit, the counts allowed."""

    resource: str | None
    counts: tuple[int, ...] = (1,)


CPU = "cpu"
T4 = "shared-tesla-t4-time-slicing-4x"
MIG1 = "mig-nvidia-a100-sxm4-40gb-1g-5gb"
MIG3 = "mig-nvidia-a100-sxm4-40gb-3g-20gb"
H100 = "gpu-nvidia-h100-80gb-hbm3"
CLOSED = "closed-cpu"
FPGA = "fpga"
STUDENT_OFFERINGS = {
    CPU: Allowed(None),
    T4: Allowed("nvidia.com/gpu.shared"),
    MIG1: Allowed("nvidia.com/mig-1g.5gb"),
    CLOSED: Allowed(None),
}
RESEARCHER_OFFERINGS = {
    **STUDENT_OFFERINGS,
    MIG3: Allowed("nvidia.com/mig-3g.20gb"),
    H100: Allowed("nvidia.com/gpu", (1, 2, 4)),
    FPGA: Allowed(None),
}
#: Discovered offerings nobody may take (they exist: a request for one is "not offered", like an unknown slug).
NOBODYS = [
    "mig-nvidia-a100-sxm4-40gb-2g-10gb",
    "shared-nvidia-l4-shared-mps-4x",
    "shared-tesla-t4-shared-time-slicing-4x",
    "mig-gke-nvidia-tesla-a100-1g-5gb",
    "gpu-nvidia-tesla-a100",
    "vgpu-vgpu-type-v100-8g-8gb",
    "vgpu-nvidia-a10-24q",
]
PROFILES = [
    {"display_name": "Python", "slug": "python", "default": True},
    {
        "display_name": "PyTorch",
        "slug": "pytorch",
        "profile_options": {
            "image": {
                "display_name": "Image",
                "choices": {
                    "cuda12": {
                        "display_name": "CUDA 12",
                        "kubespawner_override": {"image": "quay.io/jupyter/pytorch-notebook:cuda12-2025-11-17"},
                    },
                    "cpu": {"display_name": "CPU only", "kubespawner_override": {"image": "quay.io/jupyter/pytorch-notebook:2025-11-17"}},
                },
            },
        },
    },
]


def policy(user: str) -> dict[str, Allowed]:
    return RESEARCHER_OFFERINGS if user.startswith("researcher") else STUDENT_OFFERINGS


@dataclass
class Answer:
    status: int
    message: str  # the REST API's JSON message, or the form page's error ("" if none)
    body: str


class GPUHub(HubProcess):
    """One JupyterHub process (gpuspawner.devcluster.hub) with GPUSpawner; ``namespace`` holds the users' pods."""

    def __init__(
        self, tmp: Path, devcluster, namespace: str, slow_spawn_timeout: float = 3.0, http_timeout: float = 20.0, extra_config: str = ""
    ):
        super().__init__(tmp)
        self.devcluster = devcluster
        self.kube = devcluster.client()
        self.namespace = namespace
        self.slow_spawn_timeout = slow_spawn_timeout  # a start that goes on answers 202 after this
        self.http_timeout = http_timeout  # ... and, as no notebook runs in the pod, fails and is cleaned up after this
        self.extra_config = extra_config
        self.token = secrets.token_hex(16)
        self.api_session = requests.Session()
        self.api_session.headers["Authorization"] = f"token {self.token}"
        # One connection per request: the proxy (Node's http server) closes a connection idle for
        # 5 s, and a pooled connection reused at that moment is reset, a failure of the client's
        # reuse and not the hub's answer (a loaded machine makes the race likely).
        self.api_session.headers["Connection"] = "close"
        self.api_session.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=256))  # many threads share it
        self._forms: dict[str, requests.Session] = {}

    # ------------------------------------------------------------------ the process

    def config_text(self) -> str:
        overrides = {
            T4: {"groups": ["students", "researchers"]},
            MIG1: {"groups": ["students", "researchers"]},
            MIG3: {"groups": ["researchers"]},
            H100: {"groups": ["researchers"], "counts": [1, 2, 4]},
            **{slug: {"groups": ["nobody"]} for slug in NOBODYS},
        }
        closed = {
            "slug": CLOSED,
            "kind": "custom",
            "display_name": f"CPU (open on {OTHER_DAY} only)",
            "command_prefix": ["env"],
            "windows": [f"{OTHER_DAY} 00:00-24:00"],
        }
        fpga = {
            "slug": FPGA,
            "kind": "custom",
            "display_name": "FPGA node",
            "command_prefix": ["env"],
            "node_selector": {"example.org/fpga": "true"},
            "groups": ["researchers"],
        }
        return (
            self.base_config()
            + textwrap.dedent(f"""
            c.JupyterHub.cleanup_servers = True
            c.DummyAuthenticator.password = {PASSWORD!r}
            c.JupyterHub.named_server_limit_per_user = 0
            c.JupyterHub.tornado_settings = {{"slow_spawn_timeout": {self.slow_spawn_timeout!r}}}
            c.JupyterHub.load_groups = {{"students": {{"users": {STUDENTS!r}}}, "researchers": {{"users": {RESEARCHERS!r}}}}}
            c.JupyterHub.services = [{{"name": "api-tests", "api_token": {self.token!r}}}]
            c.JupyterHub.load_roles = [{{"name": "api-tests", "scopes": ["admin:users", "admin:servers"], "services": ["api-tests"]}}]
            c.JupyterHub.spawner_class = "gpu"
            c.KubeSpawner.namespace = {self.namespace!r}
            c.KubeSpawner.image = "quay.io/jupyter/base-notebook:latest"
            c.KubeSpawner.start_timeout = 120
            c.KubeSpawner.http_timeout = {self.http_timeout!r}  # no notebook runs in these pods: the hub gives up
            c.KubeSpawner.events_enabled = False
            c.KubeSpawner.profile_list = {PROFILES!r}
            c.GPUSpawner.site_timezone = "UTC"
            c.GPUSpawner.default_offering = "cpu"
            c.GPUSpawner.user_quota = {{"total": 2}}
            c.GPUSpawner.inventory_ready_timeout = 30.0
            c.GPUSpawner.offering_overrides = {overrides!r}
            c.GPUSpawner.offerings = [{closed!r}, {fpga!r}]
            from gpuspawner import check_config
            check_config(c)
            """)
            + textwrap.dedent(self.extra_config)
        )

    def start(self, timeout: float = 120) -> GPUHub:
        self.launch(self.config_text(), {**os.environ, **self.devcluster.env(), "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + timeout
        while True:
            self.check_running()
            try:
                if self.api_session.get(f"{self.url}/hub/api/", timeout=5).ok:
                    return self
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the hub did not answer within {timeout:.0f}s:\n{self.log_tail()}")
            time.sleep(0.3)

    def stop(self) -> None:
        self.end(timeout=30)  # the hub stops its proxy too; a proxy left behind is ended
        for session in [self.api_session, *self._forms.values()]:
            session.close()

    # ------------------------------------------------------------------ the REST API

    def api(self, method: str, path: str, body: Any = None, data: bytes | None = None, timeout: float = 120) -> Answer:
        """One REST API request (``body`` as JSON, or ``data`` as it is)."""
        kwargs: dict[str, Any] = {"timeout": timeout}
        if data is not None:
            kwargs["data"] = data
        elif body is not None:
            kwargs["json"] = body
        resp = self.api_session.request(method, f"{self.url}/hub/api{path}", **kwargs)
        message = ""
        if resp.status_code >= 400:
            try:
                message = resp.json().get("message", "")
            except ValueError:
                message = resp.text[:500]
        return Answer(resp.status_code, message, resp.text)

    @staticmethod
    def server_path(user: str, server: str = "") -> str:
        return f"/users/{quote(user)}/servers/{quote(server)}" if server else f"/users/{quote(user)}/server"

    def user_model(self, user: str) -> dict:
        return self.api_session.get(f"{self.url}/hub/api/users/{quote(user)}?include_stopped_servers=1", timeout=30).json()

    def stop_server(self, user: str, server: str = "", timeout: float = 120, interval: float = 0.3) -> None:
        """Stop (and for a named server, remove) it; wait until the hub and the cluster agree it is gone.

        No notebook runs in these pods, so a start that went on stays pending until the hub gives
        up after ``http_timeout`` and stops it itself. It is not interrupted: JupyterHub's DELETE of
        a pending start can race with it (``RuntimeError: ... pending spawn``, a 500 in the log).
        """
        path = f"{self.url}/hub/api{self.server_path(user, server)}"
        deadline = time.monotonic() + timeout
        while True:
            model = (self.user_model(user).get("servers") or {}).get(server)
            if model is not None and model["ready"]:
                self.api_session.delete(path, timeout=120)  # something answered at the pod's IP: a started server
            elif (model is None or (model["stopped"] and not model["pending"])) and not self.pods(user, server):
                if model is not None and server:
                    self.api_session.delete(path, json={"remove": True}, timeout=120)
                    continue
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{user}/{server} did not stop: {model}\n{self.log_tail()}")
            time.sleep(interval)

    def spawn_result(self, user: str, server: str = "") -> dict:
        """The last event of the server's progress stream (what the spawn-pending page shows):
        ``{"failed": True, "message": "Spawn failed: ..."}`` or ``{"ready": True, ...}``."""
        url = f"{self.url}/hub/api{self.server_path(user, server)}/progress"
        with self.api_session.get(url, stream=True, timeout=180) as resp:
            assert resp.status_code == 200, resp.text[:300]
            for line in resp.iter_lines(decode_unicode=True):
                if line and line.startswith("data:"):
                    event = json.loads(line[5:])
                    if event.get("failed") or event.get("ready"):
                        return event
        raise AssertionError(f"the progress stream of {user}/{server} ended without a result")

    def pods(self, user: str | None = None, server: str | None = None) -> list[dict]:
        selector = "component=singleuser-server"
        if user:
            selector += f",hub.jupyter.org/username={user}"
        pods = self.kube.request("GET", f"/api/v1/namespaces/{self.namespace}/pods?labelSelector={selector}")["items"]
        if server is not None:
            pods = [p for p in pods if (p["metadata"].get("annotations") or {}).get("hub.jupyter.org/servername", "") == server]
        return [p for p in pods if "deletionTimestamp" not in p["metadata"]]

    # ------------------------------------------------------------------ the spawn form

    def form_session(self, user: str) -> requests.Session:
        """A browser-like session logged in as ``user`` (cookies, XSRF token)."""
        session = self._forms.get(user)
        if session is None:
            session = requests.Session()
            session.headers["Connection"] = "close"  # as api_session's: no reuse of a connection the proxy closes
            session.get(f"{self.url}/hub/login", timeout=30)
            resp = session.post(
                f"{self.url}/hub/login",
                timeout=30,
                allow_redirects=False,
                data={"username": user, "password": PASSWORD, "_xsrf": session.cookies.get("_xsrf", "")},
            )
            assert resp.status_code == 302, f"login as {user}: {resp.status_code} {resp.text[:300]}"
            self._forms[user] = session
        return session

    def spawn_page(self, user: str, server: str = "", timeout: float = 60) -> requests.Response:
        path = f"/hub/spawn/{quote(user)}" + (f"/{quote(server)}" if server else "")
        return self.form_session(user).get(f"{self.url}{path}", timeout=timeout)

    def form_post(self, user: str, fields: list[tuple[str, str]] | dict, server: str = "") -> Answer:
        """Submit the spawn form (multipart, as spawn.html sends it). A start is a redirect (3xx)."""
        session = self.form_session(user)
        path = f"/hub/spawn/{quote(user)}" + (f"/{quote(server)}" if server else "")
        page = session.get(f"{self.url}{path}", timeout=60).content.decode()
        action = re.search(r'<form[^>]*id="spawn_form"[^>]*action="([^"]*)"', page) or re.search(r'action="([^"]*_xsrf=[^"]*)"', page)
        assert action, f"no spawn form for {user}: {page[:500]}"
        items = list(fields.items()) if isinstance(fields, dict) else list(fields)
        files = [(name, (None, value)) for name, value in items] or None
        target = urljoin(f"{self.url}{path}", html.unescape(action.group(1)))  # with the page's own _xsrf, as a browser posts
        resp = session.post(target, files=files, data=None if files else {"_": ""}, allow_redirects=False, timeout=120)
        page = resp.content.decode("utf-8", "replace")
        return Answer(resp.status_code, form_error(page), page)


_ERROR = re.compile(r'<p class="spawn-error-msg alert alert-danger">\s*Error:\s*(.*?)\s*</p>', re.S)


def form_error(page: str) -> str:
    """The error JupyterHub's spawn.html shows above the form ("" if none), unescaped."""
    found = _ERROR.search(page)
    return html.unescape(found.group(1)) if found else ""


def pod_problems(pod: dict, user: str) -> list[str]:
    """How ``pod`` breaks ``user``'s policy (the module docstring), in words; [] if it does not."""
    labels = pod["metadata"].get("labels") or {}
    slug = labels.get("gpuspawner.io/offering")
    allowed = policy(user)
    if slug not in allowed:
        return [f"offering {slug!r} is not {user}'s"]
    rule = allowed[slug]
    limits = (pod["spec"]["containers"][0].get("resources") or {}).get("limits") or {}
    requests_ = (pod["spec"]["containers"][0].get("resources") or {}).get("requests") or {}
    extended = {k: v for k, v in limits.items() if "/" in k}
    problems = []
    if rule.resource is None:
        if extended:
            problems.append(f"{slug} has no GPU, but the pod asks for {extended}")
    else:
        if set(extended) != {rule.resource}:
            problems.append(f"{slug} asks for {rule.resource}, the pod for {extended}")
        else:
            count = int(extended[rule.resource])
            if count not in rule.counts:
                problems.append(f"{slug} may be taken {rule.counts} at a time, the pod asks for {count}")
            if requests_.get(rule.resource) != extended[rule.resource]:
                problems.append(f"requests {requests_.get(rule.resource)} != limits {extended[rule.resource]}")
    return problems
