"""A hub restarted in the middle of a start (issue 39): the server is not left shut down without
a reason. JupyterHub does not resume a start; at its start-up it polls the server, waits
``http_timeout`` for it to answer and stops it when it does not. The user's home page then says
why, as it does for a start whose pod was already gone. And a start refused on its way (the
scheduler's verdict) keeps its words on the home page, saved at once: a hub stopped just after
the verdict still shows them.
"""

from __future__ import annotations

import pytest
import requests

from tests.api.gpuhub import CPU, FPGA, GPUHub
from tests.conftest import wait_for

pytestmark = pytest.mark.cluster
USER = "student17"
CONFIG = """
from gpuspawner.hub.culleractions import hub_templates_dir
c.JupyterHub.template_paths = [hub_templates_dir()]
c.JupyterHub.cleanup_servers = False  # as zero-to-jupyterhub sets it
"""


def home_notice(hub: GPUHub, user: str) -> str:
    """The user's home page once it shows a notice ("" before: the state is saved just after a stop)."""
    page = hub.form_session(user).get(f"{hub.url}/hub/home", timeout=60)
    assert page.status_code == 200, page.text[:300]
    return page.text if "gpuspawner-stops" in page.text else ""


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

        text = wait_for(lambda: home_notice(hub, USER), "the home page's notice", timeout=60)
        words = "did not answer the hub when the hub restarted"
        assert words in text and "so the hub stopped it after waiting 5 s. Please start it again." in text, hub.log_tail()
    finally:
        if hub.proc is not None and hub.proc.poll() is None:
            try:
                hub.stop_server(USER)
            except (AssertionError, requests.RequestException):
                pass
        hub.stop()


def test_a_start_refused_on_its_way_keeps_the_schedulers_words_past_a_hub_restart(devcluster, namespace, tmp_path):
    user = "researcher17"  # (the FPGA offering is the researchers')
    hub = GPUHub(tmp_path / "hub", devcluster, namespace, slow_spawn_timeout=0.1, extra_config=CONFIG)
    try:
        hub.start()
        answer = hub.api("POST", hub.server_path(user), {"offering": FPGA})
        if answer.status == 202:  # the verdict came after the answer: the progress stream carries it
            assert hub.spawn_result(user).get("failed"), hub.log_tail()
        else:
            assert answer.status == 409, answer
        hub.stop()  # the hub goes away at once after the verdict
        hub.start()
        text = wait_for(lambda: home_notice(hub, user), "the home page's notice", timeout=60)
        assert "did not start (at " in text and "FPGA node cannot run now. The scheduler says: 0/" in text, hub.log_tail()
    finally:
        hub.stop()
