"""DRA discovery and counts (gpuspawner.dra.devices), on the simulated driver's real-format slices."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuspawner.capacity.index import ClusterIndex
from gpuspawner.core.cel import SelectorError, compile_selector
from gpuspawner.core.model import DeviceClaim, Offering
from gpuspawner.core.quantity import QuantityError, parse_quantity
from gpuspawner.devcluster import dradriver as d
from gpuspawner.dra.devices import DraState, unmatched
from gpuspawner.dra.slices import build_pools
from gpuspawner.names import dranames as dn
from gpuspawner.names.vocabulary import Kind
from gpuspawner.offerings.config import offering_from_config
from gpuspawner.offerings.entry import OfferingConfigError

H100, L4, A100 = d.DRA_NODES


def slices_of(*nodes: d.DraNode, generation: int = 1, slice_count: int = 1) -> list[dict]:
    return [s for n in nodes for s in d.resource_slices(n.name, d.node_devices(n), generation, slice_count)]


def state(slices=None, claims=()) -> DraState:
    dra = DraState()
    dra.replace(slices=slices if slices is not None else slices_of(*d.DRA_NODES), classes=d.device_classes(), claims=list(claims))
    dra.synced = True
    return dra


def claim(name: str, *devices: tuple[str, str], consumers: tuple[str, ...] = (), config=(), namespace: str = "ns") -> dict:
    results = [{"request": "gpu", "driver": dn.DRIVER, "pool": pool, "device": dev} for pool, dev in devices]
    status: dict = {"allocation": {"devices": {"results": results}}} if results else {}
    if consumers:
        status["reservedFor"] = [{"resource": "pods", "name": c, "uid": c} for c in consumers]
    spec = {"devices": {"requests": [], "config": [{"opaque": c} for c in config]}}
    return {"metadata": {"namespace": namespace, "name": name}, "spec": spec, "status": status}


def by_slug(dra: DraState) -> dict[str, Offering]:
    return {o.slug: o for o in dra.discovered()}


def test_discovery_groups_whole_gpus_by_product_and_mig_by_profile():
    offerings = by_slug(state())
    assert set(offerings) == {
        "dra-gpu-h100-80gb",
        "dra-gpu-l4",
        "dra-mig-a100-40gb-1g-5gb",
        "dra-mig-a100-40gb-2g-10gb",
        "dra-mig-a100-40gb-3g-20gb",
    }
    h100 = offerings["dra-gpu-h100-80gb"]
    assert h100.kind is Kind.FULL and h100.source == "dra" and not h100.resources and not h100.node_selector
    assert h100.counts == (1, 2) and h100.memory_mib == 81559 and h100.product == "NVIDIA H100 80GB HBM3"
    assert h100.claim is not None and h100.claim.device_class == "gpu.nvidia.com"
    assert h100.claim.match_attributes == ("gpu.nvidia.com/productName",)
    assert offerings["dra-gpu-l4"].counts == (1, 2, 4)
    mig = offerings["dra-mig-a100-40gb-1g-5gb"]
    assert mig.kind is Kind.MIG and mig.claim is not None and mig.claim.device_class == "mig.nvidia.com"
    assert "device.attributes['gpu.nvidia.com'].profile == '1g.5gb'" in mig.claim.selectors


def test_free_counts_subtract_every_claims_allocation_cluster_wide():
    claims = [
        claim("a", ("dra-h100", "gpu-0")),
        claim("b", ("dra-a100-mig", "gpu-0-mig-1g5gb-19-2"), namespace="other"),
        claim("pending"),  # not allocated: takes nothing
    ]
    dra = state(claims=claims)
    offerings = by_slug(dra)
    h100 = dra.availability(offerings["dra-gpu-h100-80gb"])
    assert (h100.capacity, h100.allocated, h100.free, h100.largest_free) == (2, 1, 1, 1)
    one_g = dra.availability(offerings["dra-mig-a100-40gb-1g-5gb"])
    assert (one_g.capacity, one_g.free) == (2, 1)
    assert dra.availability(offerings["dra-gpu-l4"]).free == 4
    dra.claim_event("DELETED", claims[0])
    assert dra.availability(offerings["dra-gpu-h100-80gb"]).free == 2


def test_only_the_highest_generation_of_a_pool_counts():
    old = slices_of(L4, generation=1)
    new = d.resource_slices(L4.name, d.node_devices(L4)[:2], generation=2)
    pools = build_pools(old + new)
    (pool,) = pools.values()
    assert pool.generation == 2 and [dev.name for dev in pool.devices] == ["gpu-0", "gpu-1"]
    dra = state(slices=old + new)
    assert dra.availability(by_slug(dra)["dra-gpu-l4"]).capacity == 2


def test_an_incomplete_pool_leaves_its_offerings_uncounted_not_zero():
    two_of_three = slices_of(L4, slice_count=3)[:2]
    dra = state(slices=two_of_three + slices_of(H100))
    offerings = by_slug(dra)
    assert "dra-gpu-l4" in offerings  # still named (the devices seen so far)
    l4 = dra.availability(offerings["dra-gpu-l4"])
    assert not l4.counted and l4.free is None
    assert dra.availability(offerings["dra-gpu-h100-80gb"]).free == 2  # other pools unaffected
    dra.slice_event("ADDED", slices_of(L4, slice_count=3)[2])
    assert dra.availability(offerings["dra-gpu-l4"]).free == 4


def test_device_plugin_nodes_are_never_counted_twice():
    """A node whose allocatable advertises nvidia.com/ resources is the device plugin's: its DRA devices are left out."""
    index = ClusterIndex()
    plugin_h100 = {
        "metadata": {"name": "dra-h100", "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "2"}},
        "status": {"allocatable": {"nvidia.com/gpu": "2", "cpu": "32", "memory": "256Gi", "pods": "110"}},
    }
    dra_l4 = {"metadata": {"name": "dra-l4"}, "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"}}}
    index.replace(nodes=[plugin_h100, dra_l4], pods=[])
    index.dra.replace(slices=slices_of(H100, L4), classes=d.device_classes(), claims=[])
    index.dra.synced = True
    offerings = {o.slug: o for o in index.discovered()}
    plugin = [o for o in offerings.values() if o.resources.get("nvidia.com/gpu")]
    assert len(plugin) == 1 and index.availability(plugin[0]).capacity == 2
    assert "dra-gpu-h100-80gb" not in offerings and index.availability(offerings["dra-gpu-l4"]).capacity == 4
    # The plugin goes away from that node (allocatable 0): its DRA GPUs count now, once.
    plugin_h100["status"]["allocatable"]["nvidia.com/gpu"] = "0"
    index.node_event("MODIFIED", plugin_h100)
    offerings = {o.slug: o for o in index.discovered()}
    assert index.availability(offerings["dra-gpu-h100-80gb"]).capacity == 2
    assert not [o for o in offerings.values() if o.resources.get("nvidia.com/gpu")]


def test_reservations_hold_devices_until_the_claim_is_allocated_for_the_pod():
    index = ClusterIndex()
    index.replace(nodes=[d.dra_node_manifest(H100, 0)])  # the scheduler places pods on Nodes only
    index.dra.replace(slices=slices_of(H100), classes=d.device_classes(), claims=[])
    index.dra.synced = True
    h100 = {o.slug: o for o in index.discovered()}["dra-gpu-h100-80gb"]
    assert index.reserve("ns/jupyter-ann", h100, 2) == "dra-h100"
    assert index.availability(h100).free == 0
    assert index.reserve("ns/jupyter-bob", h100, 1) is None  # nothing left: nothing held
    # The scheduler allocates the pod's claim: the reservation becomes the allocation (still 0 free, not -2).
    index.dra.claim_event("ADDED", claim("ann-gpu", ("dra-h100", "gpu-0"), ("dra-h100", "gpu-1"), consumers=("jupyter-ann",)))
    assert not index.dra.reservations and index.availability(h100).free == 0
    index.dra.claim_event("DELETED", claim("ann-gpu"))
    assert index.availability(h100).free == 2
    assert index.reserve("ns/jupyter-bob", h100, 1) == "dra-h100"
    index.release("ns/jupyter-bob")
    assert index.availability(h100).free == 2


def shared(replicas: int = 4) -> Offering:
    config = ({"driver": dn.DRIVER, "parameters": dn.sharing_config(dn.SHARING_TIME_SLICING, {"interval": "Long"})},)
    selector = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA L4'"
    return Offering(
        slug="l4-quarter",
        kind=Kind.SHARED,
        display_name="L4 quarter",
        claim=DeviceClaim("gpu.nvidia.com", (selector,), config=config, replicas=replicas),
    )


def test_a_shared_offering_counts_consumers_of_claims_with_its_config():
    offering = shared(4)
    cfg = offering.claim.config
    claims = [
        claim("share-1", ("dra-l4", "gpu-0"), consumers=("p1", "p2", "p3"), config=cfg),  # 3 of 4 used
        claim("exclusive", ("dra-l4", "gpu-1")),  # someone's whole L4: all 4 shares of it gone
    ]
    avail = state(claims=claims).availability(offering)
    assert (avail.capacity, avail.allocated, avail.free, avail.largest_free) == (16, 7, 9, 1)


def test_unknown_until_the_dra_streams_are_listed_and_without_the_class_nothing_matches():
    dra = state()
    offering = by_slug(dra)["dra-gpu-l4"]
    dra.synced = False
    assert not dra.availability(offering).counted
    dra.synced = True
    dra.class_event("DELETED", d.device_classes()[0])
    assert dra.availability(offering).capacity == 0


def test_cel_errors_name_the_problem():
    with pytest.raises(SelectorError, match="does not compile"):
        compile_selector("device.attributes['gpu.nvidia.com'].productName ==")
    with pytest.raises(QuantityError, match="not a Kubernetes quantity"):
        parse_quantity("40 GiB")
    # A selector that raises for a device (no such attribute) does not select it, as in Kubernetes.
    dra = state()
    missing = Offering(
        slug="x",
        kind=Kind.FULL,
        display_name="x",
        claim=DeviceClaim("gpu.nvidia.com", ("device.attributes['gpu.nvidia.com'].nope == 'x'",)),
    )
    assert dra.availability(missing).capacity == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["gpu-0", "gpu-1", "gpu-2", "gpu-3"]), st.integers(0, 2)), max_size=8))
def test_free_plus_allocated_is_capacity_and_free_is_never_negative(allocations):
    claims = [claim(f"c{i}", *([("dra-l4", dev)] * times)) for i, (dev, times) in enumerate(allocations)]
    dra = state(claims=claims)
    avail = dra.availability(by_slug(dra)["dra-gpu-l4"])
    distinct = {dev for dev, times in allocations if times}
    assert avail.capacity == 4 and avail.allocated == len(distinct) and avail.free == 4 - len(distinct)


def test_slices_are_not_mutated_and_events_replace_the_same_object():
    slices = slices_of(H100)
    before = copy.deepcopy(slices)
    dra = state(slices=slices)
    dra.slice_event("MODIFIED", slices[0])
    assert slices == before and dra.availability(by_slug(dra)["dra-gpu-h100-80gb"]).capacity == 2


# ---------------------------------------------------------------------- the admin's DRA offerings


BIG = "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0"


def test_an_admin_cel_offering_counts_every_device_it_selects_across_products():
    big = offering_from_config({"slug": "big", "kind": "full", "dra": {"selector": BIG}, "counts": [1, 2]}, 0)
    assert big.claim is not None and big.claim.selectors == (BIG,) and not big.resources and not big.node_affinity
    dra = state(claims=[claim("a", ("dra-h100", "gpu-1"))])
    avail = dra.availability(big)
    assert (avail.capacity, avail.free, avail.nodes) == (2, 1, ("dra-h100",))  # L4s (22.5 GiB) and MIG devices are not selected
    newer = offering_from_config(
        {
            "slug": "hopper",
            "kind": "full",
            "dra": {"selector": "device.attributes['gpu.nvidia.com'].cudaComputeCapability.isGreaterThan(semver('8.9.0'))"},
        },
        1,
    )
    assert dra.availability(newer).capacity == 2


def test_admin_mig_and_shared_offerings_build_the_drivers_config():
    mig = offering_from_config({"slug": "m", "kind": "mig", "profile": "3g.20gb", "dra": {}}, 0)
    assert mig.claim is not None and mig.claim.device_class == "mig.nvidia.com"
    assert state().availability(mig).capacity == 1
    mps = offering_from_config(
        {
            "slug": "s",
            "kind": "shared",
            "sharing": "mps",
            "replicas": 2,
            "product": "NVIDIA L4",
            "dra": {"mps": {"defaultActiveThreadPercentage": 50}},
        },
        1,
    )
    assert mps.claim is not None and mps.claim.replicas == 2
    (config,) = mps.claim.config
    assert config["driver"] == "gpu.nvidia.com"
    assert config["parameters"] == {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}},
    }
    assert state().availability(mps).capacity == 8


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"kind": "full", "dra": {"selector": "device.attributes["}}, "field 'dra' ['selector'][0] CEL expression does not compile"),
        ({"kind": "full", "dra": {"selecter": BIG}}, "must be a dict with keys among"),
        ({"kind": "full", "dra": {}, "resources": {"nvidia.com/gpu": 1}}, "field 'resources' cannot be combined with 'dra'"),
        ({"kind": "vgpu", "dra": {}}, "field 'dra' applies to kinds ['full', 'mig', 'shared'] only"),
        ({"kind": "shared", "dra": {}}, "field 'replicas' is required for a DRA shared offering"),
        (
            {"kind": "shared", "replicas": 2, "dra": {"interval": "Forever"}},
            "['interval'] must be one of ['Default', 'Short', 'Medium', 'Long']",
        ),
        ({"kind": "shared", "replicas": 2, "dra": {"mps": {"x": 1}}}, "['mps'] is a dict of NVIDIA's mpsConfig and needs sharing 'mps'"),
    ],
)
def test_a_wrong_dra_entry_names_the_entry_and_what_to_write(entry, message):
    with pytest.raises(OfferingConfigError) as info:
        offering_from_config({"slug": "x", **entry}, 4)
    assert str(info.value).startswith("c.GPUSpawner.offerings[4] (slug 'x'): ") and message in str(info.value)


def test_selectors_that_match_nothing_and_missing_classes_are_warned_about_once_known():
    huge = offering_from_config({"slug": "huge", "kind": "full", "dra": {"selector": BIG.replace("40Gi", "200Gi")}}, 0)
    other = offering_from_config({"slug": "tpu", "kind": "full", "dra": {"device_class": "tpu.example.com"}}, 1)
    fine = offering_from_config({"slug": "big", "kind": "full", "dra": {"selector": BIG}}, 2)
    dra = state()
    warnings = unmatched([huge, other, fine], dra)
    assert len(warnings) == 2
    assert "offering 'huge': its DRA selectors match none of the 10 devices" in warnings[0]
    assert "offering 'tpu': device class 'tpu.example.com': no such DeviceClass" in warnings[1]
    dra.synced = False
    assert unmatched([huge], dra) == []  # not known yet: no warning


def test_the_documented_dra_examples_are_valid_and_count_on_the_simulated_driver():
    from types import SimpleNamespace

    from gpuspawner.offerings.config import offerings_from_config
    from gpuspawner.tools.configdoc import DRA_SECTION

    code = DRA_SECTION.split("```python\n", 1)[1].split("```", 1)[0]
    c = SimpleNamespace(GPUSpawner=SimpleNamespace())
    exec(code, {"c": c})
    offerings = {o.slug: o for o in offerings_from_config(c.GPUSpawner.offerings)}
    dra = state()
    assert dra.availability(offerings["big-gpu"]).capacity == 2
    assert dra.availability(offerings["l4-quarter"]).capacity == 16
    assert dra.availability(offerings["h100-mps"]).capacity == 4


def test_devices_taking_from_a_counter_set_their_pool_lacks_are_offered_but_never_free():
    """The allocator deems such a pool invalid and allocates none of its devices (``validateDeviceCounterConsumption``)."""
    slices = slices_of(L4)
    for dev in slices[0]["spec"]["devices"]:
        dev["consumesCounters"] = [{"counterSet": "gpu-0-counters", "counters": {"memory": {"value": "1Gi"}}}]
    dra = state(slices=slices)
    l4 = by_slug(dra)["dra-gpu-l4"]
    assert dra.availability(l4).free == 0 and dra.availability(l4).capacity == 0
