"""A running server's GPU record (``user_options["gpuspawner"]``, what the culler and other services
read from the hub's REST API) is served from the start on, and again after a hub restart, although
the start no longer writes the hub's database row of the options itself: the record lives in the
server's saved state, which JupyterHub commits right after the start, and comes back from there.
Before, each start committed the row once more (on sqlite an fsync on the hub's event loop)."""

from __future__ import annotations

import pytest

from gpuspawner.devcluster.podrunner import PodRunner
from tests.api.gpuhub import MIG1, GPUHub
from tests.conftest import wait_for

pytestmark = pytest.mark.cluster
USER = "student23"
SERVED = "c.KubeSpawner.cmd = ['jupyterhub-singleuser']  # the pod runner starts it on the pod's IP\n"
KEEP = "c.JupyterHub.cleanup_servers = False  # as zero-to-jupyterhub sets it: a restarted hub keeps the server\n"


def server(hub: GPUHub) -> dict:
    return (hub.user_model(USER).get("servers") or {}).get("", {})


def test_the_record_is_served_after_the_start_and_after_a_hub_restart(devcluster, kube, namespace, tmp_path):
    runner = PodRunner(kube, root=tmp_path / "pods")
    hub = GPUHub(tmp_path / "hub", devcluster, namespace, http_timeout=120, slow_spawn_timeout=30.0, extra_config=SERVED + KEEP)
    runner.start()
    try:
        hub.start()
        answer = hub.api("POST", hub.server_path(USER), {"offering": MIG1})
        assert answer.status in (201, 202), answer
        wait_for(lambda: server(hub).get("ready"), "the server to be ready", timeout=180)
        record = server(hub)["user_options"]["gpuspawner"]
        assert record["offering"] == MIG1 and record["pod"] in {p["metadata"]["name"] for p in hub.pods(USER)}

        hub.stop()
        hub.start()
        wait_for(lambda: server(hub).get("ready"), "the restarted hub to find the server running", timeout=180)
        assert server(hub)["user_options"]["gpuspawner"] == record, hub.log_tail()
    finally:
        if hub.proc is not None and hub.proc.poll() is None:
            hub.stop_server(USER)
        hub.stop()
        runner.stop()
