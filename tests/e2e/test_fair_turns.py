"""Reclaim when someone waits (issue #28), on the demo stack: the real GPUSpawner's queue
(the A100's single MIG 3g.20gb, ``admission: queue``), its ``gpuspawner_spawns_waiting``
scraped by the real Prometheus, and the GPU culler as the hub's managed service.

researcher1's server holds the slice and goes idle. Nobody waits: it is kept, far past
``reclaim_for_waiting_after``. researcher2 asks for the same slice and waits in the queue:
the culler stops researcher1's idle server with the reason (who waited, for what, how long
it was idle), and researcher2's spawn starts on the slice it freed."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from tests.e2e.demo_stack import demo_with_token

pytestmark = pytest.mark.cluster
SLICE = "mig-nvidia-a100-sxm4-40gb-3g-20gb"
BOUND = 20
CULLER_ARGS = (
    f"--cull-every=3 --timeout=3600 --kind-timeout=mig=3600 --reclaim-for-waiting-after={BOUND} "
    "--gpu-window=20 --gpu-min-samples=3 --GpuCuller.warn_before_seconds=10"
)
EXTRA_CONFIG = """
c = get_config()
c.Authenticator.allowed_users = {"student1", "student2", "researcher1", "researcher2", "admin"}
c.JupyterHub.load_groups = {
    "students": {"users": ["student1", "student2"]},
    "researchers": {"users": ["researcher1", "researcher2"]},
    "gpu-users": {"users": ["student1", "student2", "researcher1", "researcher2"]},
}
c.JupyterHub.load_roles.append({"name": "e2e-actions", "scopes": ["access:services"], "services": ["e2e-admin"]})
"""


def call(demo, method, path, body=None, prefix=None):
    data = json.dumps(body).encode() if body is not None else None
    url = f"{prefix or demo.api_url}{path}"
    headers = {"Authorization": f"token {demo.token}", "Content-Type": "application/json"}
    with urllib.request.urlopen(urllib.request.Request(url, data=data, method=method, headers=headers), timeout=60) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else None


def server(demo, user):
    return call(demo, "GET", f"/users/{user}")["servers"].get("")


def until(what, check, demo, timeout=180):
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            lines = (demo.state / "jupyterhub.log").read_text().splitlines()
            about = [line for line in lines if "researcher" in line and "GET /hub/api/users" not in line]
            pytest.fail(f"{what}; the hub's lines about the researchers:\n" + "\n".join(about[-60:]))
        time.sleep(1)


def test_an_idle_server_is_reclaimed_only_when_someone_waits_for_its_offering(tmp_path_factory):
    with demo_with_token(tmp_path_factory, EXTRA_CONFIG, env={"GPUSPAWNER_DEMO_CULLER_ARGS": CULLER_ARGS}) as demo:
        # the other team's job that holds the slice in the demo ends
        demo.cluster.client().request("DELETE", "/api/v1/namespaces/research-team/pods/embeddings?gracePeriodSeconds=0")
        call(demo, "POST", "/users/researcher1/server", {"offering": SLICE})
        until("researcher1's server never became ready", lambda: (server(demo, "researcher1") or {}).get("ready"), demo)
        log = demo.state / "jupyterhub.log"
        # nobody waits: idle three times the bound (the GPU view has its samples by then), it is kept
        time.sleep(3 * BOUND)
        assert (server(demo, "researcher1") or {}).get("ready"), "reclaimed although nobody waited"
        actions = call(demo, "GET", "/api/actions", prefix=f"{demo.url}/services/gpu-culler")["actions"]
        assert not actions

        # researcher2 waits for the same slice: researcher1's idle server makes room
        call(demo, "POST", "/users/researcher2/server", {"offering": SLICE})
        until("researcher1's idle server was not reclaimed for the waiting spawn", lambda: server(demo, "researcher1") is None, demo)
        until("researcher2's spawn did not start on the freed slice", lambda: (server(demo, "researcher2") or {}).get("ready"), demo)

        actions = call(demo, "GET", "/api/actions", prefix=f"{demo.url}/services/gpu-culler")["actions"]
        assert [(a["user"], a["action"], a["reason"]) for a in actions] == [("researcher1", "server_stopped", "waiting")]
        why = actions[0]["why"]
        assert why.startswith("1 person was waiting for ") and "the MIG slice was idle for" in why, why
        assert f"(limit {BOUND // 60})" in why or "less than a minute" in why, why
        assert "spawns waiting: 1 for" in log.read_text()
