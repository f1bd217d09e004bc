"""Reclaim when someone waits (issue #28): while spawns wait in the hub's queue for an
offering, the longest idle servers of it -- one per waiting spawn -- are stopped after
``reclaim_for_waiting_after`` instead of their idle timeout; never a busy one, never one
whose GPU is active or unknown, and nothing when nobody waits."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from gpuspawner.culler.decide import decide, upcoming
from gpuspawner.culler.notices import action_record, keepable, limit_seconds, why_words
from gpuspawner.culler.observations import kernel_memo, turns, waiting_ranking
from gpuspawner.culler.policy import KEEP, STOP, Policy
from gpuspawner.culler.records import IDLE, WAITING
from tests.culler.test_decide import NOW, H, M, gpu, kernel, kv, server

SLUG = "mig-1g"
POD = ("jhub", "jupyter-alice")
NAME = "MIG 1g.10gb"


def policy(waiting: int = 2, turn: bool = True, after: int = 15 * 60, **kw) -> Policy:
    return Policy(
        reclaim_for_waiting_after=after,
        waiting={SLUG: (waiting, NAME)} if waiting else {},
        turns={POD: NOW - H} if turn else {},
        **kw,
    )


def idle_mig(idle: timedelta = 22 * M):
    return server("mig", idle=idle, slug=SLUG)


def test_an_idle_server_in_turn_is_stopped_for_the_waiting_with_their_words():
    p = policy(waiting=3)
    s = idle_mig()
    d = decide(s, kv(kernel(idle=22 * M)), gpu("idle"), p, NOW)
    assert d.action == STOP and d.stop_reason == WAITING
    assert "3 spawn(s) waiting for MIG 1g.10gb" in d.summary()
    assert why_words(s, d, p) == "3 people were waiting for MIG 1g.10gb and the MIG slice was idle for 22 minutes (limit 15)"
    assert limit_seconds(s, d, p) == 15 * 60 and keepable(d)  # a cell or "Keep" withdraws it
    record = action_record(s, d, p, NOW, gpu("idle"))
    assert record["reason"] == WAITING and record["what"] == "Your server was stopped"


def test_the_warning_comes_before_and_says_who_waits():
    p = policy(waiting=1)
    s = idle_mig(idle=12 * M)
    assert decide(s, kv(kernel(idle=12 * M)), gpu("idle"), p, NOW).action == KEEP
    coming = upcoming(s, kv(kernel(idle=12 * M)), gpu("idle"), p, NOW, horizon_s=5 * 60)
    assert coming is not None and coming.at == NOW + 3 * M and coming.decision.stop_reason == WAITING
    words = why_words(s, coming.decision, p, earlier=coming.at - NOW)
    assert words == "1 person is waiting for MIG 1g.10gb and the MIG slice has been idle for 12 minutes (limit 15)"


def test_nothing_is_reclaimed_when_nobody_waits_or_it_is_not_its_turn():
    s = idle_mig()
    for p in (policy(waiting=0), policy(turn=False), policy(after=0)):
        d = decide(s, kv(kernel(idle=22 * M)), gpu("idle"), p, NOW)
        assert d.action == KEEP, p


def test_a_busy_kernel_an_active_gpu_or_an_unknown_one_keeps_it():
    p, s = policy(), idle_mig()
    assert decide(s, kv(kernel("busy", idle=22 * M)), gpu("idle"), p, NOW).action == KEEP
    assert decide(s, kv(kernel(idle=22 * M)), gpu("active"), p, NOW).action == KEEP
    unknown = decide(s, kv(kernel(idle=22 * M)), gpu("unknown"), p, NOW)
    assert unknown.action != STOP and unknown.held_back


def test_a_recent_cell_or_keep_withdraws_it():
    p, s = policy(), idle_mig()
    assert decide(s, kv(kernel(idle=2 * M)), gpu("idle"), p, NOW).action == KEEP
    assert decide(replace(s, last_activity=NOW - M), kv(kernel(idle=22 * M)), gpu("idle"), p, NOW).action == KEEP


def test_past_the_idle_timeout_the_reason_stays_idle():
    p, s = policy(), idle_mig(idle=3 * H)
    d = decide(s, kv(kernel(idle=3 * H)), gpu("idle"), p, NOW)
    assert d.action == STOP and d.stop_reason == IDLE


def test_no_effect_where_the_timeout_is_off_or_not_longer():
    s = idle_mig()
    never = policy(offering_timeouts={SLUG: 0})
    assert decide(s, kv(kernel(idle=22 * M)), gpu("idle"), never, NOW).action == KEEP
    shorter = policy(offering_timeouts={SLUG: 10 * 60})  # its own timeout already stops it first
    assert decide(s, kv(kernel(idle=22 * M)), gpu("idle"), shorter, NOW).stop_reason == IDLE
    plain = replace(policy(), waiting={"a100-plain": (1, "x")})
    assert plain.waiting_bound_for(server("plain").offering) == 0


def test_per_offering_bound_wins():
    p = policy(offering_reclaim_for_waiting_after={SLUG: 30 * 60})
    assert decide(idle_mig(), kv(kernel(idle=22 * M)), gpu("idle"), p, NOW).action == KEEP
    assert decide(idle_mig(idle=31 * M), kv(kernel(idle=31 * M)), gpu("idle"), p, NOW).stop_reason == WAITING


def test_the_kernel_memo_asks_again_in_time_for_the_shorter_bound():
    memo = kernel_memo(kv(kernel(idle=10 * M)), NOW, policy(waiting=0), idle_mig().offering)
    assert memo is not None and memo.earliest_stop == NOW + 5 * M


def test_ranking_longest_idle_first_one_per_waiting_spawn_never_the_busy():
    def off(pod, slug=SLUG):
        return replace(idle_mig().offering, pod=pod, slug=slug)

    ranking = waiting_ranking(
        [
            (off("a"), 10 * M, False),
            (off("b"), 40 * M, False),
            (off("c"), 90 * M, True),  # busy: never in line
            (off("d"), 25 * M, False),
            (off("e"), None, False),  # idleness unknown
            (off("f", "other"), 99 * M, False),
        ]
    )
    assert ranking[SLUG] == [("jhub", "b"), ("jhub", "d"), ("jhub", "a")]
    assert turns(ranking, {SLUG: (2, NAME)}, {}, NOW) == {("jhub", "b"): NOW, ("jhub", "d"): NOW}
    assert turns(ranking, {}, {("jhub", "b"): NOW - H}, NOW) == {}
    # a pod already in turn keeps the time its turn began
    assert turns(ranking, {SLUG: (9, NAME)}, {("jhub", "d"): NOW - M}, NOW) == {
        ("jhub", "b"): NOW,
        ("jhub", "d"): NOW - M,
        ("jhub", "a"): NOW,
    }


def test_a_server_idle_long_before_anyone_waited_is_warned_first():
    """Its deadline jumps when someone starts waiting: it is reclaimed only ``turn_notice``
    after its turn began, so that its user sees the warning first."""
    p = replace(policy(waiting=1), turns={POD: NOW}, turn_notice=60)
    s, kernels = idle_mig(idle=50 * M), kv(kernel(idle=50 * M))
    now = decide(s, kernels, gpu("idle"), p, NOW)
    assert now.action == KEEP and "warned first" in now.summary()
    coming = upcoming(s, kernels, gpu("idle"), p, NOW, horizon_s=60)
    assert coming is not None and coming.at == NOW + M and coming.decision.stop_reason == WAITING
    assert decide(s, kernels, gpu("idle"), p, NOW + M).stop_reason == WAITING


def test_a_lease_per_offering_wins_over_its_kinds():
    """Issue #28: "4 h on an H100" -- an offering's own lease, warned like any lease."""
    h100 = server("full", idle=0 * M, slug="h100", started=NOW - 4 * H - M)
    busy = kv(kernel("busy", idle=0 * M))
    four_hours = Policy(offering_gpu_leases={"h100": 4 * 3600})
    d = decide(h100, busy, gpu("active"), four_hours, NOW)
    assert d.action == STOP and d.stop_reason == "gpu_lease"
    assert why_words(h100, d, four_hours) == "the server's GPU lease ended: the whole GPU may be held for 4 hours at most, whatever it does"
    assert decide(h100, busy, gpu("active"), Policy(), NOW).action == KEEP  # the kind's 24 h
    assert (
        decide(
            server("full", idle=0 * M, slug="h100", started=NOW - 30 * H), busy, gpu("active"), Policy(offering_gpu_leases={"h100": 0}), NOW
        ).action
        == KEEP
    )
