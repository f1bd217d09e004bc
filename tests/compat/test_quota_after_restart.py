"""Quotas after a hub restart (issue 25, item 6): the quota ledger is rebuilt from each running
server's saved record, so a restarted hub refuses what the hub before it would have refused.

The hub is a stock zero-to-jupyterhub one (its namespaced Role only), so it cannot count bound
pods cluster-wide: before the fix every quota reset to nothing at a restart. Its servers are
really served (gpuspawner.devcluster.podrunner), so they are running when the hub restarts
(``cleanup_servers = False``, as zero-to-jupyterhub sets it).
"""

from __future__ import annotations

import pytest

from gpuspawner.devcluster.podrunner import PodRunner
from tests.api.gpuhub import GPUHub
from tests.compat.test_without_cluster_rbac import HALF_V100, HUB_CONFIG, kubeconfig_for, z2jh_hub_account
from tests.conftest import wait_for

pytestmark = pytest.mark.cluster
USER = "researcher9"  # a user may hold 2 GPU units at once (the API tests' hub: user_quota total 2)


def ready(hub: GPUHub, server: str) -> bool:
    return bool((hub.user_model(USER).get("servers") or {}).get(server, {}).get("ready"))


def test_a_restarted_hub_still_counts_what_its_running_servers_hold(devcluster, kube, namespace, tmp_path):
    token = z2jh_hub_account(kube, namespace)
    kubeconfig = kubeconfig_for(devcluster, token, tmp_path / "hub.kubeconfig")
    config = HUB_CONFIG.format(kubeconfig=str(kubeconfig), offering=HALF_V100) + "\nc.JupyterHub.cleanup_servers = False\n"
    hub = GPUHub(tmp_path / "hub", devcluster, namespace, http_timeout=120, extra_config=config)
    runner = PodRunner(kube, root=tmp_path / "pods")
    runner.start()
    try:
        hub.start()
        for server in ("", "two"):  # two servers of one unit each: the quota is full
            answer = hub.api("POST", hub.server_path(USER, server), {"offering": "half-v100"})
            assert answer.status in (201, 202), answer
            wait_for(lambda server=server: ready(hub, server), f"server {server!r} to be ready", timeout=180)
        full = hub.api("POST", hub.server_path(USER, "three"), {"offering": "half-v100"})
        assert full.status == 429, full  # the hub that started them refuses a third

        hub.stop()
        hub.start()
        assert ready(hub, "") and ready(hub, "two")  # still running after the restart
        again = hub.api("POST", hub.server_path(USER, "three"), {"offering": "half-v100"})
        assert again.status == 429 and "already hold 2" in again.message, again
        assert "quotas count 2 running server(s) from their saved records" in hub.log_text()

        hub.stop_server(USER, "two")  # a stop gives its units back
        freed = hub.api("POST", hub.server_path(USER, "three"), {"offering": "half-v100"})
        assert freed.status in (201, 202), freed
    finally:
        for server in ("three", "two", ""):
            if hub.proc is not None and hub.proc.poll() is None:
                hub.stop_server(USER, server)
        hub.stop()
        runner.stop()
