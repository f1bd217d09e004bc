"""Honest in an outage: with the devcluster's kube-apiserver stopped under a running hub, the
spawn page renders at once and says the cluster cannot be reached and how old its counts
are; REST API and form spawns get 503 with that reason; once the API server is back the
page is fresh again and spawns work. (A real hub, proxy and devcluster: tests/api/gpuhub.py.)

No timing is asserted: a page load has a generous deadline for rendering at all, and
every assertion is about what the page and the answers say.
"""

from __future__ import annotations

import re

import pytest

from tests.api.gpuhub import MIG1, pod_problems
from tests.api.payloads import OUTAGE_CASE
from tests.conftest import wait_for

pytestmark = pytest.mark.cluster
USER = "student7"
NOTICE = re.compile(r'<div class="alert alert-warning gs-notice" role="status" data-gs-notice(?P<hidden> hidden)?>(?P<text>[^<]*)</div>')
AGE = re.compile(r"The GPU cluster cannot be reached: the free counts are as of (\d\d:\d\d:\d\d) UTC \((\d+) s ago\)")


def notice(hub) -> tuple[bool, str, str]:
    """(shown?, its text, the MIG 1g.5gb slice's availability) on the spawn page now."""
    page = hub.spawn_page(USER, timeout=30)  # a deadline for rendering at all, not a measurement
    assert page.status_code == 200, page.text[:500]
    found = NOTICE.search(page.text)
    assert found, "the spawn page has no counts notice element"
    avail = re.search(rf'data-slug="{MIG1}".*?data-gs-avail[^>]*>([^<]*)<', page.text, re.S)
    return not found.group("hidden"), found.group("text"), avail.group(1) if avail else ""


def test_the_page_and_spawns_say_the_cluster_cannot_be_reached_and_recover(devcluster, gpuhub):
    log_start = len(gpuhub.log_text())  # count only the lines this test's requests cause
    shown, _, before = notice(gpuhub)
    assert not shown and re.fullmatch(r"\d+ of 2 free", before), before

    devcluster.stop_components(["kube-apiserver"])
    try:
        wait_for(lambda: notice(gpuhub)[0], "the page to say the cluster cannot be reached", timeout=60)
        shown, text, avail = notice(gpuhub)
        age = AGE.search(text)
        assert age, text
        assert "No server can start until the cluster is back" in text
        assert avail == before  # the last counts stay, with their age above them

        api = gpuhub.api("POST", gpuhub.server_path(USER), {"offering": MIG1})
        status, message = OUTAGE_CASE[2], OUTAGE_CASE[3]
        assert api.status == status and api.message.startswith(message), api
        assert f"(since {age.group(1)} UTC," in api.message and "Please try again in a few minutes." in api.message
        retry = gpuhub.api_session.post(f"{gpuhub.url}/hub/api{gpuhub.server_path(USER)}", json={"offering": "cpu"}, timeout=60)
        assert retry.status_code == 503 and retry.headers.get("Retry-After") == "30"

        form = gpuhub.form_post(USER, {"offering": MIG1})
        assert form.status == 503 and form.message.startswith(f"{message} (since {age.group(1)} UTC,"), form
        # The page keeps counting the age.
        wait_for(lambda: int(AGE.search(notice(gpuhub)[1]).group(2)) > int(age.group(2)), "the age to grow", timeout=30)
    finally:
        devcluster.start_components(["kube-apiserver"])

    wait_for(lambda: not notice(gpuhub)[0], "the page to be fresh again", timeout=120)
    assert notice(gpuhub)[2] == before
    started = gpuhub.api("POST", gpuhub.server_path(USER), {"offering": MIG1})
    assert started.status in (201, 202), started
    try:
        wait_for(lambda: gpuhub.pods(USER), "the pod", timeout=60)
        assert not pod_problems(gpuhub.pods(USER)[0], USER)
    finally:
        gpuhub.stop_server(USER)
    log = gpuhub.log_text()[log_start:]
    refusals = [line for line in log.splitlines() if "The GPU cluster cannot be reached" in line]
    assert len(refusals) == 3, refusals  # one line per refused spawn (two API starts, one form)
