"""A hub restarted in the middle of a start (issue 39): the server is not left shut down without
a reason. JupyterHub does not resume a start; at its start-up it polls the server, waits
``http_timeout`` for it to answer and stops it when it does not. The user's home page then says
why, as it does for a start whose pod was already gone.
"""

from __future__ import annotations

import pytest
import requests

from tests.api.gpuhub import CPU, GPUHub
from tests.conftest import wait_for

pytestmark = pytest.mark.cluster
USER = "student17"
CONFIG = """
from gpuspawner.hub.culleractions import hub_templates_dir
c.JupyterHub.template_paths = [hub_templates_dir()]
c.JupyterHub.cleanup_servers = False  # as zero-to-jupyterhub sets it
"""


def test_a_start_cut_by_a_hub_restart_after_its_pod_exists_leaves_the_user_the_reason(devcluster, namespace, tmp_path):
    # No notebook answers in these pods: the start is still waiting for the server when the hub stops.
    config = CONFIG
    hub = GPUHub(tmp_path / "hub", devcluster, namespace, http_timeout=300, extra_config=config)
    try:
        hub.start()
        answer = hub.api("POST", hub.server_path(USER), {"offering": CPU})
        assert answer.status == 202, answer  # still starting after slow_spawn_timeout
        wait_for(lambda: hub.pods(USER), "the server's pod to exist", timeout=120)

        hub.stop()  # SIGTERM in the middle of the start; zero-to-jupyterhub's cleanup_servers = False
        hub.http_timeout = 5  # the restarted hub gives the server 5 s to answer, then stops it
        hub.start()

        def stopped() -> bool:
            model = (hub.user_model(USER).get("servers") or {}).get("")
            gone = model is None or (model["stopped"] and not model["pending"])
            return gone and not hub.pods(USER)

        wait_for(stopped, "the restarted hub to stop the server that never answered", timeout=180)

        def home() -> str:
            page = hub.form_session(USER).get(f"{hub.url}/hub/home", timeout=60)
            assert page.status_code == 200, page.text[:300]
            return page.text if "gpuspawner-stops" in page.text else ""  # (the state is saved just after the stop)

        text = wait_for(home, "the home page's notice", timeout=60)
        words = "did not answer the hub when the hub restarted"
        assert words in text and "so the hub stopped it after waiting 5 s. Please start it again." in text, hub.log_tail()
    finally:
        if hub.proc is not None and hub.proc.poll() is None:
            try:
                hub.stop_server(USER)
            except (AssertionError, requests.RequestException):
                pass
        hub.stop()
