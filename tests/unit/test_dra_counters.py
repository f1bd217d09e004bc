"""Dynamic MIG: the simulated driver's partitionable devices in NVIDIA's shape, and free counts per
MIG profile as kube-scheduler's allocator spends counter sets (gpuspawner.dra.counters)."""

from __future__ import annotations

import copy

from gpuspawner.devcluster import dradriver as d
from gpuspawner.dra import counters
from gpuspawner.dra.devices import DraState
from gpuspawner.dra.discover import DYNAMIC_MIG_WORDS
from gpuspawner.names import dranames as dn

NODE = d.DraNode("dynmig", d.A100_40GB, 2, dynamic_mig=True)


def dynamic_slices(node: d.DraNode = NODE, generation: int = 1) -> list[dict]:
    return d.resource_slices(node.name, d.node_devices(node), generation, node.gpus, d.node_counter_sets(node))


def state(slices: list[dict], *taken: str, pool: str = NODE.name) -> DraState:
    dra = DraState()
    claims = [
        {
            "metadata": {"namespace": "ns", "name": f"c{i}"},
            "status": {"allocation": {"devices": {"results": [{"driver": dn.DRIVER, "pool": pool, "device": dev}]}}},
        }
        for i, dev in enumerate(taken)
    ]
    dra.replace(slices=slices, classes=d.device_classes(), claims=claims)
    dra.synced = True
    return dra


def free(dra: DraState) -> dict[str, int | None]:
    """Free units per MIG profile."""
    return {o.display_name.rsplit("MIG ", 1)[1]: dra.availability(o).free for o in dra.discovered() if "MIG " in o.display_name}


def test_the_driver_publishes_counter_sets_apart_and_one_device_slice_per_gpu():
    slices = dynamic_slices()
    assert [("sharedCounters" in s["spec"], len(s["spec"].get("devices") or [])) for s in slices] == [(True, 0), (False, 25), (False, 25)]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {3}
    sets = slices[0]["spec"]["sharedCounters"]
    assert [s["name"] for s in sets] == ["gpu-0-counter-set", "gpu-1-counter-set"]
    assert sets[0]["counters"]["multiprocessors"] == {"value": "98"} and sets[0]["counters"]["memory"] == {"value": "40192Mi"}
    assert sorted(c for c in sets[0]["counters"] if c.startswith("memory-slice-")) == [f"memory-slice-{i}" for i in range(8)]
    devices = {dev["name"]: dev for dev in slices[1]["spec"]["devices"]}
    assert len(devices) <= 64  # the API's limit for a slice whose devices take counters
    three = devices["gpu-0-mig-3g20gb-9-4"]
    (take,) = three["consumesCounters"]
    assert take["counterSet"] == "gpu-0-counter-set"
    assert {c for c in take["counters"] if c.startswith("memory-slice-")} == {
        "memory-slice-4",
        "memory-slice-5",
        "memory-slice-6",
        "memory-slice-7",
    }
    assert take["counters"]["multiprocessors"] == {"value": "42"} and three["capacity"]["multiprocessors"] == {"value": "42"}
    assert three["attributes"][dn.ATTR_PROFILE] == {"string": "3g.20gb"} and dn.ATTR_UUID not in three["attributes"]
    assert "gpu-0-mig-1g5gb-me-20-6" in devices and "gpu-0" not in devices  # an A100 in MIG mode: partitions only
    assert sum(1 for name in devices if "-2g10gb-" in name) == 3


def test_an_empty_gpu_has_room_for_each_profile_as_nvidias_table_says():
    dra = state(dynamic_slices())
    assert all(o.description.endswith(DYNAMIC_MIG_WORDS) and o.memory_mib for o in dra.discovered())
    assert free(dra) == {"1g.5gb": 14, "1g.5gb+me": 2, "1g.10gb": 8, "2g.10gb": 6, "3g.20gb": 4, "4g.20gb": 2, "7g.40gb": 2}


def test_a_3g_20gb_taken_leaves_room_by_its_placement():
    high = free(state(dynamic_slices(d.DraNode("one", d.A100_40GB, 1, dynamic_mig=True)), "gpu-0-mig-3g20gb-9-4", pool="one"))
    assert high == {"1g.5gb": 4, "1g.5gb+me": 1, "1g.10gb": 2, "2g.10gb": 2, "3g.20gb": 1, "4g.20gb": 1, "7g.40gb": 0}
    low = free(state(dynamic_slices(d.DraNode("one", d.A100_40GB, 1, dynamic_mig=True)), "gpu-0-mig-3g20gb-9-0", pool="one"))
    # memory slices 4-7 left: no 1g.5gb placement on slice 7, no 2g.10gb at 6, no 4g.20gb but at 0
    assert low == {"1g.5gb": 3, "1g.5gb+me": 1, "1g.10gb": 2, "2g.10gb": 1, "3g.20gb": 1, "4g.20gb": 0, "7g.40gb": 0}


def test_engines_are_counted_too_one_optical_flow_engine_one_plus_me():
    one = d.DraNode("one", d.A100_40GB, 1, dynamic_mig=True)
    after = free(state(dynamic_slices(one), "gpu-0-mig-1g5gb-me-20-3", pool="one"))
    assert after["1g.5gb+me"] == 0 and after["1g.5gb"] == 6 and after["7g.40gb"] == 0


def test_a_whole_gpu_that_takes_every_counter_blocks_its_partitions_and_one_partition_blocks_it():
    """As on Hopper, where the driver offers the whole GPU beside its partitions (``PartGetDevice``)."""
    one = d.DraNode("one", d.A100_40GB, 1, dynamic_mig=True)
    slices = dynamic_slices(one)
    whole = d.gpu_device("one", 0, d.A100_40GB)
    whole["consumesCounters"] = [
        {"counterSet": "gpu-0-counter-set", "counters": copy.deepcopy(slices[0]["spec"]["sharedCounters"][0]["counters"])}
    ]
    slices[1]["spec"]["devices"].insert(0, whole)
    dra = state(slices)
    gpu = next(o for o in dra.discovered() if o.claim is not None and o.claim.device_class == dn.CLASS_GPU)
    assert dra.availability(gpu).free == 1
    taken = state(slices, "gpu-0", pool="one")
    assert set(free(taken).values()) == {0}
    part = state(slices, "gpu-0-mig-1g5gb-19-6", pool="one")
    assert part.availability(gpu).free == 0 and free(part)["1g.5gb"] == 6


def test_only_the_newest_generation_counts_and_counter_sets_follow_it():
    old = dynamic_slices(generation=1)
    new = dynamic_slices(generation=2)
    for s in new[:1]:
        for counter_set in s["spec"]["sharedCounters"]:
            counter_set["counters"]["ofa-engines"] = {"value": "0"}  # a newer generation without the +me's engine
    dra = state(old + new)
    assert free(dra)["1g.5gb+me"] == 0 and free(dra)["1g.5gb"] == 14


def test_a_reservation_holds_the_placement_the_scheduler_would_take():
    dra = state(dynamic_slices(d.DraNode("one", d.A100_40GB, 1, dynamic_mig=True)), pool="one")
    offerings = {o.display_name.rsplit("MIG ", 1)[1]: o for o in dra.discovered() if "MIG " in o.display_name}
    assert dra.reserve("ns/pod-a", offerings["3g.20gb"], 1) == "one"
    assert dra.availability(offerings["3g.20gb"]).free == 1 and dra.availability(offerings["4g.20gb"]).free == 0
    assert dra.reserve("ns/pod-b", offerings["3g.20gb"], 1) == "one"
    assert dra.reserve("ns/pod-c", offerings["1g.5gb"], 1) is None  # nothing left: refused, not reserved twice
    dra.release("ns/pod-a")  # the first-fit placement, slices 0-3; pod-b holds 4-7
    assert dra.availability(offerings["1g.5gb"]).free == 4


def test_counters_of_one_pool_do_not_leak_into_another():
    pools = counters.pool_counters(dynamic_slices() + dynamic_slices(d.DraNode("other", d.A100_40GB, 1, dynamic_mig=True)))
    assert set(pools) == {(dn.DRIVER, NODE.name), (dn.DRIVER, "other")}
    assert pools[(dn.DRIVER, "other")].invalid is None and len(pools[(dn.DRIVER, "other")].sets) == 1


def test_counter_sets_beside_the_devices_in_one_slice_count_the_same():
    """The driver's shape before Kubernetes 1.35 (``generateCombinedResourceSlices``): one slice per GPU with both."""
    one = d.DraNode("one", d.A100_40GB, 1, dynamic_mig=True)
    split = dynamic_slices(one)
    combined = copy.deepcopy(split[1])
    combined["spec"]["sharedCounters"] = split[0]["spec"]["sharedCounters"]
    combined["spec"]["pool"]["resourceSliceCount"] = 1
    taken = ("gpu-0-mig-2g10gb-14-2", "gpu-0-mig-1g5gb-19-6")
    assert free(state([combined], *taken, pool="one")) == free(state(split, *taken, pool="one"))
    assert free(state(split, *taken, pool="one"))["3g.20gb"] == 0


def test_several_mig_devices_that_must_share_a_gpu_are_counted_per_gpu_not_per_node():
    """Issue 41: one claim of two 3g.20gbs with ``matchAttribute: parentUUID`` needs both on one GPU;
    with a 3g.20gb taken on each of the node's two GPUs, two are free but no claim of two fits."""
    from dataclasses import replace

    dra = state(dynamic_slices(), "gpu-0-mig-3g20gb-9-0")
    base = next(o for o in dra.discovered() if o.display_name.endswith("MIG 3g.20gb"))
    pair = replace(base, slug="two-3g", counts=(1, 2), claim=replace(base.claim, match_attributes=(f"{dn.DRIVER}/{dn.ATTR_PARENT_UUID}",)))
    avail = dra.availability(pair)
    assert (avail.free, avail.largest_free) == (3, 2)
    dra = state(dynamic_slices(), "gpu-0-mig-3g20gb-9-0", "gpu-1-mig-3g20gb-9-0")
    avail = dra.availability(pair)
    assert (avail.free, avail.largest_free) == (2, 1)
