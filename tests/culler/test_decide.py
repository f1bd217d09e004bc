"""Pure decisions: every rule, and properties over random inputs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from gpuspawner.culler.contract import parse_offering
from gpuspawner.culler.decide import GPU_IDLE_LIMIT, decide
from gpuspawner.culler.gpu_metrics import PodGpuView
from gpuspawner.culler.observations import GpuIdleStreak, kernel_memo, plan_kernel_view, track_gpu_idle
from gpuspawner.culler.policy import HELD_BACK, KEEP, RECLAIM, STOP, Policy
from gpuspawner.culler.records import KernelInfo, KernelView, ServerRecord

NOW = datetime(2026, 5, 4, 12, 0, 0, tzinfo=UTC)
H = timedelta(hours=1)
M = timedelta(minutes=1)
URL = "http://10.1.2.3:8888/user/alice/"


def server(kind="mig", idle=3 * H, slug=None, url=URL, name="", started=None, pending=None, ready=True) -> ServerRecord:
    opts = {"offering": slug or f"a100-{kind}"}
    if kind != "plain":
        opts["gpuspawner"] = {
            "offering": slug or f"a100-{kind}",
            "kind": kind,
            "pod": "jupyter-alice",
            "namespace": "jhub",
            "url": url,
        }
    return ServerRecord(
        user="alice",
        name=name,
        admin=False,
        ready=ready,
        pending=pending,
        started=started or NOW - 10 * H,
        last_activity=NOW - idle,
        offering=parse_offering(opts),
        model={"user_options": opts},
    )


def kernel(state="idle", idle=3 * H, kid="k1", connections=0) -> KernelInfo:
    return KernelInfo(kid, "python3", state, NOW - idle, connections)


def kv(*kernels: KernelInfo, status_idle=None) -> KernelView:
    return KernelView(
        ok=True,
        kernels=tuple(kernels),
        server_last_activity=NOW - status_idle if status_idle else None,
    )


def gpu(state="idle", memory=4096.0) -> PodGpuView:
    return PodGpuView(state, f"test {state}", memory)


P = Policy()


# -- stopping (free the device) ---------------------------------------------------
def test_idle_mig_server_past_its_timeout_is_stopped():
    d = decide(server("mig", idle=3 * H), kv(kernel()), gpu(), P, NOW)
    assert d.action == STOP and d.stop_reason == "idle"
    text = d.summary()
    assert "inactive for 03:00:00 (timeout 01:00:00" in text
    assert "GPU idle" in text and "GPU memory held 4096 MiB" in text
    assert "1 kernels, none busy" in text


@pytest.mark.parametrize("kind,limit", [("full", 30), ("mig", 60), ("shared", 120), ("vgpu", 60), ("custom", 60)])
def test_default_timeouts_per_kind(kind, limit):
    just_under = decide(server(kind, idle=(limit - 1) * M), kv(), gpu(), P, NOW)
    assert just_under.action != STOP
    over = decide(server(kind, idle=(limit + 1) * M), kv(), gpu(), P, NOW)
    assert over.action == STOP


def test_plain_server_uses_default_timeout_without_any_gpu_view():
    plain = server("plain", idle=7 * H)
    assert plain.offering.kind == "cpu" and plain.offering.url is None
    assert decide(plain, None, None, P, NOW).action == KEEP
    d = decide(server("plain", idle=9 * H), None, None, P, NOW)
    assert d.action == STOP and "no kernel view (no direct url)" in d.summary()


def test_busy_kernel_blocks_the_stop_whatever_the_hub_says():
    d = decide(server("full", idle=48 * H), kv(kernel("busy", idle=48 * H)), gpu(), P, NOW)
    assert d.action == KEEP and "1 of 1 kernels busy" in d.summary()


def test_recent_kernel_activity_is_activity():
    d = decide(server("full", idle=5 * H), kv(kernel("idle", idle=10 * M)), gpu(), P, NOW)
    assert d.action == KEEP and "inactive for 00:10:00" in d.summary()


def test_server_status_activity_is_activity():
    d = decide(server("full", idle=5 * H), kv(status_idle=5 * M), gpu(), P, NOW)
    assert d.action == KEEP


def test_gpu_activity_blocks_the_stop():
    d = decide(server("mig", idle=48 * H), kv(), gpu("active"), P, NOW)
    assert d.action == KEEP and "GPU active" in d.summary()


def test_gpu_activity_seen_in_an_earlier_cycle_extends_the_timeout():
    d = decide(server("mig", idle=5 * H), kv(), gpu("idle"), P, NOW, gpu_last_active=NOW - 20 * M)
    assert d.action == KEEP and "inactive for 00:20:00" in d.summary()


@pytest.mark.parametrize("view", [gpu("unknown"), None])
def test_unknown_gpu_view_holds_back_a_gpu_server(view):
    d = decide(server("full", idle=48 * H), kv(), view, P, NOW)
    assert d.action == HELD_BACK
    assert "no GPU-based cull without a known-idle GPU view" in d.summary()


def test_unavailable_kernel_view_holds_back_unless_not_required():
    broken = KernelView(ok=False, error="server: GET ... failed (599): timeout")
    d = decide(server("full"), broken, gpu(), P, NOW)
    assert d.action == HELD_BACK and "kernel view unavailable (server: GET" in d.summary()
    lax = Policy(require_kernel_view=False)
    assert decide(server("full"), broken, gpu(), lax, NOW).action == STOP


def test_pending_and_not_ready_servers_are_kept():
    assert decide(server(pending="spawn"), None, gpu(), P, NOW).action == KEEP
    assert decide(server(ready=False), None, gpu(), P, NOW).action == KEEP


def test_offering_timeout_wins_over_kind():
    p = Policy(offering_timeouts={"a100-80gb-long": 6 * 3600})
    assert decide(server("full", idle=3 * H, slug="a100-80gb-long"), kv(), gpu(), p, NOW).action == KEEP
    assert decide(server("full", idle=3 * H), kv(), gpu(), p, NOW).action == STOP


def test_zero_timeout_never_stops():
    p = Policy(kind_timeouts={"full": 0})
    d = decide(server("full", idle=1000 * H), kv(), gpu(), p, NOW)
    assert d.action == KEEP and "timeout never" in d.summary()


def test_max_age_stops_a_used_server_but_never_a_busy_one():
    p = Policy(max_age=8 * 3600)
    young_active = server("full", idle=1 * M, started=NOW - 2 * H)
    assert decide(young_active, kv(), gpu(), p, NOW).action == KEEP
    old_active = server("full", idle=1 * M, started=NOW - 9 * H)
    d = decide(old_active, kv(), gpu(), p, NOW)
    assert d.action == STOP and d.stop_reason == "max_age" and "older than max_age" in d.summary()
    assert decide(old_active, kv(kernel("busy")), gpu(), p, NOW).action == KEEP
    assert decide(old_active, kv(), gpu("active"), p, NOW).action == KEEP


def test_stop_switches():
    assert decide(server("mig"), kv(), gpu(), Policy(stop_kinds=frozenset({"full"})), NOW).action == KEEP
    named = server("mig", name="gpu-job")
    assert decide(named, kv(), gpu(), Policy(cull_named_servers=False), NOW).action == KEEP
    assert decide(named, kv(), gpu(), P, NOW).action == STOP
    assert decide(server("mig"), kv(), gpu(), Policy(cull_default_servers=False), NOW).action == KEEP


def test_custom_arbiter_answer_replaces_the_time_test_not_the_vetoes():
    young = server("full", idle=1 * M)
    assert decide(young, kv(), gpu(), P, NOW, arbiter_idle=True).action == STOP
    assert decide(young, kv(kernel("busy")), gpu(), P, NOW, arbiter_idle=True).action == KEEP
    assert decide(server("full", idle=9 * H), kv(), gpu(), P, NOW, arbiter_idle=False).action == KEEP


# -- reclaiming (keep the server, free memory) --------------------------------------
def test_idle_kernel_on_shared_gpu_is_shut_down_and_server_kept():
    s = server("shared", idle=1 * H)  # within the shared timeout (2 h)
    d = decide(
        s,
        kv(kernel("idle", idle=45 * M, kid="idle1"), kernel("busy", kid="busy1")),
        gpu("idle"),
        P,
        NOW,
    )
    # a CPU-busy kernel beside an idle one holding GPU memory: only the idle one goes
    assert d.action == RECLAIM and [a.kernel_id for a in d.shutdown] == ["idle1"]
    d = decide(
        s,
        kv(kernel("idle", idle=45 * M, kid="idle1"), kernel("idle", idle=5 * M, kid="fresh")),
        gpu("idle"),
        P,
        NOW,
    )
    assert d.action == RECLAIM
    assert [a.kernel_id for a in d.shutdown] == ["idle1"]
    assert "kernel idle1 (python3) idle for 00:45:00 (kernel timeout 00:30:00" in d.summary()


def test_reclaim_needs_memory_held():
    s = server("shared", idle=1 * H)
    k = kv(kernel("idle", idle=45 * M))
    assert decide(s, k, gpu("idle", memory=10.0), P, NOW).action == KEEP
    d = decide(s, k, gpu("idle", memory=None), P, NOW)
    assert d.action == HELD_BACK and "GPU memory held is unknown" in d.summary()


def test_reclaim_not_while_gpu_active_unless_configured():
    s = server("shared", idle=1 * H)
    k = kv(kernel("idle", idle=45 * M))
    assert decide(s, k, gpu("active"), P, NOW).action == KEEP
    d = decide(s, k, gpu("unknown"), P, NOW)
    assert d.action == HELD_BACK
    loose = Policy(gpu_activity_blocks_kernel_reclaim=False)
    assert decide(s, k, gpu("active"), loose, NOW).action == RECLAIM


def test_reclaim_only_on_configured_kinds():
    k = kv(kernel("idle", idle=45 * M))
    assert decide(server("mig", idle=10 * M), k, gpu(), P, NOW).action == KEEP
    p = Policy(reclaim_kinds=frozenset({"mig"}))
    assert decide(server("mig", idle=10 * M), k, gpu(), p, NOW).action == RECLAIM


def test_connected_kernels_and_kernel_timeouts():
    s = server("shared", idle=1 * H, slug="t4-shared")
    k = kv(kernel("idle", idle=45 * M, connections=1))
    assert decide(s, k, gpu(), P, NOW).action == RECLAIM
    assert decide(s, k, gpu(), Policy(reclaim_connected_kernels=False), NOW).action == KEEP
    assert decide(s, k, gpu(), Policy(offering_kernel_timeouts={"t4-shared": 3600}), NOW).action == KEEP
    assert decide(s, k, gpu(), Policy(kernel_timeout=0), NOW).action == KEEP


def test_only_idle_kernels_are_reclaimed_and_only_busy_ones_veto():
    s = server("shared", idle=1 * H)
    for state in ("dead", "starting", "restarting"):
        assert decide(s, kv(kernel(state, idle=45 * M)), gpu(), P, NOW).action == KEEP, state
    # a kernel never connected to stays "starting": judged on its last_activity
    assert decide(server("full"), kv(kernel("starting", idle=3 * H)), gpu(), P, NOW).action == STOP
    assert decide(server("full"), kv(kernel("starting", idle=1 * M)), gpu(), P, NOW).action == KEEP


# -- when to ask kernels --------------------------------------------------------------
def test_kernels_are_asked_only_when_they_can_change_the_decision():
    # hub shows activity within the timeout, no reclaim possible: no need
    assert not plan_kernel_view(server("mig", idle=10 * M), gpu(), P, NOW).kernels
    # past the timeout with an idle GPU: the kernels decide
    assert plan_kernel_view(server("mig", idle=3 * H), gpu(), P, NOW).kernels
    # the GPU is active or unknown: no stop is possible anyway
    assert not plan_kernel_view(server("mig", idle=3 * H), gpu("active"), P, NOW).kernels
    assert not plan_kernel_view(server("mig", idle=3 * H), gpu("unknown"), P, NOW).kernels
    # a reclaim is possible on a shared GPU holding memory
    assert plan_kernel_view(server("shared", idle=1 * M), gpu(), P, NOW).kernels
    assert not plan_kernel_view(server("shared", idle=1 * M), gpu(memory=1.0), P, NOW).kernels
    # no direct address: nothing to ask
    assert not plan_kernel_view(server("mig", idle=3 * H, url=None), gpu(), P, NOW).kernels
    # a custom arbiter may cull at any age: always ask
    assert plan_kernel_view(server("mig", idle=1 * M), gpu(), P, NOW, custom_arbiter=True).kernels


# -- the pod's word against the GPU's telemetry (gpu_idle_limit) ---------------------------
def liar_view() -> KernelView:
    """What a pod that wants to keep its GPU says: a busy kernel, activity "now"
    and even in the future."""
    return KernelView(
        ok=True,
        kernels=(kernel("busy", idle=timedelta(0)), kernel("idle", idle=-24 * H, kid="k2")),
        server_last_activity=NOW + 24 * H,
    )


def test_gpu_idle_past_the_limit_wins_over_everything_a_pod_claims():
    s = server("full", idle=1 * M)  # the hub's last_activity is fresh too
    before = decide(s, liar_view(), gpu(), P, NOW, gpu_idle_since=NOW - 3 * H)
    assert before.action == KEEP
    assert "activity claimed 24:00:00 in the future" in before.summary()
    d = decide(s, liar_view(), gpu(), P, NOW, gpu_idle_since=NOW - 4 * H)
    assert d.action == STOP and d.stop_reason == GPU_IDLE_LIMIT
    assert d.gpu_idle_for == 4 * H
    assert "GPU idle for 04:00:00 (gpu_idle_limit 04:00:00)" in d.summary()
    assert d.overruled == (
        "1 of 2 kernels busy (k1 busy)",
        "activity 24:00:00 in the future",
    )
    # a kernel API that fails: held back before the bound, overruled after it
    down = KernelView(ok=False, error="connection refused")
    quiet = server("full", idle=3 * H)
    assert decide(quiet, down, gpu(), P, NOW, gpu_idle_since=NOW - 3 * H).action == HELD_BACK
    d = decide(quiet, down, gpu(), P, NOW, gpu_idle_since=NOW - 5 * H)
    assert d.stop_reason == GPU_IDLE_LIMIT
    assert d.overruled == ("kernel view unavailable (connection refused)",)
    # ...and so is fresh hub activity (the pod's jupyterhub-singleuser reports it)
    assert decide(s, down, gpu(), P, NOW, gpu_idle_since=NOW - 3 * H).action == KEEP
    d = decide(s, down, gpu(), P, NOW, gpu_idle_since=NOW - 5 * H)
    assert d.stop_reason == GPU_IDLE_LIMIT
    assert d.overruled == (
        "kernel view unavailable (connection refused)",
        "activity 00:01:00 ago (hub, server status or kernels)",
    )
    # a custom arbiter's "not idle" is overruled as well (it judges the pod's claims)
    d = decide(s, kv(kernel()), gpu(), P, NOW, False, gpu_idle_since=NOW - 5 * H)
    assert d.stop_reason == GPU_IDLE_LIMIT and "cull_arbiter_hook said not idle" in d.overruled


def test_real_gpu_activity_or_an_unknown_gpu_is_never_overruled():
    s = server("full", idle=1 * M)
    for g in (gpu("active"), gpu("unknown"), None):
        d = decide(s, liar_view(), g, P, NOW, gpu_idle_since=NOW - 100 * H)
        assert d.action in (KEEP, HELD_BACK), d.summary()
    # and activity ends the streak
    assert track_gpu_idle(GpuIdleStreak(NOW - 9 * H, NOW - M), gpu("active"), NOW, 600) is None


def test_gpu_idle_limit_per_offering_never_below_the_timeout_and_off_switches():
    full = server("full").offering
    assert P.gpu_idle_limit_for(full) == 4 * 3600
    assert P.gpu_idle_limit_for(server("plain").offering) == 0  # no GPU, no bound
    assert Policy(gpu_idle_limit=0).gpu_idle_limit_for(full) == 0
    assert Policy(gpu_idle_limit=60).gpu_idle_limit_for(full) == 1800  # the full timeout
    per = Policy(offering_gpu_idle_limits={"a100-full": 7200, "a100-mig": 0})
    assert per.gpu_idle_limit_for(full) == 7200
    assert per.gpu_idle_limit_for(server("mig").offering) == 0
    # "never stop this offering for idleness" holds for the bound too
    never = Policy(offering_timeouts={"a100-full": 0})
    assert never.gpu_idle_limit_for(full) == 0
    s = server("full", idle=1 * M)
    assert decide(s, liar_view(), gpu(), never, NOW, gpu_idle_since=NOW - 99 * H).action == KEEP
    # switched-off stopping (stop_kinds, cull_named_servers) is not overruled
    off = Policy(stop_kinds=frozenset({"mig"}))
    assert decide(s, liar_view(), gpu(), off, NOW, gpu_idle_since=NOW - 99 * H).action == KEEP


def test_gpu_idle_streak_needs_every_gap_covered_by_an_idle_window():
    w = 600
    st0 = track_gpu_idle(None, gpu(), NOW, w)
    assert st0 == GpuIdleStreak(NOW, NOW)  # counted from the first cycle that saw it
    st1 = track_gpu_idle(st0, gpu(), NOW + 10 * M, w)
    assert st1 == GpuIdleStreak(NOW, NOW + 10 * M)  # within one window: continuous
    # unknown (Prometheus down, too few samples) neither ends nor extends it...
    st2 = track_gpu_idle(st1, gpu("unknown"), NOW + 15 * M, w)
    assert st2 == st1
    assert track_gpu_idle(st1, None, NOW + 15 * M, w) is None  # no GPU view at all
    # ...but a gap longer than the window that no idle answer covers starts over
    st3 = track_gpu_idle(st2, gpu(), NOW + 21 * M, w)
    assert st3 == GpuIdleStreak(NOW + 21 * M, NOW + 21 * M)
    assert track_gpu_idle(st2, gpu(), NOW + 20 * M, w) == GpuIdleStreak(NOW, NOW + 20 * M)


def test_kernels_are_asked_once_the_limit_is_reached_to_name_the_claims():
    s = server("full", idle=1 * M)
    busy_memo = kernel_memo(kv(kernel("busy")), NOW, P, s.offering)
    assert not plan_kernel_view(s, gpu(), P, NOW, memo=busy_memo, gpu_idle_since=NOW - 3 * H).kernels
    ask = plan_kernel_view(s, gpu(), P, NOW, memo=busy_memo, gpu_idle_since=NOW - 4 * H)
    assert ask.kernels and ask.status
    assert not plan_kernel_view(s, gpu("active"), P, NOW, gpu_idle_since=NOW - 9 * H).kernels


# -- properties -------------------------------------------------------------------------
kinds = st.sampled_from(["full", "mig", "shared", "vgpu", "custom", "cpu", "plain"])
states = st.sampled_from(["idle", "busy", "starting", "dead", "restarting"])
kernel_st = st.builds(
    kernel,
    state=states,
    idle=st.timedeltas(min_value=timedelta(0), max_value=10 * H),
    kid=st.uuids().map(str),
    connections=st.integers(0, 2),
)
views = st.one_of(
    st.none(),
    st.just(KernelView(ok=False, error="down")),
    st.lists(kernel_st, max_size=3).map(lambda ks: kv(*ks)),
)
gpus = st.one_of(
    st.none(),
    st.builds(
        gpu,
        state=st.sampled_from(["idle", "active", "unknown"]),
        memory=st.one_of(st.none(), st.floats(0, 80000)),
    ),
)


@settings(max_examples=400, deadline=None)
@given(
    kind=kinds,
    idle=st.timedeltas(min_value=timedelta(0), max_value=20 * H),
    kernels=views,
    g=gpus,
    max_age=st.sampled_from([0, 3600, 36000]),
    idle_since=st.one_of(st.none(), st.timedeltas(min_value=timedelta(0), max_value=20 * H)),
    limit=st.sampled_from([0, 3600, 4 * 3600]),
)
def test_never_stops_a_busy_or_gpu_active_or_unknown_gpu_server(kind, idle, kernels, g, max_age, idle_since, limit):
    s = server(kind, idle=idle)
    policy = Policy(max_age=max_age, gpu_idle_limit=limit)
    since = NOW - idle_since if idle_since is not None else None
    d = decide(s, kernels, g if s.offering.is_gpu else None, policy, NOW, gpu_idle_since=since)
    busy = kernels is not None and kernels.ok and any(k.busy for k in kernels.kernels)
    if d.action == STOP:
        if s.offering.is_gpu:  # whatever the pod says, never without a known-idle GPU
            assert g is not None and g.idle
        if busy:  # only the GPU's telemetry outweighs a busy kernel, past its bound
            assert d.stop_reason == GPU_IDLE_LIMIT and s.offering.is_gpu
            assert idle_since >= timedelta(seconds=policy.gpu_idle_limit_for(s.offering)) > (timedelta(0))
    if d.action == RECLAIM:
        ids = {a.kernel_id for a in d.shutdown}
        assert all(not k.busy for k in kernels.kernels if k.id in ids)
        assert g is not None and g.memory_mib is not None and g.memory_mib >= P.memory_held_mib
        assert g.idle
    assert d.summary()  # every decision says why


# -- deferring kernel views (memo) ---------------------------------------------------


def test_memo_defers_asking_until_an_action_could_be_due():
    s = server("shared", idle=3 * H)  # hub-idle, but within the 2 h? no: past it
    fresh = kv(kernel("idle", idle=1 * M), status_idle=1 * M)
    memo = kernel_memo(fresh, NOW, P, s.offering)
    assert memo.earliest_reclaim == NOW - 1 * M + 30 * M
    assert memo.earliest_stop == NOW - 1 * M + 2 * H
    later = NOW + 10 * M
    assert not plan_kernel_view(s, gpu(), P, later, memo=memo).kernels
    due = NOW + 30 * M
    ask = plan_kernel_view(s, gpu(), P, due, memo=memo)
    assert ask.kernels and not ask.status  # a reclaim is possible, a stop not yet
    ask = plan_kernel_view(s, gpu(), P, NOW + 2 * H, memo=memo)
    assert ask.kernels and ask.status


def test_memo_of_a_busy_kernel_defers_the_stop_from_when_it_was_seen_busy():
    s = server("full", idle=5 * H)
    busy = kv(kernel("busy", idle=4 * H))
    memo = kernel_memo(busy, NOW, P, s.offering)
    assert memo.earliest_stop == NOW + 30 * M
    assert not plan_kernel_view(s, gpu(), P, NOW + 29 * M, memo=memo).kernels
    assert plan_kernel_view(s, gpu(), P, NOW + 30 * M, memo=memo).kernels


def test_no_memo_from_a_failed_view_and_none_for_max_age():
    s = server("full", idle=5 * H, started=NOW - 20 * H)
    assert kernel_memo(KernelView(ok=False, error="x"), NOW, P, s.offering) is None
    memo = kernel_memo(kv(kernel("busy")), NOW, P, s.offering)
    aged = Policy(max_age=10 * 3600)
    assert plan_kernel_view(s, gpu(), aged, NOW + 1 * M, memo=memo).kernels


later_kernel = st.tuples(states, st.timedeltas(min_value=timedelta(0), max_value=3 * H))


@settings(max_examples=400, deadline=None)
@given(
    kind=st.sampled_from(["full", "mig", "shared", "custom", "cpu"]),
    before=st.lists(later_kernel, max_size=3),
    after=st.lists(later_kernel, max_size=3),
    new=st.lists(later_kernel, max_size=2),
    status=st.one_of(st.none(), st.timedeltas(min_value=timedelta(0), max_value=5 * H)),
    wait=st.timedeltas(min_value=timedelta(0), max_value=5 * H),
    hub_idle=st.timedeltas(min_value=timedelta(0), max_value=20 * H),
)
def test_a_deferred_view_never_hides_an_action(kind, before, after, new, status, wait, hub_idle):
    """Whatever happened between two cycles -- as long as activity only moved
    forward -- if the memo says "do not ask", asking would not have led to a stop
    or a reclaim."""
    t0 = NOW
    old = [KernelInfo(f"k{i}", "python3", st_, t0 - age, 0) for i, (st_, age) in enumerate(before)]
    first = KernelView(True, tuple(old), t0 - status if status is not None else None)
    s0 = server(kind, idle=hub_idle)
    memo = kernel_memo(first, t0, P, s0.offering)
    now = t0 + wait
    # the later truth: each old kernel's activity moved forward (a busy one, past t0)
    moved = []
    for k, (st_, age) in zip(old, (after + [("idle", timedelta(0))] * len(old))[: len(old)], strict=True):
        floor = t0 if k.busy else (k.last_activity or t0)
        last = max(floor, min(now, now - age))
        moved.append(KernelInfo(k.id, k.name, st_, last, 0))
    fresh_new = [KernelInfo(f"n{i}", "python3", st_, max(t0, now - age), 0) for i, (st_, age) in enumerate(new)]
    status_now = first.server_last_activity
    truth = KernelView(True, tuple(moved + fresh_new), status_now)
    s = server(kind, idle=hub_idle + wait)  # the hub saw nothing new meanwhile
    g = gpu() if s.offering.is_gpu else None
    ask = plan_kernel_view(s, g, P, now, memo=memo)
    without_memo = plan_kernel_view(s, g, P, now)
    event("deferred by the memo" if without_memo.kernels and not ask.kernels else "not deferred")
    if not ask.kernels:
        d = decide(s, truth, g, P, now)
        assert d.action not in (STOP, RECLAIM), (memo, d.summary())


# -- issue #25: the GPU lease, stalling pods, the cap on kernel shutdowns -------------
def test_the_gpu_lease_stops_whatever_the_server_does_and_only_gpu_kinds():
    busy = kv(kernel("busy", idle=0 * M), status_idle=0 * M)
    young = server("full", idle=0 * M, started=NOW - 23 * H)
    assert decide(young, busy, gpu("active"), P, NOW).action == KEEP
    old = server("full", idle=0 * M, started=NOW - 24 * H)
    for view in (gpu("active"), gpu("unknown"), None):  # GPU use, an unknown view: no veto
        d = decide(old, busy, view, P, NOW)
        assert d.action == STOP and d.stop_reason == "gpu_lease", d.summary()
    assert decide(server("plain", idle=0 * M, started=NOW - 48 * H), busy, None, P, NOW).action == KEEP
    off = Policy(gpu_leases={"full": 0})
    assert decide(old, busy, gpu("active"), off, NOW).action == KEEP
    # the admin's own "never stop these" still holds
    assert decide(old, busy, gpu("active"), Policy(stop_kinds=frozenset({"mig"})), NOW).action == KEEP
    # its kernels are read ahead of it, to warn
    assert plan_kernel_view(server("full", idle=0 * M, started=NOW - 24 * H + 5 * M), gpu("active"), P, NOW, horizon_s=600).kernels


def test_a_stalling_pod_is_judged_by_its_gpu_telemetry_only_after_repeated_stalls():
    from gpuspawner.culler.decide import decide_unresponsive

    s = server("full", idle=0 * M)
    since = NOW - 2 * H
    assert decide_unresponsive(s, gpu(), P, NOW, since, stalls=2).action == HELD_BACK
    d = decide_unresponsive(s, gpu(), P, NOW, since, stalls=3)
    assert d.action == STOP and d.stop_reason == "unresponsive"
    assert decide_unresponsive(s, gpu(), P, NOW, NOW - 10 * M, stalls=3).action == HELD_BACK  # idle < timeout
    assert decide_unresponsive(s, gpu("active"), P, NOW, None, stalls=9).action == KEEP
    assert decide_unresponsive(s, gpu("unknown"), P, NOW, since, stalls=9).action == HELD_BACK
    assert decide_unresponsive(server("plain"), None, P, NOW, None, stalls=9).action == HELD_BACK


def test_kernel_shutdowns_per_cycle_are_capped():
    many = kv(*(kernel(kid=f"k{i}") for i in range(50)))
    d = decide(server("shared", idle=0 * M), many, gpu(), P, NOW)
    assert d.action == RECLAIM and len(d.shutdown) == 20
    assert "30 more idle kernel(s) wait for later cycles" in d.summary()
    assert len(decide(server("shared", idle=0 * M), many, gpu(), Policy(kernel_shutdowns_per_cycle=0), NOW).shutdown) == 50
