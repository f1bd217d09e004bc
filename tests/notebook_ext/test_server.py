"""The extension in a real Jupyter Server (a subprocess, token auth, the real pynvml with
NVIDIA's library replaced by the stand-in): the REST API of docs/user-gpu-view.md."""

from __future__ import annotations

import json

import pytest

from .jupyter_proc import JupyterProcess


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc = JupyterProcess(tmp_path_factory.mktemp("jupyter")).start()
    yield proc
    proc.stop()


@pytest.fixture
def fresh_view(server):
    """Each test starts from an empty culler view (a PUT replaces the last one)."""
    assert server.fetch("api/gpuspawner/culler", "PUT", {}).status == 204
    yield


def test_status_tells_the_offering_the_slice_and_that_the_culler_has_not_reported(server, fresh_view):
    r = server.fetch("api/gpuspawner/status")
    assert r.status == 200 and r.headers["Content-Type"].startswith("application/json")
    status = r.json()
    assert status["offering"] == {
        "slug": "a100-mig-1g.10gb",
        "display_name": "MIG 1g.10gb",
        "kind": "mig",
        "count": 1,
        "words": "10 GB GPU memory · 1/7 of the GPU's compute · hardware isolated (own memory and compute)",
    }
    assert status["devices"] == [
        {
            "index": 0,
            "name": "NVIDIA A100-SXM4-80GB MIG 1g.10gb",
            "uuid": "MIG-7d1e0000-aaaa-bbbb-cccc-000000000002",
            "memory_used_bytes": int(3.1 * 2**30),
            "memory_total_bytes": 10 * 2**30,
            "utilization_percent": None,
        }
    ]
    assert status["culler"]["action"] is None and status["notices"] == []
    assert status["summary"] == "MIG 1g.10gb · 3.1 / 10 GB · active"


@pytest.mark.parametrize(
    "method, path",
    [("GET", "api/gpuspawner/status"), ("PUT", "api/gpuspawner/culler"), ("POST", "api/gpuspawner/keep"), ("GET", "gpuspawner/")],
)
@pytest.mark.parametrize("token", [None, "not-this-servers-token"])
def test_without_this_servers_token_nothing_is_read_or_posted(server, fresh_view, method, path, token):
    body = {"action": "server", "warning": True} if method != "GET" else None
    r = server.fetch(path, method, body, token=token)
    assert r.status in (302, 403), (r.status, r.body[:200])
    assert b"a100-mig" not in r.body
    assert server.fetch("api/gpuspawner/status").json()["culler"]["warning"] is False  # the refused PUT changed nothing


def test_the_api_refuses_without_a_token_with_403_and_the_page_sends_to_login(server):
    assert server.fetch("api/gpuspawner/status", token=None).status == 403
    page = server.fetch("gpuspawner/", token=None)
    assert page.status == 302 and "/login" in page.headers["Location"]


def test_the_culler_puts_its_view_and_the_notebook_shows_it(server, fresh_view):
    view = {
        "idle_since": "2026-05-04T13:36:00Z",
        "action": "kernels",
        "act_at": "2999-01-01T00:00:00Z",
        "reason": "the kernels were idle for 24 minutes (limit 30)",
        "warning": True,
        "limit_seconds": 1800,
        "observed": {"gpu_utilization_percent": 0, "gpu_memory_used_bytes": 3328599654},
    }
    assert server.fetch("api/gpuspawner/culler", "PUT", view).status == 204
    status = server.fetch("api/gpuspawner/status").json()
    shown = {k: status["culler"][k] for k in view}
    assert shown == view
    (warning,) = status["notices"]
    assert warning["kind"] == "warning" and "your idle kernels will be shut down" in warning["text"]
    assert status["summary"].startswith("MIG 1g.10gb · 3.1 / 10 GB · idle ") and ", kernels reclaimed in " in status["summary"]


@pytest.mark.parametrize(
    "raw, status, says",
    [
        (b"not json", 400, "the body is not JSON"),
        (json.dumps({"action": "everything"}).encode(), 400, "action: \"everything\" is not 'kernels', 'server' or null"),
        (json.dumps({"idle_since": "13:00"}).encode(), 400, "idle_since"),
        (json.dumps({"warning": True, "extra": 1}).encode(), 400, "unknown field(s) 'extra'"),
        (b'{"reason": "' + b"x" * 70000 + b'"}', 413, "at most 65536"),
    ],
)
def test_bad_views_get_a_clear_json_error_and_change_nothing(server, fresh_view, raw, status, says):
    r = server.fetch("api/gpuspawner/culler", "PUT", raw=raw)
    assert r.status == status
    assert says in r.json()["message"]
    assert b"Traceback" not in r.body
    assert server.fetch("api/gpuspawner/status").json()["culler"]["action"] is None


def test_reading_the_status_and_the_cullers_put_are_not_activity(server, fresh_view):
    before = server.fetch("api/status").json()["last_activity"]
    for _ in range(3):
        server.fetch("api/gpuspawner/status")
        server.fetch("api/gpuspawner/culler", "PUT", {"action": "server", "act_at": "2999-01-01T00:00:00Z"})
        server.fetch("gpuspawner/")
    assert server.fetch("api/status").json()["last_activity"] == before


def test_keep_is_activity_for_the_server_and_every_kernel_and_drops_the_warning(server, fresh_view):
    kernel = server.fetch("api/kernels", "POST", {"name": "python3"}).json()
    try:
        server.fetch("api/gpuspawner/culler", "PUT", {"action": "kernels", "act_at": "2999-01-01T00:00:00Z", "warning": True})
        kernel_before = server.fetch(f"api/kernels/{kernel['id']}?no_track_activity=1").json()["last_activity"]
        server_before = server.fetch("api/status").json()["last_activity"]
        r = server.fetch("api/gpuspawner/keep", "POST", raw=b"")
        assert r.status == 200
        assert r.json()["notices"] == [] and r.json()["culler"]["warning"] is False
        kernel_after = server.fetch(f"api/kernels/{kernel['id']}?no_track_activity=1").json()["last_activity"]
        server_after = server.fetch("api/status").json()["last_activity"]
        assert kernel_after > kernel_before and server_after > server_before  # ISO 8601 in UTC: text order is time order
    finally:
        server.fetch(f"api/kernels/{kernel['id']}", "DELETE")


def test_a_kernel_the_culler_reclaims_is_shown_as_reclaimed_for_idleness(server, fresh_view):
    kernel = server.fetch("api/kernels", "POST", {"name": "python3"}).json()
    view = {"action": "kernels", "reclaimed": [kernel["id"]], "reason": "the kernel was idle for 30 minutes (limit 30)"}
    assert server.fetch("api/gpuspawner/culler", "PUT", view).status == 204
    assert server.fetch(f"api/kernels/{kernel['id']}", "DELETE").status == 204  # what the culler does next
    notices = server.fetch("api/gpuspawner/status").json()["notices"]
    reclaimed = [n for n in notices if n["kernel_ids"] == [kernel["id"]]]
    assert len(reclaimed) == 1 and reclaimed[0]["kind"] == "reclaimed"
    assert "was reclaimed for idleness" in reclaimed[0]["text"] and "did not crash" in reclaimed[0]["text"]
    assert "idle for 30 minutes (limit 30)" in reclaimed[0]["text"]


def test_the_plain_page_shows_the_same_data_escaped(server, fresh_view):
    server.fetch(
        "api/gpuspawner/culler",
        "PUT",
        {"action": "server", "act_at": "2999-01-01T00:00:00Z", "warning": True, "reason": "<script>alert(1)</script>"},
    )
    r = server.fetch("gpuspawner/")
    assert r.status == 200 and r.headers["Content-Type"].startswith("text/html")
    page = r.body.decode()
    assert "MIG 1g.10gb · 3.1 / 10 GB" in page and "NVIDIA A100-SXM4-80GB MIG 1g.10gb" in page
    assert "this server will be stopped" in page and "id='keep'" in page
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_a_stop_that_only_gpu_use_prevents_offers_no_keep(server, fresh_view):
    """issue #25: a gpu_idle_limit stop (or a GPU lease) cannot be kept by activity: the
    culler says so (``keepable`` false) and neither the API nor the plain page offers Keep."""
    reason = "GPU telemetry has shown the whole GPU idle for 3 hours 55 minutes (limit 4 hours), whatever the server reported; only GPU use counts"
    put = {"action": "server", "act_at": "2999-01-01T00:00:00Z", "warning": True, "keepable": False, "reason": reason}
    assert server.fetch("api/gpuspawner/culler", "PUT", put).status == 204
    status = server.fetch("api/gpuspawner/status").json()
    assert status["culler"]["keepable"] is False
    [warning] = [n for n in status["notices"] if n["kind"] == "warning"]
    assert warning["keep"] is False and "only GPU use counts" in warning["text"]
    assert "Click Keep" not in warning["text"] and "Keep cannot prevent this" in warning["text"]
    page = server.fetch("gpuspawner/").body.decode()
    assert "this server will be stopped" in page and "id='keep'" not in page
    # a bad value is a clear 400
    r = server.fetch("api/gpuspawner/culler", "PUT", {**put, "keepable": "no"})
    assert r.status == 400 and "keepable" in r.json()["message"]


def test_the_plain_pages_keep_form_keeps_and_goes_back_to_the_page(server, fresh_view):
    server.fetch("api/gpuspawner/culler", "PUT", {"action": "server", "act_at": "2999-01-01T00:00:00Z", "warning": True})
    r = server.fetch("gpuspawner/keep", "POST", raw=b"")
    assert r.status == 302 and r.headers["Location"] == "/user/ada/gpuspawner/"
    assert [n for n in server.fetch("api/gpuspawner/status").json()["notices"] if n["kind"] == "warning"] == []


def test_without_nvml_the_figures_are_unavailable_and_nothing_else_changes(tmp_path):
    proc = JupyterProcess(tmp_path, gpus=None, env={}).start()
    try:
        status = proc.fetch("api/gpuspawner/status").json()
    finally:
        proc.stop()
    assert status["devices"] == {
        "unavailable": "NVIDIA's management library (libnvidia-ml.so.1) is not in this container: no GPU driver here"
    }
    assert status["offering"] is None and status["summary"] == "No GPU offering"
