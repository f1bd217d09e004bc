"""GPU leases users extend, leases that end by reclaiming kernels, and GPU-hour budgets that
run out while a notebook runs (issue #28): the decisions, the words, and the lease book kept
in the action log across a culler restart."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuspawner.culler.actionlog import ActionLog
from gpuspawner.culler.decide import decide, upcoming
from gpuspawner.culler.gpu_metrics import parse_query_response
from gpuspawner.culler.gpu_query import SERIES_LABEL, GpuQuerySettings
from gpuspawner.culler.leases import EXTENDED, LeaseBook, LeaseRefused, lease_status
from gpuspawner.culler.notices import action_record, keepable, limit_seconds, notice, why_words
from gpuspawner.culler.policy import HELD_BACK, KEEP, RECLAIM, STOP, BudgetRunway, LeaseGrant, Policy
from gpuspawner.culler.records import BUDGET, GPU_LEASE, KernelView
from gpuspawner.names.vocabulary import BUDGET_REMAINING, BUDGET_SPEND_RATE
from tests.culler.test_decide import NOW, H, M, gpu, kernel, kv, server

SLUG = "h100"
STARTED = NOW - 4 * H - M


def h100(started=STARTED, **kw):
    s = server("full", idle=0 * M, slug=SLUG, started=started, **kw)
    return s


def leased(**kw) -> Policy:
    return Policy(offering_gpu_leases={SLUG: 4 * 3600}, offering_gpu_lease_extensions={SLUG: 2}, gpu_lease_extension=3600, **kw)


BUSY = kv(kernel("busy", idle=0 * M, kid="k1"), kernel(idle=10 * M, kid="k2"))


# -- extensions -------------------------------------------------------------------
def test_an_extension_moves_the_end_of_the_lease_of_that_start_only():
    s = h100()
    p = leased()
    assert decide(s, BUSY, gpu("active"), p, NOW).stop_reason == GPU_LEASE
    extended = replace(p, leases={("alice", ""): LeaseGrant(STARTED, extensions=1)})
    assert extended.lease_ends_at(s) == STARTED + 5 * H
    assert decide(s, BUSY, gpu("active"), extended, NOW).action == KEEP
    d = decide(s, BUSY, gpu("active"), extended, STARTED + 5 * H)
    assert d.action == STOP and "1 extension(s)" in d.summary()
    assert why_words(s, d, extended) == (
        "the server's GPU lease ended: the whole GPU may be held for 5 hours (with 1 extension) at most, whatever it does"
    )
    assert limit_seconds(s, d, extended) == 5 * 3600
    # a grant of an earlier start of the server is moot: a new start is a new lease
    restarted = h100(started=NOW - 4 * H - M)
    older = replace(p, leases={("alice", ""): LeaseGrant(NOW - 30 * H, extensions=2)})
    assert older.lease_ends_at(restarted) == restarted.started + 4 * H


def test_the_lease_says_when_it_ends_and_why_it_cannot_be_extended():
    s = h100(started=NOW - H)
    status = lease_status(s, leased(), NOW)
    assert status is not None and status.ends_at == NOW + 3 * H and status.extensions_left == 2 and not status.why_not
    assert (
        status.words()
        == "Your server may hold the whole GPU until May 04 15:00 UTC; then it is stopped. You may extend it by 60 minutes, 2 more times."
    )
    waiting = lease_status(s, leased(waiting={SLUG: (3, "H100 80GB")}), NOW)
    assert waiting is not None and waiting.why_not == "3 people are waiting for H100 80GB"
    assert "It cannot be extended now: 3 people are waiting for H100 80GB." in waiting.words()
    used = lease_status(s, replace(leased(), leases={("alice", ""): LeaseGrant(s.started, extensions=2)}), NOW)
    assert used is not None and used.why_not == "all 2 extensions of this lease are used"
    never = lease_status(s, Policy(offering_gpu_leases={SLUG: 4 * 3600}), NOW)
    assert never is not None and never.extensions_allowed == 0 and "extend" not in never.words()
    assert lease_status(server("plain", started=NOW - H), leased(), NOW) is None  # a CPU server holds no lease


def test_the_lease_book_grants_refuses_and_survives_a_restart(tmp_path):
    path = tmp_path / "actions.jsonl"
    book = LeaseBook(ActionLog(path, clock=lambda: NOW))
    s = h100(started=NOW - H)
    p = leased()
    with pytest.raises(LeaseRefused) as unknown:
        book.extend("alice", "", p, NOW)
    assert unknown.value.status == 404
    book.status[("alice", "")] = lease_status(s, p, NOW)
    status, record = book.extend("alice", "", p, NOW)
    assert status.ends_at == NOW + 4 * H and status.extensions_used == 1
    assert record["action"] == EXTENDED and record["what"] == "The GPU lease of your server was extended"
    assert record["why"] == "by 60 minutes, until May 04 16:00 UTC (1 more extension allowed)"
    status, record = book.extend("alice", "", p, NOW)
    assert record["why"].endswith("(the last extension of this lease)")
    with pytest.raises(LeaseRefused) as used:
        book.extend("alice", "", p, NOW)
    assert used.value.status == 409 and "all 2 extensions of this lease are used" in str(used.value)
    # a restarted culler reads the grant back from the action log
    again = LeaseBook(ActionLog(path, clock=lambda: NOW))
    assert again.grants()[("alice", "")] == LeaseGrant(s.started, 2)
    assert replace(p, leases=again.grants()).lease_ends_at(s) == NOW + 5 * H


def test_a_lease_that_ended_since_the_last_cycle_is_not_extended(tmp_path):
    book = LeaseBook(ActionLog(tmp_path / "a.jsonl", clock=lambda: NOW))
    book.status[("alice", "")] = lease_status(h100(started=NOW - H), leased(), NOW)  # ends at NOW + 3 h
    with pytest.raises(LeaseRefused) as ended:
        book.extend("alice", "", leased(), NOW + 3 * H)
    assert ended.value.status == 409 and str(ended.value) == "the GPU lease cannot be extended: the lease has ended"
    assert book.grants() == {}


def test_nobody_extends_while_someone_waits_for_the_offering(tmp_path):
    book = LeaseBook(ActionLog(tmp_path / "a.jsonl", clock=lambda: NOW))
    p = leased(waiting={SLUG: (1, "H100 80GB")})
    book.status[("alice", "")] = lease_status(h100(started=NOW - H), p, NOW)
    with pytest.raises(LeaseRefused) as refused:
        book.extend("alice", "", p, NOW)
    assert refused.value.status == 409 and str(refused.value) == "the GPU lease cannot be extended: 1 person is waiting for H100 80GB"


# -- a lease that ends by reclaiming the kernels ----------------------------------
def test_a_lease_that_ends_with_a_reclaim_shuts_every_kernel_down_and_begins_again(tmp_path):
    s = h100()
    p = leased(offering_gpu_lease_ends={SLUG: "reclaim"})
    d = decide(s, BUSY, gpu("active"), p, NOW)
    assert d.action == RECLAIM and d.stop_reason == GPU_LEASE
    assert [k.kernel_id for k in d.shutdown] == ["k1", "k2"]  # the busy one too: its user was warned
    assert not keepable(d)
    words = why_words(s, d, p)
    assert words.startswith("the server's GPU lease ended: the whole GPU may be held for 4 hours at a time")
    assert words.endswith("the server stays, and a new lease begins with new kernels")
    record = action_record(s, d, p, NOW, gpu("active"), ["k1", "k2"])
    assert record["reason"] == GPU_LEASE and record["what"] == "2 kernels of your server were shut down"
    assert record["started"] == STARTED.isoformat()
    # without the kernel view there is nothing to shut down: held back, never the server stopped
    held = decide(s, KernelView(ok=False, error="timeout"), gpu("active"), p, NOW)
    assert held.action == HELD_BACK and "kernel view" in held.held_back[0]
    # the reclaim renews the lease, also for a restarted culler (from the action log)
    log = ActionLog(tmp_path / "actions.jsonl", clock=lambda: NOW)
    log.add(record)
    renewed = replace(p, leases=LeaseBook(log).grants())
    assert renewed.lease_ends_at(s) == NOW + 4 * H
    assert decide(s, BUSY, gpu("active"), renewed, NOW + H).action == KEEP


def test_the_end_of_a_lease_is_warned_with_how_to_extend_it():
    s = h100(started=NOW - 4 * H + 5 * M)
    p = leased()
    coming = upcoming(s, BUSY, gpu("active"), p, NOW, horizon_s=600)
    assert coming is not None and coming.at == NOW + 5 * M and coming.decision.stop_reason == GPU_LEASE
    body = notice(s, coming, p, NOW, None, gpu("active"))
    assert body["keepable"] is False and body["cause"] == GPU_LEASE and body["action"] == "server"
    assert body["reason"].startswith("the server's GPU lease ends: the whole GPU may be held for 4 hours at most")


# -- GPU-hour budgets ---------------------------------------------------------------
def budget(remaining: float, rate: float = 1.0, noticed=None, notice_s: int = 0, **kw) -> Policy:
    return Policy(
        budgets={"alice": BudgetRunway(remaining, rate, NOW)},
        budget_noticed={"alice": noticed} if noticed else {},
        turn_notice=notice_s,
        **kw,
    )


def test_a_budget_that_runs_out_stops_the_server_whatever_it_does():
    s = h100(started=NOW - H)
    assert decide(s, BUSY, gpu("active"), budget(0.5), NOW).action == KEEP
    d = decide(s, BUSY, gpu("active"), budget(0.5), NOW + 30 * M)
    assert d.action == STOP and d.stop_reason == BUDGET and not keepable(d)
    assert why_words(s, d, budget(0.5)) == (
        "your GPU-hour budget ran out (spending 1 GPU-hours per hour); a new start is refused until it frees up"
    )
    assert action_record(s, d, budget(0.5), NOW, gpu("active"))["reason"] == BUDGET
    # nothing spent now and hours left: it never runs out; a free server is never stopped for it
    assert decide(s, BUSY, gpu("active"), budget(0.5, rate=0.0), NOW + 9 * H).action == KEEP
    free = replace(s, offering=replace(s.offering, hourly_cost=0.0))
    assert decide(free, BUSY, gpu("active"), budget(-1.0), NOW).action == KEEP
    assert decide(server("plain", idle=0 * M), BUSY, None, budget(-1.0), NOW).action == KEEP


def test_a_budget_found_out_already_is_warned_first():
    """A budget that is already used up when the culler first sees it: stopped only
    ``turn_notice`` after that, so the warning comes first."""
    s = h100(started=NOW - H)
    p = budget(-0.1, noticed=NOW, notice_s=300)
    assert decide(s, BUSY, gpu("active"), p, NOW).action == KEEP
    coming = upcoming(s, BUSY, gpu("active"), p, NOW, horizon_s=300)
    assert coming is not None and coming.at == NOW + 5 * M and coming.decision.stop_reason == BUDGET
    assert notice(s, coming, p, NOW, None, gpu("active"))["reason"].startswith("your GPU-hour budget runs out")
    assert decide(s, BUSY, gpu("active"), p, NOW + 5 * M).stop_reason == BUDGET


def test_the_hubs_budget_series_are_read_by_user_name():
    def row(metric, value, **labels):
        return {"metric": {SERIES_LABEL: f"{metric}:last", **labels}, "value": [0, str(value)]}

    body = {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [
                row(BUDGET_REMAINING, 0.25, user="alice-40example-2ecom", name="alice@example.com"),
                row(BUDGET_SPEND_RATE, 2, user="alice-40example-2ecom", name="alice@example.com"),
                row(BUDGET_REMAINING, 3, user="bob"),  # an older hub: no name label
                row(BUDGET_REMAINING, "NaN", user="carol", name="carol"),
            ],
        },
    }
    view = parse_query_response(body, GpuQuerySettings())
    assert view.budgets == {"alice@example.com": (0.25, 2.0), "bob": (3.0, 0.0)}
    assert BudgetRunway(0.25, 2.0, NOW).runs_out_at() == NOW + 7.5 * M
    assert BudgetRunway(0.0, 0.0, NOW).runs_out_at() == NOW
    assert BudgetRunway(1.0, 0.0, NOW).runs_out_at() is None
