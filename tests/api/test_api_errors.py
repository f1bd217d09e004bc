"""The REST API answers like the form: each class of bad spawn request of issue #11 gets its
status (400 malformed, 403 not offered, 409 nothing free, 429 over quota) with the message
the spawn page shows, one log line and no traceback; unknown keys are never stored; and
whatever pod exists afterwards is one the user's policy allows.

A real JupyterHub behind a real configurable-http-proxy, GPUSpawner on the devcluster
(tests/api/gpuhub.py); the cases are tests/api/payloads.py.
"""

from __future__ import annotations

import json

import pytest

from tests.api.gpuhub import FPGA, H100, MIG1, RESEARCHERS, STUDENTS, form_error, pod_problems
from tests.api.payloads import CASES, NOT_OFFERED, Case
from tests.conftest import ARTIFACTS

pytestmark = pytest.mark.cluster
TABLE: list[tuple[str, str, int, str]] = []


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_each_class_of_request_gets_its_answer(gpuhub, case: Case):
    log_before = len(gpuhub.log_text())
    try:
        answer = case.run(gpuhub)
        TABLE.append((case.id, case.what, answer.status, answer.message))
        assert answer.status in case.statuses(), f"{answer}\n{gpuhub.log_tail()}"
        assert case.message in answer.message, answer
        assert "Traceback" not in answer.body and "<" not in answer.message
        for pod in gpuhub.pods():
            user = pod["metadata"]["labels"]["hub.jupyter.org/username"]
            assert not pod_problems(pod, user), (user, pod_problems(pod, user))
    finally:
        for server in case.servers:
            gpuhub.stop_server(case.user, server)
    log = gpuhub.log_text()[log_before:]
    assert "Traceback" not in log, log
    if answer.status >= 400 and case.id not in ("body-list", "body-not-json", "body-options-list"):
        # One line says why (JupyterHub's), besides the access log's line for the request.
        lines = [line for line in log.splitlines() if case.message in line]
        assert len(lines) == 1, log


def test_the_answers_are_written_down():
    """The table of answers (test-artifacts/api-errors.md), for the record."""
    assert len(TABLE) == len(CASES)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    rows = [f"| {i} | {what} | {status} | {message[:200].replace('|', '/')} |" for i, (_id, what, status, message) in enumerate(TABLE, 1)]
    (ARTIFACTS / "api-errors.md").write_text("| # | request | status | message |\n|---|---|---|---|\n" + "\n".join(rows) + "\n")


def test_the_api_and_the_form_say_the_same_words(gpuhub):
    api = gpuhub.api("POST", gpuhub.server_path(STUDENTS[1]), {"offering": H100})
    form = gpuhub.form_post(STUDENTS[1], {"offering": H100})
    assert api.status == form.status == 403
    assert api.message == form.message and NOT_OFFERED in api.message
    # The form is shown again, with the user's choices, under the message.
    assert 'name="offering"' in form.body and f'value="{MIG1}"' in form.body


def test_unknown_keys_never_reach_the_database_or_the_users_list(gpuhub):
    user = STUDENTS[2]
    created = gpuhub.api(
        "PUT", gpuhub.server_path(user, "notes"), {"user_options": {"offering": "cpu", "junk": "j" * 5000, "nested": {"a": [1, 2]}}}
    )
    assert created.status == 201
    patched = gpuhub.api("PATCH", gpuhub.server_path(user, "notes"), {"user_options": {"offering": MIG1, "more-junk": 1}})
    assert patched.status == 200, patched
    listed = gpuhub.api("GET", "/users?include_stopped_servers=1")
    servers = {u["name"]: u["servers"] for u in json.loads(listed.body)}
    # (JupyterHub keeps serving the PUT's options after a PATCH until the server starts: its own staleness.)
    assert servers[user]["notes"]["user_options"] in ({"offering": "cpu"}, {"offering": MIG1})
    assert "junk" not in listed.body and "nested" not in listed.body
    log = gpuhub.log_text()
    assert "user_options keys dropped, not stored: 'junk', 'nested'" in log
    assert "user_options keys dropped, not stored: 'more-junk'" in log
    gpuhub.api("DELETE", gpuhub.server_path(user, "notes"), {"remove": True})


def test_an_oversized_value_is_refused_and_never_stored_nor_logged(gpuhub):
    """A 1 MB ``offering`` (far over useroptions.MAX_VALUE_CHARS): a start answers 400 and a
    PUT or PATCH of a named server 400 too, the hub's database keeps what it held, and
    JupyterHub's own PATCH log line does not echo the body."""
    user, big = STUDENTS[5], "x" * 1_000_000
    start = gpuhub.api("POST", gpuhub.server_path(user), {"offering": big})
    assert start.status == 400, start.status
    made = gpuhub.api("PUT", gpuhub.server_path(user, "big"), {"user_options": {"offering": big}})
    assert made.status == 400 and "is too long" in made.message, made.status
    made = gpuhub.api("PUT", gpuhub.server_path(user, "small"), {"user_options": {"offering": "cpu"}})
    assert made.status == 201, made
    patched = gpuhub.api("PATCH", gpuhub.server_path(user, "small"), {"user_options": {"offering": big}})
    assert patched.status == 400 and "'offering' is too long" in patched.message, patched.status
    model = gpuhub.user_model(user)
    assert big[:1000] not in json.dumps(model)
    assert model["servers"]["small"]["user_options"] == {"offering": "cpu"}
    log = gpuhub.log_text()
    assert big[:1000] not in log
    assert f"Setting user_options on {user}/small (the request body is not logged)" in log
    gpuhub.api("DELETE", gpuhub.server_path(user, "small"), {"remove": True})
    gpuhub.api("DELETE", gpuhub.server_path(user, "big"), {"remove": True})


def test_a_start_refused_for_its_options_leaves_the_options_stored_before(gpuhub):
    """Refused options are never what JupyterHub stores as the server's last options: a start
    refused as not offered (403) or malformed (400) leaves the named server's options as the PUT
    stored them."""
    user = STUDENTS[8]
    made = gpuhub.api("PUT", gpuhub.server_path(user, "lab"), {"user_options": {"offering": "cpu"}})
    assert made.status == 201, made
    try:
        for options, status in (({"offering": H100}, 403), ({"offering": "CPU", "count": 1}, 400)):
            refused = gpuhub.api("POST", gpuhub.server_path(user, "lab"), options)
            assert refused.status == status, refused
            assert gpuhub.user_model(user)["servers"]["lab"]["user_options"] == {"offering": "cpu"}
    finally:
        gpuhub.api("DELETE", gpuhub.server_path(user, "lab"), {"remove": True})


def test_a_refusal_after_the_answer_reaches_the_progress_stream(gpuhub):
    """The real scheduler refuses the FPGA pod. If that comes after the hub's 202, the spawn-pending
    page's event stream carries the same message; before it, the answer does (409)."""
    user = RESEARCHERS[3]
    answer = gpuhub.api("POST", gpuhub.server_path(user), {"offering": FPGA})
    try:
        if answer.status == 202:
            message = gpuhub.spawn_result(user)["message"]
            assert message.startswith("Spawn failed: ")
        else:
            assert answer.status == 409, answer
            message = answer.message
        assert "FPGA node cannot run now. The scheduler says: 0/" in message
        assert "didn't match Pod's node affinity/selector" in message
    finally:
        gpuhub.stop_server(user)
    assert "Traceback" not in gpuhub.log_text()


def test_a_start_by_query_arguments_is_refused_like_the_form(gpuhub):
    """JupyterHub also starts a server on a GET of the spawn page with query arguments."""
    user = STUDENTS[4]
    session = gpuhub.form_session(user)
    resp = session.get(f"{gpuhub.url}/hub/spawn/{user}", params={"offering": H100}, timeout=60, allow_redirects=False)
    page = resp.content.decode()
    assert resp.status_code == 403
    assert NOT_OFFERED in form_error(page) and 'name="offering"' in page
    assert not gpuhub.pods(user)
    assert "Traceback" not in gpuhub.log_text()
