"""The culler's view as the notebook checks and keeps it, and the words shown for it."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from gpuspawner.notebook_ext.offering import offering_from_env
from gpuspawner.notebook_ext.status import status_body
from gpuspawner.notebook_ext.summary import HEADLINE_MAX, culler_line, duration, gb, memory_line, notices, status_line
from gpuspawner.notebook_ext.view import MAX_BODY_BYTES, NoticeBoard, ViewError, parse_culler_view

NOW = datetime(2026, 5, 4, 14, 0, 0, tzinfo=UTC)
GIB = 2**30
MIG = {"slug": "a100-mig-1g.10gb", "display_name": "MIG 1g.10gb", "kind": "mig", "count": 1, "words": "10 GB GPU memory"}
SLICE = [
    {
        "index": 0,
        "name": "A100 MIG 1g.10gb",
        "uuid": "MIG-1",
        "memory_used_bytes": int(3.1 * GIB),
        "memory_total_bytes": 10 * GIB,
        "utilization_percent": None,
    }
]


def body(**fields) -> bytes:
    return json.dumps(fields).encode()


def test_the_issue_status_line():
    view = parse_culler_view(
        body(idle_since="2026-05-04T13:36:00Z", action="kernels", act_at="2026-05-04T14:06:00+00:00", reason="idle", limit_seconds=1800),
        NOW,
    )
    assert status_line(MIG, SLICE, view, NOW) == "MIG 1g.10gb · 3.1 / 10 GB · idle 24 min, kernels reclaimed in 6 min"


def test_a_full_view_round_trips_to_the_status_body():
    view = parse_culler_view(
        body(
            idle_since="2026-05-04T13:30:00Z",
            action="server",
            act_at="2026-05-04T14:10:00Z",
            reason="the whole GPU was idle for 30 minutes (limit 40)",
            warning=True,
            limit_seconds=2400,
            observed={"gpu_utilization": 0},
        ),
        NOW,
    )
    assert view.to_json() == {
        "idle_since": "2026-05-04T13:30:00Z",
        "action": "server",
        "act_at": "2026-05-04T14:10:00Z",
        "reason": "the whole GPU was idle for 30 minutes (limit 40)",
        "warning": True,
        "keepable": True,
        "limit_seconds": 2400,
        "observed": {"gpu_utilization": 0},
        "reclaimed": [],
        "cause": "",
        "lease": None,
        "posted_at": "2026-05-04T14:00:00Z",
    }


@pytest.mark.parametrize(
    "raw, status, says",
    [
        (b"{nope", 400, "not JSON"),
        (b"[]", 400, "must be a JSON object, not list"),
        (b"\xff\xfe", 400, "not JSON"),
        (body(idle_since="yesterday"), 400, 'idle_since: "yesterday" is not an ISO 8601 time'),
        (body(idle_since="2026-05-04T13:30:00"), 400, "has no timezone"),
        (body(act_at=1714831200), 400, "act_at: 1714831200 is not an ISO 8601"),
        (body(action="everything"), 400, "action: \"everything\" is not 'kernels', 'server' or null"),
        (body(warning="yes"), 400, 'warning: "yes" is not true or false'),
        (body(limit_seconds=-1), 400, "limit_seconds: -1 is not a whole number"),
        (body(limit_seconds=True), 400, "limit_seconds: true is not a whole number"),
        (body(reason=["x"]), 400, 'reason: ["x"] is not a string'),
        (body(observed=[1]), 400, "observed: [1] is not a JSON object"),
        (body(reclaimed="abc"), 400, 'reclaimed: "abc" is not a list of kernel ids'),
        (body(reclaimed=[""]), 400, "is not a list of kernel ids"),
        (body(sudo=True), 400, "unknown field(s) 'sudo'; the fields are idle_since, action"),
        (b'{"reason": "' + b"x" * MAX_BODY_BYTES + b'"}', 413, "at most 65536 are accepted"),
    ],
)
def test_bad_views_are_refused_naming_what_is_wrong(raw, status, says):
    with pytest.raises(ViewError) as refused:
        parse_culler_view(raw, NOW)
    assert refused.value.status == status
    assert says in str(refused.value)


def test_a_long_bad_value_is_cut_short_in_the_message():
    with pytest.raises(ViewError) as refused:
        parse_culler_view(body(action="x" * 500), NOW)
    assert len(str(refused.value)) < 120


def test_the_board_keeps_the_latest_view_and_each_reclaimed_kernel_once():
    board = NoticeBoard()
    board.post(parse_culler_view(body(action="kernels", reclaimed=["k1", "k2"], reason="idle 30 min"), NOW))
    board.post(parse_culler_view(body(action="kernels", reclaimed=["k2", "k3"], reason="idle 31 min"), NOW + timedelta(minutes=1)))
    board.post(parse_culler_view(body(), NOW + timedelta(minutes=2)))
    assert board.view is not None and board.view.action is None
    assert [(r.kernel_id, r.reason) for r in board.reclaimed] == [("k1", "idle 30 min"), ("k2", "idle 30 min"), ("k3", "idle 31 min")]
    assert board.reclaimed_ids() == {"k1", "k2", "k3"}


def test_the_board_forgets_the_oldest_reclaimed_kernels_past_its_limit():
    board = NoticeBoard()
    for i in range(60):
        board.post(parse_culler_view(body(reclaimed=[f"k{i}"]), NOW))
    assert len(board.reclaimed) == 50 and board.reclaimed[0].kernel_id == "k10"


def test_keep_drops_the_warning_until_the_next_view():
    board = NoticeBoard()
    board.keep()  # nothing to drop: no error
    board.post(
        parse_culler_view(body(action="kernels", act_at="2026-05-04T14:05:00Z", warning=True, idle_since="2026-05-04T13:35:00Z"), NOW)
    )
    assert [n["kind"] for n in notices(board.view, board.reclaimed, NOW)] == ["warning"]
    board.keep()
    assert notices(board.view, board.reclaimed, NOW) == []
    assert board.view is not None and culler_line(board.view, NOW) == "active"  # until the culler's next view
    assert board.view.reason == "" and board.view.to_json()["action"] is None  # no stale "why" in the panel


def test_the_warning_and_reclaimed_notices_in_words():
    board = NoticeBoard()
    board.post(
        parse_culler_view(body(action="kernels", reclaimed=["0123456789abcdef"], reason="the kernel was idle for 30 min (limit 30)"), NOW)
    )
    board.post(
        parse_culler_view(
            body(action="server", act_at="2026-05-04T14:10:00Z", warning=True, reason="the whole GPU was idle for 50 minutes (limit 60)"),
            NOW + timedelta(minutes=1),
        )
    )
    shown = notices(board.view, board.reclaimed, NOW + timedelta(minutes=1))
    assert shown == [
        {
            "kind": "warning",
            "text": "To free the GPU, this server will be stopped in 9 min: the whole GPU was idle for 50 minutes (limit 60). "
            "Click Keep or run a cell to keep them.",
            "headline": "To free the GPU, this server will be stopped in 9 min. Click Keep or run a cell to keep them.",
            "at": "2026-05-04T14:01:00Z",
            "kernel_ids": [],
            "keep": True,
        },
        {
            "kind": "reclaimed",
            "text": "Kernel 01234567 was reclaimed for idleness at 14:00 UTC: the kernel was idle for 30 min (limit 30). "
            "It did not crash; start a new one to go on.",
            "headline": "Kernel 01234567 was reclaimed for idleness at 14:00 UTC. It did not crash; start a new one to go on.",
            "at": "2026-05-04T14:00:00Z",
            "kernel_ids": ["0123456789abcdef"],
        },
    ]


@pytest.mark.parametrize("action", ["kernels", "server"])
@pytest.mark.parametrize("left", [timedelta(0), timedelta(seconds=30), timedelta(hours=23, minutes=59)])
def test_headlines_fit_a_jupyterlab_notification_whatever_the_reason(action, left):
    long_reason = "an idle kernel holds 1536 MiB of the shared GPU's memory while idle for 2 hours 59 minutes (limit 2 hours 30 minutes)"
    board = NoticeBoard()
    board.post(parse_culler_view(body(action="kernels", reclaimed=["f" * 36], reason=long_reason), NOW))
    act_at = (NOW + left).isoformat().replace("+00:00", "Z")
    board.post(parse_culler_view(body(action=action, act_at=act_at, warning=True, reason=long_reason), NOW))
    shown = notices(board.view, board.reclaimed, NOW)
    assert [n["kind"] for n in shown] == ["warning", "reclaimed"]
    for n in shown:
        assert len(n["text"]) > HEADLINE_MAX  # the case JupyterLab would cut
        assert len(n["headline"]) <= HEADLINE_MAX and long_reason not in n["headline"], n["headline"]
        assert n["headline"].endswith(("keep them.", "go on."))


@pytest.mark.parametrize(
    "seconds, words", [(0, "<1 min"), (59, "<1 min"), (60, "1 min"), (1440, "24 min"), (3600, "1 h"), (7500, "2 h 5 min")]
)
def test_durations(seconds, words):
    assert duration(seconds) == words


@pytest.mark.parametrize("n, words", [(int(3.1 * GIB), "3.1"), (10 * GIB, "10"), (80 * GIB, "80"), (int(9.75 * GIB), "9.8"), (0, "0.0")])
def test_gigabytes(n, words):
    assert gb(n) == words


def test_memory_line_without_nvml_or_devices():
    assert memory_line({"unavailable": "no driver"}) == "GPU figures unavailable"
    assert memory_line([]) == "no GPU visible"


def test_culler_line_cases():
    assert culler_line(None, NOW) == ""
    active = parse_culler_view(body(idle_since=None), NOW)
    assert culler_line(active, NOW) == "active"
    due = parse_culler_view(body(idle_since="2026-05-04T13:00:00Z", action="server", act_at="2026-05-04T13:59:00Z"), NOW)
    assert culler_line(due, NOW) == "idle 1 h, server stopped within a minute"


def test_the_status_line_keeps_a_reclaimed_kernels_trace_for_an_hour():
    board = NoticeBoard()
    # the notice the culler puts as it acts: done, not "kernels reclaimed within a minute"
    acting = body(
        idle_since="2026-05-04T13:30:00Z", action="kernels", act_at="2026-05-04T14:00:00Z", reclaimed=["0123456789abcdef"], reason="idle"
    )
    board.post(parse_culler_view(acting, NOW))
    assert status_line(MIG, SLICE, board.view, NOW, board.reclaimed) == (
        "MIG 1g.10gb · 3.1 / 10 GB · idle 30 min · kernel reclaimed for idleness at 14:00 UTC"
    )
    board.post(parse_culler_view(body(idle_since="2026-05-04T13:58:00Z"), NOW))
    line = status_line(MIG, SLICE, board.view, NOW + timedelta(minutes=5), board.reclaimed)
    assert line == "MIG 1g.10gb · 3.1 / 10 GB · idle 7 min · kernel reclaimed for idleness at 14:00 UTC"
    board.post(parse_culler_view(body(action="kernels", reclaimed=["fedcba9876543210"], reason="idle"), NOW + timedelta(minutes=30)))
    later = NOW + timedelta(minutes=31)
    assert status_line(MIG, SLICE, board.view, later, board.reclaimed).endswith(
        " · 2 kernels reclaimed for idleness, the last at 14:30 UTC"
    )
    # a coming action's countdown wins; after an hour the trace is gone
    due = parse_culler_view(body(idle_since="2026-05-04T14:00:00Z", action="kernels", act_at="2026-05-04T14:40:00Z", warning=True), later)
    assert "reclaimed for idleness" not in status_line(MIG, SLICE, due, later, board.reclaimed)
    assert "reclaimed for idleness" not in status_line(MIG, SLICE, board.view, NOW + timedelta(minutes=91), board.reclaimed)


def test_a_server_without_an_offering_or_nvml_says_so_briefly():
    assert status_line(None, {"unavailable": "x"}, None, NOW) == "No GPU offering"


def test_offering_from_the_env_gpuspawner_sets():
    env = {
        "GPUSPAWNER_OFFERING": "a100-mig-1g.10gb",
        "GPUSPAWNER_KIND": "mig",
        "GPUSPAWNER_GPU_COUNT": "1",
        "GPUSPAWNER_DISPLAY_NAME": "MIG 1g.10gb",
        "GPUSPAWNER_OFFERING_WORDS": "10 GB GPU memory · 1/7 of the GPU's compute",
    }
    assert offering_from_env(env) == {
        "slug": "a100-mig-1g.10gb",
        "display_name": "MIG 1g.10gb",
        "kind": "mig",
        "count": 1,
        "words": "10 GB GPU memory · 1/7 of the GPU's compute",
    }
    assert offering_from_env({}) is None
    assert offering_from_env({"GPUSPAWNER_OFFERING": "t4", "GPUSPAWNER_GPU_COUNT": "two"}) == {
        "slug": "t4",
        "display_name": "t4",
        "kind": "",
        "count": None,
        "words": "",
    }


def test_status_body_shape():
    board = NoticeBoard()
    out = status_body(MIG, SLICE, board, NOW)
    assert set(out) == {"offering", "devices", "culler", "lease", "notices", "summary", "budget", "cost_budget", "now"}
    assert out["culler"] is None and out["notices"] == [] and out["summary"] == "MIG 1g.10gb · 3.1 / 10 GB"


def test_the_budget_running_total_from_the_figures_the_spawner_wrote():
    from gpuspawner.notebook_ext.offering import budget_from_env

    env = {
        "GPUSPAWNER_BUDGET_HOURS": "20",
        "GPUSPAWNER_BUDGET_WINDOW": "week",
        "GPUSPAWNER_BUDGET_USED": "4.5000",
        "GPUSPAWNER_BUDGET_COST": "2",
        "GPUSPAWNER_BUDGET_AS_OF": (NOW - timedelta(minutes=90)).isoformat(),
        "GPUSPAWNER_BUDGET_SOURCE": "prometheus",
    }
    budget = budget_from_env(env, NOW)
    assert budget is not None and budget["used"] == 7.5 and budget["text"] == "GPU budget 7.5 / 20 h this week"
    status = status_body(MIG, SLICE, NoticeBoard(), NOW, budget)
    assert status["summary"].endswith(" · GPU budget 7.5 / 20 h this week")
    assert status["budget"]["source"] == "prometheus"
    # no budget, or figures that do not parse: nothing shown
    assert budget_from_env({}, NOW) is None
    assert budget_from_env({**env, "GPUSPAWNER_BUDGET_USED": "lots"}, NOW) is None
    assert status_body(MIG, SLICE, NoticeBoard(), NOW)["budget"] is None


def test_the_cost_budget_running_total_beside_the_gpu_hour_one():
    from gpuspawner.notebook_ext.offering import budget_from_env, cost_budget_from_env

    cost = {
        "GPUSPAWNER_COST_BUDGET": "150",
        "GPUSPAWNER_COST_BUDGET_WINDOW": "week",
        "GPUSPAWNER_COST_BUDGET_SPENT": "12.0000",
        "GPUSPAWNER_COST_BUDGET_PRICE": "5",
        "GPUSPAWNER_COST_BUDGET_AS_OF": (NOW - timedelta(minutes=30)).isoformat(),
        "GPUSPAWNER_COST_BUDGET_SOURCE": "hub-record",
    }
    found = cost_budget_from_env(cost, NOW)
    assert found is not None and found["spent"] == 14.5 and found["text"] == "Cost budget 14.50 / 150.00 this week"
    assert budget_from_env(cost, NOW) is None  # a cost budget only: no GPU-hour line
    alone = status_body(MIG, SLICE, NoticeBoard(), NOW, cost_budget=found)
    assert alone["summary"] == "MIG 1g.10gb · 3.1 / 10 GB · Cost budget 14.50 / 150.00 this week"
    assert alone["budget"] is None and alone["cost_budget"]["source"] == "hub-record"
    hours = {
        "GPUSPAWNER_BUDGET_HOURS": "20",
        "GPUSPAWNER_BUDGET_WINDOW": "day",
        "GPUSPAWNER_BUDGET_USED": "1",
        "GPUSPAWNER_BUDGET_COST": "1",
        "GPUSPAWNER_BUDGET_AS_OF": NOW.isoformat(),
    }
    both = status_body(MIG, SLICE, NoticeBoard(), NOW, budget_from_env({**cost, **hours}, NOW), cost_budget=found)
    assert both["summary"].endswith(" · GPU budget 1.0 / 20 h today · Cost budget 14.50 / 150.00 this week")
    assert cost_budget_from_env({**cost, "GPUSPAWNER_COST_BUDGET_SPENT": "some"}, NOW) is None


# -- GPU leases (issue #28) ---------------------------------------------------------
LEASE = {
    "ends_at": "2026-05-04T18:00:00+00:00",
    "extensions_left": 2,
    "can_extend": True,
    "words": "Your server may hold the whole GPU until 18:00 UTC.",
}
EXTEND = "/hub/gpuspawner/leases"


def test_a_lease_warning_offers_extend_on_the_hub_never_keep():
    view = parse_culler_view(
        body(
            action="server",
            act_at="2026-05-04T14:05:00Z",
            warning=True,
            keepable=False,
            cause="gpu_lease",
            reason="the server's GPU lease ends: the whole GPU may be held for 4 hours at most, whatever it does",
            lease=LEASE,
        ),
        NOW,
    )
    [warning] = notices(view, [], NOW, EXTEND)
    assert warning["keep"] is False and warning["extend_url"] == EXTEND
    assert warning["headline"] == "To free the GPU, this server will be stopped in 5 min. Save your work, or extend the lease on the hub."
    out = status_body(MIG, SLICE, _board(view), NOW, extend_url=EXTEND)
    assert out["lease"] == {**LEASE, "extend_url": EXTEND}
    # no extension left (or nobody may extend now): no link, only the plain warning
    spent = parse_culler_view(
        body(
            action="server",
            act_at="2026-05-04T14:05:00Z",
            warning=True,
            keepable=False,
            cause="gpu_lease",
            lease={**LEASE, "extensions_left": 0, "can_extend": False},
        ),
        NOW,
    )
    [plain] = notices(spent, [], NOW, EXTEND)
    assert "extend_url" not in plain and plain["headline"].endswith("Save your work: Keep cannot prevent this.")


def test_kernels_shut_down_at_the_end_of_a_lease_are_not_called_idle():
    board = NoticeBoard()
    board.post(
        parse_culler_view(body(action="kernels", act_at="2026-05-04T14:00:00Z", cause="gpu_lease", reclaimed=["k1"], reason="lease"), NOW)
    )
    [done] = notices(board.view, board.reclaimed, NOW)
    assert (
        done["headline"] == "Kernel k1 was shut down at the end of its GPU lease at 14:00 UTC. It did not crash; start a new one to go on."
    )
    coming = parse_culler_view(body(action="kernels", act_at="2026-05-04T14:05:00Z", warning=True, keepable=False, cause="gpu_lease"), NOW)
    assert notices(coming, [], NOW)[0]["headline"].startswith("To free the GPU, your kernels will be shut down in 5 min.")


def test_keep_does_not_hide_what_activity_cannot_prevent():
    board = NoticeBoard()
    board.post(parse_culler_view(body(action="server", act_at="2026-05-04T14:05:00Z", warning=True, keepable=False, cause="budget"), NOW))
    board.keep()
    assert board.view is not None and board.view.warning and board.view.cause == "budget"


@pytest.mark.parametrize(
    "lease",
    [{"ends_at": "x"}, {**LEASE, "extensions_left": True}, {**LEASE, "words": 3}, [LEASE], {**LEASE, "extra": 1}],
)
def test_a_malformed_lease_is_refused_by_name(lease):
    with pytest.raises(ViewError) as refused:
        parse_culler_view(body(lease=lease), NOW)
    assert refused.value.status == 400 and str(refused.value).startswith("lease: ")


def _board(view):
    board = NoticeBoard()
    board.post(view)
    return board


def test_the_extend_link_is_the_hubs_page_behind_the_same_proxy():
    from gpuspawner.notebook_ext.plainpage import render_page
    from gpuspawner.notebook_ext.status import leases_url

    assert leases_url({}) == ""  # not under a hub: nowhere to extend
    assert leases_url({"JUPYTERHUB_API_URL": "http://hub:8081/hub/api", "JUPYTERHUB_BASE_URL": "/jhub/"}) == "/jhub/hub/gpuspawner/leases"
    assert leases_url({"JUPYTERHUB_API_URL": "http://hub:8081/hub/api"}) == "/hub/gpuspawner/leases"
    page = render_page({"lease": {**LEASE, "extend_url": EXTEND}, "notices": []}, "/keep", "x")
    assert "<a id='extend' href='/hub/gpuspawner/leases' target='_blank'>Extend it on the hub</a>" in page
