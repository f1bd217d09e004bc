"""DRA offerings counted where their pod may land (gpuspawner.capacity.draplaced): the node's cordon,
taints and cpu/memory/pod slots beside the devices; DeviceTaintRules in the DRA and the mapped counts."""

from __future__ import annotations

from dataclasses import replace

from gpuspawner.capacity.index import ClusterIndex
from gpuspawner.devcluster import dradriver as d
from gpuspawner.pod.notebook import Notebook
from tests.unit.test_dra import claim, slices_of
from tests.unit.test_dra_extres import PLAIN

L4 = d.DraNode("dra-l4", d.L4, 4)
MAPPED = d.EXTRES_NODE


def node(spec: d.DraNode, *, cordoned: bool = False, taints=(), cpu: str = "32", labels=None) -> dict:
    raw = d.dra_node_manifest(spec, 0)
    raw["spec"]["unschedulable"] = cordoned
    raw["spec"]["taints"] = list(taints)
    raw["status"]["allocatable"]["cpu"] = cpu
    if labels is not None:
        raw["metadata"]["labels"].update(labels)
    return raw


def index_of(*nodes: dict, specs=(L4,), rules=(), notebook: Notebook | None = None) -> ClusterIndex:
    index = ClusterIndex()
    index.replace(nodes=list(nodes))
    if notebook is not None:
        index.set_notebook(notebook)
    index.dra.replace(slices=slices_of(*specs), classes=d.device_classes(), claims=[], rules=list(rules))
    index.dra.synced = True
    return index


def l4(index: ClusterIndex):
    return {o.slug: o for o in index.discovered()}["dra-gpu-l4"]


def rule(name: str, taint: dict, **selector: str) -> dict:
    return {"metadata": {"name": name}, "spec": {"deviceSelector": selector, "taint": taint}}


NO_SCHEDULE = {"key": "example.com/drain", "value": "yes", "effect": "NoSchedule"}


def test_a_cordoned_dra_node_offers_nothing_and_uncordoning_gives_its_devices_back():
    index = index_of(node(L4, cordoned=True))
    avail = index.availability(l4(index))
    assert (avail.capacity, avail.free, avail.largest_free) == (0, 0, 0)
    index.node_event("MODIFIED", node(L4))
    assert index.availability(l4(index)).free == 4


def test_a_node_taint_the_pod_does_not_tolerate_hides_the_devices_and_a_tolerated_one_does_not():
    index = index_of(node(L4, taints=[NO_SCHEDULE]))
    assert index.availability(l4(index)).free == 0
    tolerant = replace(l4(index), tolerations=(*l4(index).tolerations, {"key": "example.com/drain", "operator": "Exists"}))
    assert index.availability(tolerant).free == 4
    # The GPU taint every GPU offering tolerates keeps nothing off.
    index.node_event("MODIFIED", node(L4, taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]))
    assert index.availability(l4(index)).free == 4


def test_the_notebooks_cpu_beside_the_gpu_limits_the_count_and_bound_pods_take_their_share():
    notebook = Notebook.from_settings({"cpu_guarantee": 1.5, "mem_guarantee": "1G"})
    index = index_of(node(L4, cpu="3"), notebook=notebook)
    avail = index.availability(l4(index))
    assert (avail.capacity, avail.allocated, avail.free, avail.largest_free) == (4, 0, 2, max(l4(index).counts))
    other = {
        "metadata": {"namespace": "ns", "name": "cpu-hog"},
        "spec": {"nodeName": L4.name, "containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]},
        "status": {"phase": "Running"},
    }
    index.pod_event("ADDED", other)
    assert index.availability(l4(index)).free == 0 and index.availability(l4(index)).largest_free == 0
    assert index.reserve("ns/jupyter-ann", l4(index), 1) is None  # nowhere for the notebook: nothing held


def test_a_reservation_holds_the_notebooks_room_on_its_node_too():
    notebook = Notebook.from_settings({"cpu_guarantee": 1.5})
    index = index_of(node(L4, cpu="3"), notebook=notebook)
    assert index.reserve("ns/jupyter-ann", l4(index), 1) == L4.name
    assert index.availability(l4(index)).free == 1
    index.release("ns/jupyter-ann")
    assert index.availability(l4(index)).free == 2


def test_device_taint_rules_taint_the_devices_they_select_in_the_dra_and_the_mapped_counts():
    by_device = rule("one", NO_SCHEDULE, driver="gpu.nvidia.com", pool=L4.name, device="gpu-0")
    whole_pool = rule("pool", NO_SCHEDULE, pool=MAPPED.name)
    nothing = {"metadata": {"name": "none"}, "spec": {"taint": NO_SCHEDULE}}  # no selector: no device
    index = index_of(node(L4), node(MAPPED), specs=(L4, MAPPED), rules=[by_device, nothing])
    assert index.availability(l4(index)).free == 3
    assert index.availability(PLAIN).free == 2
    index.dra.rule_event("ADDED", whole_pool)
    assert index.availability(PLAIN).free == 0  # the scheduler's claim tolerates no taint
    tolerant = replace(l4(index), claim=replace(l4(index).claim, tolerations=({"key": "example.com/drain", "operator": "Exists"},)))
    assert index.availability(tolerant).free == 4
    index.dra.rule_event("DELETED", by_device)
    assert index.availability(l4(index)).free == 4


def test_a_slices_own_device_taint_keeps_the_mapped_count_off_that_device():
    tainted = replace(MAPPED, taints={"gpu-1": (NO_SCHEDULE,)})
    index = index_of(node(tainted), specs=(tainted,))
    avail = index.availability(PLAIN)
    assert (avail.capacity, avail.free) == (2, 1)
    index.dra.claim_event("ADDED", claim("x-extended-resources-1", (MAPPED.name, "gpu-0"), consumers=("x",)))
    assert index.availability(PLAIN).free == 0


def test_two_cards_never_carry_one_name():
    """Issue 41: the device plugin's and DRA's A100 MIG 1g.5gb, and T4 shares of two node classes."""
    from gpuspawner.devcluster.nodes import standard_nodes
    from gpuspawner.dra.devices import DraState
    from gpuspawner.offerings.catalog import CatalogConfig, build_catalog
    from gpuspawner.offerings.discovery import discover

    nodes = standard_nodes()
    dra = DraState()
    dra.replace(slices=slices_of(*d.DRA_NODES), classes=d.device_classes(), claims=[])
    catalog = build_catalog(CatalogConfig.from_settings({}), nodes, discover(nodes) + dra.discovered())
    names = [o.display_name for o in catalog]
    assert len(names) == len(set(names))
    assert "A100 40GB · MIG 1g.5gb (DRA)" in names and "A100 40GB · MIG 1g.5gb (device plugin)" in names
    t4 = sorted(n for n in names if n.startswith("Tesla T4 · 1/4 time-sliced"))
    assert t4 == ["Tesla T4 · 1/4 time-sliced (nvidia.com/gpu)", "Tesla T4 · 1/4 time-sliced (nvidia.com/gpu.shared)"]
