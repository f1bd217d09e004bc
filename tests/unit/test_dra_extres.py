"""The extended-resource mapping (gpuspawner.dra.extres, gpuspawner.capacity.mapped) and binding
conditions (gpuspawner.dra.binding), on the simulated driver's real-format objects."""

from __future__ import annotations

from gpuspawner.capacity.index import ClusterIndex
from gpuspawner.core.model import Offering
from gpuspawner.core.noticewords import preparing_words
from gpuspawner.devcluster import dradriver as d
from gpuspawner.dra import binding
from gpuspawner.dra.extres import IMPLICIT_PREFIX, extended_claim_name, mapped_class
from gpuspawner.names import dranames as dn
from gpuspawner.names.vocabulary import Kind
from tests.unit.test_dra import claim, slices_of

HOST = {"cpu": "32", "memory": "256Gi", "pods": "110"}
H100_LABEL = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
PLAIN = Offering(slug="h100", kind=Kind.FULL, display_name="H100", resources={"nvidia.com/gpu": 1}, node_selector=H100_LABEL, counts=(1, 2))


def node(name: str, gpus: int | None = None, labels=H100_LABEL, taints=()) -> dict:
    allocatable = dict(HOST, **({"nvidia.com/gpu": str(gpus)} if gpus is not None else {}))
    return {"metadata": {"name": name, "labels": dict(labels)}, "spec": {"taints": list(taints)}, "status": {"allocatable": allocatable}}


def plain_pod(name: str, on: str, gpus: int) -> dict:
    limits = {"nvidia.com/gpu": str(gpus)}
    return {
        "metadata": {"namespace": "ns", "name": name},
        "spec": {"nodeName": on, "containers": [{"name": "c", "resources": {"limits": limits}}]},
        "status": {"phase": "Running"},
    }


def index_with(nodes, pods=(), claims=(), dra_nodes=(d.EXTRES_NODE,), classes=None) -> ClusterIndex:
    index = ClusterIndex()
    index.replace(nodes=list(nodes), pods=list(pods))
    index.dra.replace(slices=slices_of(*dra_nodes), classes=classes if classes is not None else d.device_classes(), claims=list(claims))
    index.dra.synced = True
    return index


def test_a_plain_offering_counts_device_plugin_gpus_and_mapped_dra_gpus_once_each():
    mapped = d.EXTRES_NODE.name
    index = index_with([node("dp-h100", gpus=4), node(mapped)], pods=[plain_pod("a", "dp-h100", 1)])
    avail = index.availability(PLAIN)
    assert (avail.capacity, avail.free, avail.largest_free, avail.nodes) == (6, 5, 2, ("dp-h100", mapped))
    # A plain pod on the DRA node: the scheduler's claim holds one device; the pod's own
    # nvidia.com/gpu request there is not subtracted a second time.
    index.pod_event("ADDED", plain_pod("b", mapped, 1))
    index.dra.claim_event("ADDED", claim("b-extended-resources-x", (mapped, "gpu-0"), consumers=("b",)))
    avail = index.availability(PLAIN)
    assert (avail.capacity, avail.allocated, avail.free) == (6, 2, 4)
    # The DRA offering of the same devices sees the same device taken.
    dra_h100 = {o.slug: o for o in index.discovered()}["dra-gpu-h100-80gb"]
    assert index.availability(dra_h100).free == 1


def test_without_the_mapping_the_dra_node_is_not_an_extended_resource_node():
    classes = [c for c in d.device_classes()]
    for c in classes:
        c["spec"].pop("extendedResourceName", None)
    index = index_with([node("dp-h100", gpus=4), node(d.EXTRES_NODE.name)], classes=classes)
    assert index.availability(PLAIN).capacity == 4


def test_the_mapping_follows_the_pods_placement_rules_and_the_implicit_name():
    taint = {"key": "dedicated", "value": "x", "effect": "NoSchedule"}
    index = index_with([node(d.EXTRES_NODE.name, taints=[taint])])
    assert index.availability(PLAIN).capacity == 0  # tainted: the pod cannot land there
    index = index_with([node(d.EXTRES_NODE.name, labels={})])
    assert index.availability(PLAIN).capacity == 0  # not labelled as the offering selects
    implicit = Offering(slug="x", kind=Kind.CUSTOM, display_name="x", resources={IMPLICIT_PREFIX + dn.CLASS_GPU: 1})
    assert mapped_class(index.dra, IMPLICIT_PREFIX + dn.CLASS_GPU) == dn.CLASS_GPU
    assert index.availability(implicit).capacity == 2


def test_an_incomplete_mapped_pool_makes_the_count_unknown_not_smaller():
    index = index_with([node("dp-h100", gpus=4), node(d.EXTRES_NODE.name)])
    first, _ = d.resource_slices(d.EXTRES_NODE.name, d.node_devices(d.EXTRES_NODE), generation=2, slice_count=2)
    index.dra.slice_event("ADDED", first)
    assert not index.availability(PLAIN).counted


def test_a_spawn_on_a_mapped_node_holds_devices_until_the_schedulers_claim_is_allocated():
    mapped = d.EXTRES_NODE.name
    index = index_with([node(mapped)])
    assert index.reserve("ns/jupyter-ann", PLAIN, 2) == mapped
    assert index.availability(PLAIN).free == 0 and index.reserve("ns/jupyter-bob", PLAIN, 1) is None
    index.dra.claim_event("ADDED", claim("c", (mapped, "gpu-0"), (mapped, "gpu-1"), consumers=("jupyter-ann",)))
    index.pod_event("ADDED", plain_pod("jupyter-ann", mapped, 2))
    assert not index.dra.reservations and not index.reservations and index.availability(PLAIN).free == 0


def test_the_claim_the_scheduler_made_is_read_from_the_pod_status():
    assert extended_claim_name({"status": {"extendedResourceClaimStatus": {"resourceClaimName": "p-extended-resources-abc"}}}) == (
        "p-extended-resources-abc"
    )
    assert extended_claim_name({"status": {}}) is None


def test_binding_conditions_are_pending_until_the_driver_sets_them_true():
    result = {"request": "r", "driver": dn.DRIVER, "pool": "n", "device": "gpu-0", **d.BINDING_FIELDS}
    result.pop("bindsToNode")
    allocated = {"status": {"allocation": {"devices": {"results": [result]}}}}
    assert binding.pending(allocated) == [d.BOUND_CONDITION] and not binding.failed(allocated)
    assert preparing_words(binding.pending(allocated)) == "Preparing the device (FabricAttached)…"

    def with_condition(kind: str, status: str) -> dict:
        devices = [{"driver": dn.DRIVER, "pool": "n", "device": "gpu-0", "conditions": [{"type": kind, "status": status}]}]
        return {"status": {**allocated["status"], "devices": devices}}

    assert binding.pending(with_condition(d.BOUND_CONDITION, "False")) == [d.BOUND_CONDITION]
    assert binding.pending(with_condition(d.BOUND_CONDITION, "True")) == []
    assert binding.failed(with_condition(d.BOUND_FAILURE, "True")) == [d.BOUND_FAILURE]
    assert binding.pending({"status": {}}) == []
