"""GPU-memory shares and device taints in the DRA counts (gpuspawner.dra.capacity, shares), on the
simulated driver's slices in NVIDIA's ConsumableShares shape; the counts against the real
scheduler are make dra-truth's (gpuspawner.devcluster.dratruth_shares)."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

import pytest

from gpuspawner.core.wording import memory_truth
from gpuspawner.devcluster import dradriver as d
from gpuspawner.dra import capacity as cap
from gpuspawner.dra.claimspec import device_claim_spec
from gpuspawner.dra.devices import DraState
from gpuspawner.names import dranames as dn
from gpuspawner.names.vocabulary import Kind
from gpuspawner.offerings.config import offering_from_config
from gpuspawner.offerings.entry import OfferingConfigError
from gpuspawner.pod.memguard import GuardDefaults, guard_for

L40S = d.SHARE_NODES[0]
GIB = 1024**3


def state(*nodes: d.DraNode, claims=()) -> DraState:
    dra = DraState()
    slices = [s for n in nodes for s in d.resource_slices(n.name, d.node_devices(n))]
    dra.replace(slices=slices, classes=d.device_classes(), claims=list(claims))
    dra.synced = True
    return dra


def share_claim(name: str, node: str, device: str, memory: str) -> dict:
    result = {
        "request": "gpu",
        "driver": dn.DRIVER,
        "pool": node,
        "device": device,
        "shareID": f"uid-{name}",
        "consumedCapacity": {"memory": memory},
    }
    return {
        "metadata": {"namespace": "ns", "name": name},
        "spec": {"devices": {"requests": []}},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def test_the_driver_publishes_consumable_shares_in_nvidias_shape():
    device = d.node_devices(L40S)[0]
    assert device["allowMultipleAllocations"] is True
    assert device["capacity"]["memory"] == {
        "value": "46068Mi",
        "requestPolicy": {"default": "46068Mi", "validRange": {"min": "1Mi", "max": "46068Mi", "step": "1Mi"}},
    }
    four = d.consumable_shares(d.gpu_device("n", 0, d.L40S), "4")
    assert four["capacity"]["memory"]["requestPolicy"]["default"] == "0"
    assert four["capacity"]["shares"] == {
        "value": "4",
        "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "4", "step": "1"}},
    }


def test_shares_are_offered_by_amount_and_not_as_whole_gpus():
    offerings = {o.slug: o for o in state(L40S).discovered()}
    assert set(offerings) == {"dra-share-l40s-4gb", "dra-share-l40s-8gb", "dra-share-l40s-16gb"}
    eight = offerings["dra-share-l40s-8gb"]
    assert eight.kind is Kind.SHARED and eight.sharing == "memory" and eight.memory_mib == 8192 and eight.device_memory_mib == 46068
    assert eight.display_name == "8 GB of an L40S"
    exactly = device_claim_spec(eight.claim, 1)["devices"]["requests"][0]["exactly"]
    assert exactly["capacity"] == {"requests": {"memory": "8Gi"}}
    assert "not enforced" in memory_truth(eight.kind, eight.memory_mib, eight.sharing, eight.replicas, "L40S")


def test_free_shares_come_from_what_the_allocated_claims_consumed():
    eight = next(o for o in state(L40S).discovered() if o.slug == "dra-share-l40s-8gb")
    # 46068 MiB holds five 8 GiB shares per GPU (5 * 8192 = 40960); two GPUs hold ten.
    assert state(L40S).availability(eight).free == 10
    taken = [share_claim("a", L40S.name, "gpu-0", "20Gi"), share_claim("b", L40S.name, "gpu-1", "1Mi")]
    # gpu-0: 46068 - 20480 = 25588 MiB, three 8 GiB; gpu-1: 46067 MiB, five.
    avail = state(L40S, claims=taken).availability(eight)
    assert (avail.free, avail.capacity, avail.largest_free) == (8, 10, 1)


def test_rounding_follows_the_request_policy():
    memory = {"value": "10Gi", "requestPolicy": {"default": "10Gi", "validRange": {"min": "1Gi", "max": "10Gi", "step": "3Gi"}}}
    # 2Gi is rounded up to min + n*step = 4Gi: two fit in 10Gi; 11Gi passes max: none.
    assert cap.consumption({"memory": "2Gi"}, {"memory": memory}) == {"memory": Fraction(4 * GIB)}
    assert cap.fits({"memory": memory}, {}, {"memory": "2Gi"}) == 2
    assert cap.fits({"memory": memory}, {}, {"memory": "11Gi"}) == 0
    values = {"value": "8", "requestPolicy": {"default": "1", "validValues": ["1", "2", "4"]}}
    assert cap.consumption({"n": "3"}, {"n": values}) == {"n": Fraction(4)}
    assert cap.consumption({"n": "5"}, {"n": values}) is None
    # Unrequested capacities consume their default, else all of them; a request the device lacks rules it out.
    assert cap.consumption(None, {"memory": memory, "sm": {"value": "100"}}) == {"memory": Fraction(10 * GIB), "sm": Fraction(100)}
    assert cap.consumption({"shares": "1"}, {"memory": memory}) is None
    unlimited = {"value": "8Gi", "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": "8Gi", "step": "1Mi"}}}
    assert cap.fits({"memory": unlimited}, {}, None) is None  # no end: such an offering has no count


def test_a_tainted_device_is_free_only_to_a_claim_that_tolerates_it():
    taint = {"key": "gpu.nvidia.com/maintenance", "value": "planned", "effect": "NoSchedule"}
    tainted = replace(L40S, taints={"gpu-0": (taint,)})
    eight = next(o for o in state(tainted).discovered() if o.slug == "dra-share-l40s-8gb")
    assert state(tainted).availability(eight).free == 5
    tolerant = replace(eight, claim=replace(eight.claim, tolerations=({"key": "gpu.nvidia.com/maintenance", "operator": "Exists"},)))
    assert state(tainted).availability(tolerant).free == 10
    assert device_claim_spec(tolerant.claim, 1)["devices"]["requests"][0]["exactly"]["tolerations"] == [
        {"key": "gpu.nvidia.com/maintenance", "operator": "Exists"}
    ]
    # A None effect is informational; the wrong value is not tolerated by Equal.
    assert not cap.blocked([{**taint, "effect": "None"}], [])
    assert cap.blocked([taint], [{"key": taint["key"], "value": "other"}])
    assert not cap.blocked([taint], [{"operator": "Exists"}])
    # NoExecute: the allocator takes any matching toleration, the eviction controller only one that names NoExecute.
    evicting = {**taint, "effect": "NoExecute"}
    assert cap.blocked([evicting], [{"operator": "Exists"}])
    assert cap.blocked([evicting], [{"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60}])
    assert not cap.blocked([evicting], [{"operator": "Exists", "effect": "NoExecute"}])
    # A claim whose toleration has no effect may be given a NoExecute-tainted device and evicted from it: no count.
    noexecute = replace(L40S, taints={"gpu-0": (evicting,)})
    trapped = replace(eight, claim=replace(eight.claim, tolerations=({"key": taint["key"], "operator": "Exists"},)))
    assert cap.trap([evicting], trapped.claim.tolerations) and not state(noexecute).availability(trapped).counted
    assert state(noexecute).availability(eight).free == 5
    h100 = replace(d.DRA_NODES[0], taints={"gpu-1": ({"key": "k", "effect": "NoExecute"},)})
    whole = next(o for o in state(h100).discovered() if o.kind is Kind.FULL)
    avail = state(h100).availability(whole)
    assert (avail.free, avail.largest_free) == (1, 1)


def test_a_share_reservation_consumes_its_amount_until_the_claim_is_allocated():
    dra = state(L40S)
    sixteen = next(o for o in dra.discovered() if o.slug == "dra-share-l40s-16gb")
    assert dra.availability(sixteen).free == 4  # two per GPU
    assert dra.reserve("ns/p1", sixteen, 1) == L40S.name
    assert dra.availability(sixteen).free == 3
    dra.release("ns/p1")
    assert dra.availability(sixteen).free == 4


def test_admin_memory_shares_and_device_tolerations():
    offering = offering_from_config(
        {
            "slug": "l40s-8",
            "kind": "shared",
            "product": "NVIDIA L40S",
            "dra": {"memory": "8Gi", "tolerations": [{"key": "k", "operator": "Exists"}]},
        },
        0,
    )
    assert offering.sharing == "memory" and offering.memory_mib == 8192 and offering.claim.capacity == {"memory": "8Gi"}
    # One per effect: without one, a NoExecute-tainted device would be allocated and the pod evicted.
    assert offering.claim.tolerations == (
        {"key": "k", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "k", "operator": "Exists", "effect": "NoExecute"},
    )
    for bad, words in [
        ({"kind": "full", "dra": {"memory": "8Gi"}}, "needs kind 'shared'"),
        ({"kind": "shared", "replicas": 2, "dra": {"memory": "8Gi"}}, "neither replicas nor sharing"),
        ({"kind": "shared", "dra": {"memory": "1.5"}}, "whole MiB"),
        ({"kind": "full", "dra": {"tolerations": [{"value": "x"}]}}, "device tolerations"),
        ({"kind": "full", "dra": {"tolerations": [{"key": "k", "effect": "PreferNoSchedule"}]}}, "device tolerations"),
    ]:
        with pytest.raises(OfferingConfigError, match=words):
            offering_from_config({"slug": "x", **bad}, 0)


def test_the_memory_guard_is_sized_from_the_share():
    eight = next(o for o in state(L40S).discovered() if o.slug == "dra-share-l40s-8gb")
    guard = guard_for(eight, GuardDefaults.from_settings(["shared"], False))
    # 8192 MiB for two processes: 4096 each, less 512 for the CUDA context: a cap of 3584 MiB of 46068.
    assert guard is not None and guard.process_mib == 4096 and guard.cap_mib == 3584 and guard.gpu_mib == 46068
    assert guard.fraction == 0.077  # cut, never rounded up: 3584 / 46068 = 0.0778


def test_the_device_taint_evictions_condition_gives_the_home_pages_words():
    from gpuspawner.hub.kueue import ended_by_kueue, home_notice

    condition = {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "DeletionByDeviceTaintManager",
        "message": "Device Taint manager: deleting due to NoExecute taint",
        "lastTransitionTime": "2026-11-27T14:02:00Z",
    }
    pod = {"status": {"conditions": [condition]}}
    assert ended_by_kueue(pod) == condition
    # A DisruptionTarget of another cause (a node's taint manager, a preemption) is not this one.
    assert ended_by_kueue({"status": {"conditions": [{**condition, "reason": "DeletionByTaintManager"}]}}) is None
    text = home_notice((condition, ""), "train")["text"]
    assert text.startswith("Your server 'train' was stopped at ")
    assert "its GPU was taken out of service: the device has a NoExecute taint its claim does not tolerate" in text
