"""Warnings, the user's words, and the action log: pure projections of decide(),
the sentences the hub's pages show, and a log that survives a restart."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuspawner.culler import notices
from gpuspawner.culler.actionlog import ActionLog
from gpuspawner.culler.decide import decide, upcoming
from gpuspawner.culler.observations import plan_kernel_view
from gpuspawner.culler.policy import KEEP, RECLAIM, STOP
from gpuspawner.hub.culleractions import page_items, sentence
from tests.culler.test_decide import NOW, P, gpu, kernel, kv, server

M = timedelta(minutes=1)


# -- upcoming: the warning announces exactly what decide() will do -------------------
def test_a_stop_due_within_the_window_is_announced_at_the_second_it_falls_due():
    s = server("full", idle=25 * M)  # full: 30 min timeout
    k = kv(kernel(idle=25 * M))
    assert decide(s, k, gpu(), P, NOW).action == KEEP
    up = upcoming(s, k, gpu(), P, NOW, 600)
    assert up is not None and up.action == STOP
    assert up.at == NOW + 5 * M
    assert decide(s, k, gpu(), P, up.at).action == STOP
    assert decide(s, k, gpu(), P, up.at - timedelta(seconds=1)).action == KEEP
    body = notices.notice(s, up, P, NOW, NOW - 25 * M, gpu())
    assert body["reason"] == "the whole GPU has been idle for 25 minutes (limit 30)"
    assert body["action"] == "server" and body["limit_seconds"] == 1800


def test_no_warning_beyond_the_window_nor_for_a_busy_gpu_or_kernel():
    assert upcoming(server("full", idle=10 * M), kv(kernel(idle=10 * M)), gpu(), P, NOW, 600) is None
    assert upcoming(server("full", idle=25 * M), kv(kernel(idle=25 * M)), gpu("active"), P, NOW, 600) is None
    assert upcoming(server("full", idle=25 * M), kv(kernel("busy", idle=25 * M)), gpu(), P, NOW, 600) is None
    assert upcoming(server("full", idle=25 * M), kv(kernel(idle=25 * M)), gpu(), P, NOW, 0) is None


def test_kernels_of_a_shared_gpu_are_announced_before_their_shutdown():
    s = server("shared", idle=25 * M)  # shared: 2 h server timeout, 30 min kernels
    k = kv(kernel(idle=25 * M))
    up = upcoming(s, k, gpu(memory=6000), P, NOW, 600)
    assert up is not None and up.action == RECLAIM and up.at == NOW + 5 * M
    body = notices.notice(s, up, P, NOW, NOW - 25 * M, gpu(memory=6000))
    assert body["action"] == "kernels" and body["warning"] is True
    assert body["act_at"] == (NOW + 5 * M).isoformat()
    assert body["limit_seconds"] == 1800
    assert body["reason"] == "an idle kernel holds 6000 MiB of the shared GPU's memory while idle for 25 minutes (limit 30)"


def test_the_kernel_view_is_asked_early_enough_to_warn():
    s = server("full", idle=25 * M)
    assert not plan_kernel_view(s, gpu(), P, NOW).kernels
    ask = plan_kernel_view(s, gpu(), P, NOW, horizon_s=600)
    assert ask.kernels and ask.status


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    kind=st.sampled_from(["full", "mig", "shared", "plain"]),
    idle_min=st.integers(0, 300),
    kidle_min=st.integers(0, 300),
    state=st.sampled_from(["idle", "busy", "starting"]),
    g=st.sampled_from(["idle", "active", "unknown"]),
    horizon=st.integers(0, 3600),
)
def test_a_warning_always_comes_true_on_the_same_views(kind, idle_min, kidle_min, state, g, horizon):
    """Property: a warned action is what decide() does at act_at on the same
    views, and not a second before; nothing already due is warned of later."""
    s = server(kind, idle=idle_min * M)
    k = kv(kernel(state, idle=kidle_min * M))
    v = gpu(g) if kind != "plain" else None
    up = upcoming(s, k, v, P, NOW, horizon)
    if up is None:
        return
    assert NOW <= up.at <= NOW + timedelta(seconds=horizon)
    assert decide(s, k, v, P, up.at).action == up.action
    if up.at > NOW:
        assert decide(s, k, v, P, up.at - timedelta(seconds=1)).action != up.action


# -- the user's words -----------------------------------------------------------------
def test_the_hub_page_sentence_for_a_stopped_named_server():
    s = server("full", idle=30 * M, name="train")
    d = decide(s, kv(kernel(idle=30 * M)), gpu(), P, NOW)
    assert d.action == STOP
    rec = notices.action_record(s, d, P, NOW, gpu())
    assert sentence(rec, "14:02") == "Your server 'train' was stopped at 14:02: the whole GPU was idle for 30 minutes (limit 30)."
    assert rec["user"] == "alice" and rec["server"] == "train" and rec["action"] == "server_stopped"
    assert rec["observed"]["gpu"] == "idle" and rec["observed"]["gpu_memory_mib"] == 4096.0
    json.dumps(rec)  # the log and the API carry it as JSON


def test_words_for_long_limits_and_for_kernels():
    assert notices.duration_words(60) == "1 minute"
    assert notices.duration_words(59) == "less than a minute"  # a warning given early: never "0 minutes"
    assert notices.duration_words(3 * 3600 + 300) == "3 hours 5 minutes"
    s = server("mig", idle=3 * 60 * M)
    d = decide(s, kv(kernel(idle=3 * 60 * M)), gpu(), P, NOW)
    assert notices.why_words(s, d, P) == "the MIG slice was idle for 3 hours (limit 60 minutes)"
    sh = server("shared", idle=10 * M)
    d2 = decide(sh, kv(kernel(idle=45 * M, kid="a"), kernel(idle=40 * M, kid="b")), gpu(memory=6000), P, NOW)
    assert d2.action == RECLAIM
    rec = notices.action_record(sh, d2, P, NOW, gpu(memory=6000), ["a", "b"])
    assert rec["what"] == "2 idle kernels of your server were shut down"
    assert rec["why"] == "2 idle kernels held 6000 MiB of the shared GPU's memory while idle for 45 minutes (limit 30)"
    assert rec["kernels"] == ["a", "b"]
    body = notices.acting(sh, d2, P, NOW, NOW - 45 * M, gpu(memory=6000))
    assert body["reclaimed"] == ["a", "b"] and body["warning"] is False and body["action"] == "kernels"


# -- the action log ---------------------------------------------------------------------
def _entry(user: str, minutes_ago: int = 0, **kw) -> dict:
    return {"time": (NOW - minutes_ago * M).isoformat(), "user": user, "server": "", "action": "server_stopped", **kw}


def test_the_action_log_survives_a_restart_and_shows_each_user_their_own(tmp_path):
    path = tmp_path / "actions.jsonl"
    log = ActionLog(path, clock=lambda: NOW)
    log.add(_entry("ada", 5))
    log.add(_entry("bob", 3))
    log.add(_entry("ada", 1, server="train"))
    again = ActionLog(path, clock=lambda: NOW)
    assert [e["server"] for e in again.entries("ada")] == ["train", ""]
    assert [e["user"] for e in again.entries("bob")] == ["bob"]
    assert len(again.entries()) == 3 and again.entries(limit=1)[0]["server"] == "train"


def test_the_action_log_is_bounded_by_count_and_age_and_skips_a_torn_line(tmp_path, caplog):
    path = tmp_path / "actions.jsonl"
    log = ActionLog(path, max_entries=3, retention=timedelta(days=1), clock=lambda: NOW)
    for i in range(7):
        log.add(_entry(f"u{i}"))
    assert [e["user"] for e in log.entries()] == ["u6", "u5", "u4"]
    assert len(path.read_text().splitlines()) <= 6  # rewritten at twice the bound
    with path.open("a") as f:
        f.write(json.dumps(_entry("old", 2 * 24 * 60)) + "\n" + '{"time": "2026-05-04T1')
    again = ActionLog(path, max_entries=3, retention=timedelta(days=1), clock=lambda: NOW)
    assert [e["user"] for e in again.entries()] == ["u6", "u5", "u4"]
    assert "1 unreadable line(s) skipped" in caplog.text
    assert len(path.read_text().splitlines()) == 3


def test_an_unwritable_action_log_keeps_the_action_in_memory_and_says_so(tmp_path, caplog):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    log = ActionLog(blocker / "actions.jsonl", clock=lambda: NOW)
    log.add(_entry("ada"))
    assert log.entries("ada") and "kept in memory only" in caplog.text


def test_a_bad_bound_is_refused_with_what_to_do():
    with pytest.raises(ValueError, match="at least 1"):
        ActionLog(None, max_entries=0)


def test_the_page_shows_recent_actions_with_their_time():
    s = server("full", idle=30 * M, name="train")
    d = decide(s, kv(kernel(idle=30 * M)), gpu(), P, NOW)
    old = notices.action_record(s, d, P, NOW - timedelta(days=9), gpu())
    rec = notices.action_record(s, d, P, NOW.replace(hour=14, minute=2), gpu())
    items = page_items([rec, old], NOW.replace(hour=15), days=7)
    assert [i["text"] for i in items] == ["Your server 'train' was stopped at 14:02 UTC: the whole GPU was idle for 30 minutes (limit 30)."]
