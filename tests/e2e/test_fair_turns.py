"""Reclaim when someone waits (issue #28), on the demo stack: the real GPUSpawner's queue
(the A100's single MIG 3g.20gb, ``admission: queue``), its ``gpuspawner_spawns_waiting``
scraped by the real Prometheus, and the GPU culler as the hub's managed service.

researcher1's server holds the slice and goes idle. Nobody waits: it is kept, far past
``reclaim_for_waiting_after``. researcher2 asks for the same slice and waits in the queue:
the culler stops researcher1's idle server with the reason (who waited, for what, how long
it was idle), researcher2's progress said when that would happen, and researcher2's spawn
starts on the slice it freed."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from datetime import UTC, datetime

import pytest

from tests.e2e.demo_stack import demo_with_token

pytestmark = pytest.mark.cluster
SLICE = "mig-nvidia-a100-sxm4-40gb-3g-20gb"
BOUND = 30
CULLER_ARGS = (
    f"--cull-every=3 --timeout=3600 --kind-timeout=mig=3600 --reclaim-for-waiting-after={BOUND} "
    "--gpu-window=20 --gpu-min-samples=3 --GpuCuller.warn_before_seconds=10"
)
EXTRA_CONFIG = """
c = get_config()
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


def read_progress(demo, user, out):
    """The spawn's progress messages, as the spawn-pending page reads them (until ready)."""
    req = urllib.request.Request(f"{demo.api_url}/users/{user}/server/progress", headers={"Authorization": f"token {demo.token}"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if line.startswith("data:"):
                event = json.loads(line[5:])
                out.append(event.get("message", ""))
                if event.get("ready") or event.get("failed"):
                    return


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
        # nobody waits: idle twice the bound (the GPU view has its samples by then), it is kept
        time.sleep(2 * BOUND)
        assert (server(demo, "researcher1") or {}).get("ready"), "reclaimed although nobody waited"
        actions = call(demo, "GET", "/api/actions", prefix=f"{demo.url}/services/gpu-culler")["actions"]
        assert not actions

        # researcher1 was just active (so the reclaim lies ahead, and the waiting spawn is told
        # when); then researcher2 waits for the same slice and researcher1's server makes room
        now = datetime.now(UTC).isoformat()
        call(demo, "POST", "/users/researcher1/activity", {"last_activity": now, "servers": {"": {"last_activity": now}}})
        call(demo, "POST", "/users/researcher2/server", {"offering": SLICE})
        progress: list[str] = []
        reader = threading.Thread(target=read_progress, args=(demo, "researcher2", progress), daemon=True)
        reader.start()
        until("researcher1's idle server was not reclaimed for the waiting spawn", lambda: server(demo, "researcher1") is None, demo)
        until("researcher2's spawn did not start on the freed slice", lambda: (server(demo, "researcher2") or {}).get("ready"), demo)

        reader.join(timeout=30)
        told = [m for m in progress if "will be reclaimed for you" in m]
        assert told and told[0].startswith("An idle ") and told[0].endswith("."), progress

        actions = call(demo, "GET", "/api/actions", prefix=f"{demo.url}/services/gpu-culler")["actions"]
        assert [(a["user"], a["action"], a["reason"]) for a in actions] == [("researcher1", "server_stopped", "waiting")]
        why = actions[0]["why"]
        assert why.startswith("1 person was waiting for ") and "the MIG slice was idle for" in why, why
        assert f"(limit {BOUND // 60})" in why or "less than a minute" in why, why
        assert "spawns waiting: 1 for" in log.read_text()
        # researcher1's notebook was warned first, with who waits (its notice, put by the culler)
        warned = [line for line in log.read_text().splitlines() if "warned researcher1: server stop in" in line]
        assert warned and "unless there is activity: 1 person is waiting for " in warned[0], warned
