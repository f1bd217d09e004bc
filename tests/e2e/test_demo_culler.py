"""The GPU culler as the demo runs it (a managed hub service) with the real GPUSpawner:
an idle MIG server is stopped and its pod goes; a server whose GPU is busy stays,
whatever the hub's last activity says. GPU telemetry is the demo's simulated
dcgm-exporter behind Prometheus' query API (there is no GPU here)."""

from __future__ import annotations

import json
import secrets
import time
import urllib.request

import pytest

from gpuspawner.demo import NAMESPACE, running_demo
from tests.e2e.demo_stack import free_port

pytestmark = pytest.mark.cluster
CULLER_ARGS = ("--cull-every=5 --timeout=900 --kernel-timeout=300 --kind-timeout=mig=15 --kind-timeout=full=15 "
               "--kind-timeout=shared=900 --gpu-window=40 --gpu-min-samples=3")


def call(demo, token, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"{demo.api_url}{path}", data=data, method=method,
                                 headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else None


def test_idle_mig_server_is_culled_and_a_busy_gpu_is_not():
    token = secrets.token_hex(16)
    env = {"GPUSPAWNER_DEMO_API_TOKEN": token, "GPUSPAWNER_DEMO_CULLER_ARGS": CULLER_ARGS}
    with running_demo(port=free_port(), hub_port=free_port(), quiet=True, extra_env=env) as demo:
        call(demo, token, "POST", "/users/student1/server", {"offering": "mig-nvidia-a100-sxm4-40gb-1g-5gb"})
        call(demo, token, "POST", "/users/researcher1/server", {"offering": "gpu-nvidia-h100-80gb-hbm3", "count": 1})
        def pods():
            return {p["metadata"]["labels"]["hub.jupyter.org/username"]: p for p in demo.cluster.client().request(
            "GET", f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=component=singleuser-server")["items"]}
        deadline = time.monotonic() + 120
        while not all(call(demo, token, "GET", f"/users/{u}")["servers"].get("", {}).get("ready") for u in ("student1", "researcher1")):
            assert time.monotonic() < deadline, (demo.state / "jupyterhub.log").read_text()[-3000:]
            time.sleep(1)
        demo.telemetry.active.add(pods()["researcher1"]["metadata"]["name"])  # researcher1's GPU is computing

        deadline = time.monotonic() + 180
        while call(demo, token, "GET", "/users/student1")["servers"]:
            assert time.monotonic() < deadline, "the idle MIG server was not culled:\n" + (demo.state / "jupyterhub.log").read_text()[-4000:]
            time.sleep(2)
        while "student1" in pods():
            assert time.monotonic() < deadline, "the culled server's pod is still there"
            time.sleep(1)
        # The busy one outlived the same timeout by far, and is still running.
        assert call(demo, token, "GET", "/users/researcher1")["servers"][""]["ready"]
        assert "researcher1" in pods()
        log = (demo.state / "jupyterhub.log").read_text()
        assert "gpu-culler" in log
