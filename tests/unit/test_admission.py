"""Admission decisions and quotas (pure)."""

from __future__ import annotations

import pytest

from gpuspawner.capacity.admission import (
    ADMIT,
    QUEUE,
    REFUSE,
    WARN,
    Held,
    Quotas,
    admit,
    alternatives,
    check_quota,
    units_held,
    validate_quota,
)
from gpuspawner.core.model import CPU_OFFERING, UNCOUNTED, Availability
from gpuspawner.offerings.config import offering_from_config
from tests.offerings import H100 as H100_CONFIG
from tests.offerings import MIG_1G, MIG_3G, T4_SHARE, offering

MIG3 = offering(MIG_3G, 0)
MIG1 = offering(MIG_1G, 1)
T4 = offering(T4_SHARE, 2)
H100 = offering(H100_CONFIG, 3)
POOL = offering_from_config({"slug": "pool", "kind": "full", "display_name": "L4 pool", "scalable_nodes": 4, "scale_up_minutes": 6}, 4)
NONE_FREE = Availability(capacity=2, allocated=2, free=0, largest_free=0)
OTHERS = [(MIG1, Availability(2, 0, 2, 1)), (T4, Availability(4, 1, 3, 3)), (CPU_OFFERING, UNCOUNTED)]


def test_free_units_admit_and_cpu_is_never_counted():
    assert admit(MIG3, 1, Availability(1, 0, 1, 1), "block").action == ADMIT
    assert admit(CPU_OFFERING, 1, UNCOUNTED, "block").action == ADMIT


def test_block_refuses_with_what_is_free_instead():
    decision = admit(MIG3, 1, NONE_FREE, "block", OTHERS)
    assert decision == admit(MIG3, 1, NONE_FREE, "block", OTHERS)
    assert decision.action == REFUSE
    assert decision.message == "No MIG 3g.20gb is free (0 of 2 free). Free now: MIG 1g.5gb (2), T4 1/4 share (3)."


def test_counts_must_fit_on_one_node():
    split = Availability(capacity=16, allocated=10, free=6, largest_free=3)  # 3 + 3 on two nodes
    assert admit(H100, 2, split, "block").action == ADMIT
    decision = admit(H100, 4, split, "block")
    assert decision.action == REFUSE and decision.message.startswith("No 4 x H100 on one node is free (6 of 16 free).")


def test_policy_of_the_offering_wins_over_the_default():
    queued = offering_from_config({"slug": "q", "kind": "mig", "profile": "3g.20gb", "admission": "queue"}, 0)
    assert admit(queued, 1, NONE_FREE, "block").action == QUEUE
    assert admit(MIG3, 1, NONE_FREE, "warn").action == WARN
    assert admit(MIG3, 1, NONE_FREE, "queue").action == QUEUE


def test_autoscaled_pool_is_never_refused_and_says_how_long():
    decision = admit(POOL, 1, Availability(0, 0, 0, 0), "block")
    assert decision.action == WARN
    assert "a new node starts for you" in decision.message and "about 6 minutes" in decision.message


def test_alternatives_skip_the_offering_itself_cpu_and_hidden_ones():
    hidden = offering_from_config({"slug": "h", "kind": "mig", "profile": "2g.10gb", "hidden": True}, 0)
    assert (
        alternatives([*OTHERS, (hidden, Availability(1, 0, 1, 1)), (MIG3, Availability(1, 0, 1, 1))], "mig3")
        == "MIG 1g.5gb (2), T4 1/4 share (3)"
    )


def test_units_held():
    assert units_held(H100, {"nvidia.com/gpu": 4}) == 4
    assert units_held(MIG1, {"nvidia.com/mig-1g.5gb": 1}) == 1
    assert units_held(CPU_OFFERING, {}) == 0


def test_user_quota_total_and_per_kind():
    quotas = Quotas(user={"total": 3, "full": 2})
    held = [Held("full", 2)]
    assert check_quota(MIG1, 1, quotas, held, {}).action == ADMIT
    over_kind = check_quota(H100, 1, quotas, held, {})
    assert over_kind.action == REFUSE
    assert over_kind.message.startswith("Over your quota: you may hold 2 Whole GPU units at once and already hold 2.")
    over_total = check_quota(MIG1, 2, quotas, held, {})
    assert "3 GPUs of any kind" in over_total.message
    assert check_quota(CPU_OFFERING, 1, Quotas(user={"total": 0}), held, {}).action == ADMIT


def test_group_quota_counts_all_members_together():
    quotas = Quotas(groups={"students": {"total": 4, "full": 0}})
    members = {"students": [Held("mig", 1), Held("shared", 1), Held("shared", 1)]}
    assert check_quota(T4, 1, quotas, [], members).action == ADMIT
    refusal = check_quota(T4, 2, quotas, [], members)
    assert refusal.action == REFUSE and "group 'students'" in refusal.message and "already hold 3" in refusal.message
    assert check_quota(H100, 1, quotas, [], {"students": []}).action == REFUSE  # full: 0 for students
    assert check_quota(H100, 1, quotas, [], {"researchers": []}).action == ADMIT  # no quota for that group


@pytest.mark.parametrize(
    "value, problem",
    [
        ({"gpus": 2}, "unknown key 'gpus'"),
        ({"total": -1}, "must be a whole number >= 0"),
        ({"total": True}, "must be a whole number >= 0"),
        ([("total", 2)], "must be a dict"),
    ],
)
def test_quota_config_errors_name_the_setting(value, problem):
    with pytest.raises(ValueError, match=problem) as info:
        validate_quota(value, "c.GPUSpawner.user_quota")
    assert "c.GPUSpawner.user_quota" in str(info.value)
