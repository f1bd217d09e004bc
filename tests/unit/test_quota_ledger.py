"""Quotas under concurrency (pure): the ledger grants exactly the quota under any interleaving
of spawns that are admitted, bound, stopped, fail or lose their pod behind the hub's back, for
users and groups alike."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from gpuspawner.capacity.admission import ADMIT, REFUSE, Held, QuotaLedger, QuotaRequest, Quotas
from gpuspawner.core.model import CPU_OFFERING
from tests.offerings import H100 as H100_CONFIG
from tests.offerings import MIG_1G, T4_SHARE, offering

T4 = offering(T4_SHARE, 0)
MIG1 = offering(MIG_1G, 1)
H100 = offering(H100_CONFIG, 2, counts=[1, 2, 4])  # at most 4: the quotas below are 2 or 3 whole GPUs
OFFERINGS = [T4, MIG1, H100]

USER_LIMITS = {"total": 3, "full": 2}
GROUP_LIMITS = {"total": 5}
GROUPS = {"students": ["ann", "bob", "cy"], "staff": ["cy", "dee"]}
USERS = ["ann", "bob", "cy", "dee"]
QUOTAS = Quotas(user=USER_LIMITS, groups={g: GROUP_LIMITS for g in GROUPS})


def members_of(user: str) -> dict[str, list[str]]:
    return {g: names for g, names in GROUPS.items() if user in names}


def test_a_grant_counts_before_the_pod_is_bound():
    ledger = QuotaLedger()
    quotas = Quotas(user={"total": 2})
    granted = [ledger.grant(QuotaRequest(f"ns/p{i}", T4, 1, "ann", quotas, {}, {})).action for i in range(20)]
    assert granted.count(ADMIT) == 2 and granted.count(REFUSE) == 18
    assert (
        "Over your quota: you may hold 2 GPUs of any kind at once and already hold 2."
        in ledger.grant(QuotaRequest("ns/p99", T4, 1, "ann", quotas, {}, {})).message
    )


def test_bound_pods_and_grants_of_one_server_count_once():
    ledger = QuotaLedger()
    quotas = Quotas(user={"total": 2})
    assert ledger.grant(QuotaRequest("ns/a", H100, 2, "ann", quotas, {}, {})).action == ADMIT
    bound = {"ns/a": Held("full", 2, "ann")}  # the same server, now bound: not 4 units
    assert ledger.check(QuotaRequest("ns/b", T4, 1, "ann", quotas, {}, bound)).action == REFUSE
    ledger.release("ns/a")
    assert ledger.check(QuotaRequest("ns/b", T4, 1, "ann", quotas, {}, bound)).action == REFUSE  # still bound
    assert ledger.check(QuotaRequest("ns/b", T4, 1, "ann", quotas, {}, {})).action == ADMIT  # stopped: free again
    # A re-spawn of the same server does not count its own old pod.
    assert ledger.check(QuotaRequest("ns/a", H100, 2, "ann", quotas, {}, bound)).action == ADMIT


def test_group_quota_counts_every_members_grants():
    ledger = QuotaLedger()
    quotas = Quotas(user={"total": 10}, groups={"students": {"total": 6}})
    students = {"students": ["ann", "bob"]}
    results = [ledger.grant(QuotaRequest(f"ns/{u}{i}", MIG1, 1, u, quotas, students, {})).action for i in range(10) for u in ("ann", "bob")]
    assert results.count(ADMIT) == 6
    refusal = ledger.check(QuotaRequest("ns/x", MIG1, 1, "ann", quotas, students, {}))
    assert refusal.action == REFUSE and "group 'students'" in refusal.message


def test_cpu_and_refusals_are_never_recorded():
    ledger = QuotaLedger()
    assert ledger.grant(QuotaRequest("ns/c", CPU_OFFERING, 1, "ann", Quotas(user={"total": 0}), {}, {})).action == ADMIT
    assert ledger.grant(QuotaRequest("ns/g", T4, 1, "ann", Quotas(user={"total": 0}), {}, {})).action == REFUSE
    assert ledger.grants == {}


class Interleavings(RuleBasedStateMachine):
    """Spawns of several users in several groups, each admitted, bound, stopped or failed in
    any order. The ledger must never grant past a quota, and never refuse within one."""

    servers = Bundle("servers")

    def __init__(self) -> None:
        super().__init__()
        self.ledger = QuotaLedger()
        self.bound: dict[str, Held] = {}  # what the inventory shows bound
        self.alive: dict[str, Held] = {}  # the model: every server that holds or will hold units
        self.serial = 0

    def _units(self, user: str, groups: dict[str, list[str]]) -> tuple[int, dict[str, int]]:
        mine = sum(h.units for h in self.alive.values() if h.user == user)
        return mine, {g: sum(h.units for h in self.alive.values() if h.user in names) for g, names in groups.items()}

    @rule(target=servers, user=st.sampled_from(USERS), offering=st.sampled_from(OFFERINGS), data=st.data())
    def spawn(self, user, offering, data):
        count = data.draw(st.sampled_from(offering.counts))
        self.serial += 1
        key = f"jhub/pod-{self.serial}"
        groups = members_of(user)
        mine, by_group = self._units(user, groups)
        full = sum(h.units for h in self.alive.values() if h.user == user and h.kind == "full")
        fits = mine + count <= USER_LIMITS["total"] and all(n + count <= GROUP_LIMITS["total"] for n in by_group.values())
        if offering.kind.value == "full":
            fits = fits and full + count <= USER_LIMITS["full"]
        decision = self.ledger.grant(QuotaRequest(key, offering, count, user, QUOTAS, groups, self.bound))
        assert (decision.action == ADMIT) == fits, (decision, mine, by_group, count)
        if fits:
            self.alive[key] = Held(offering.kind.value, count, user)
            return key
        return None

    @rule(key=servers)
    def bind(self, key):
        if key in self.alive:
            self.bound[key] = self.alive[key]
            self.ledger.pod_event(key, True)  # the index's watch sees it bound

    @rule(key=consumes(servers))
    def vanish(self, key):
        """The pod is deleted behind the hub's back (evicted, its node gone): no stop, only the watch's event."""
        if key is None or key not in self.bound:
            return
        self.bound.pop(key)
        self.alive.pop(key)
        self.ledger.pod_event(key, False)

    @rule(key=consumes(servers))
    def stop_or_fail(self, key):
        if key is None:
            return
        self.ledger.release(key)
        self.alive.pop(key, None)
        self.bound.pop(key, None)

    @rule(key=servers)
    def hub_restart_forgets_grants(self, key):
        """After a hub restart only bound pods are known: unbound spawns are gone with the hub."""
        if key is not None and key in self.alive and key not in self.bound:
            return  # keep the model simple: restarts are drawn only when everything is bound
        if all(k in self.bound for k in self.alive):
            self.ledger = QuotaLedger()

    @invariant()
    def never_over_a_quota(self):
        held = self.ledger.holdings(self.bound)
        assert set(held) == set(self.alive)
        for user in USERS:
            assert sum(h.units for h in held.values() if h.user == user) <= USER_LIMITS["total"]
            assert sum(h.units for h in held.values() if h.user == user and h.kind == "full") <= USER_LIMITS["full"]
        for names in GROUPS.values():
            assert sum(h.units for h in held.values() if h.user in names) <= GROUP_LIMITS["total"]


Interleavings.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=40,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestInterleavings = Interleavings.TestCase
