"""What the index keeps between events so that a page view costs little (issue 30) stays exact:
the extended-resource mapping's rows, this hub's users' pods, and a relist fed page by page.
Each count is read once before the event (so that a cache is filled) and once after it."""

from __future__ import annotations

import copy

from gpuspawner.capacity.index import ClusterIndex
from gpuspawner.core.fit import amount
from gpuspawner.devcluster import dradriver as d
from gpuspawner.pod.notebook import Notebook
from tests.unit.test_dra import claim
from tests.unit.test_dra_extres import PLAIN, index_with, node, plain_pod

MAPPED = d.EXTRES_NODE.name


def cpu_pod(name: str, on: str, cpu: str, user: str | None = None, hub: str | None = None) -> dict:
    labels = {}
    if user is not None:
        labels["hub.jupyter.org/username"] = user
    if hub is not None:
        labels["gpuspawner.io/hub"] = hub
    return {
        "metadata": {"namespace": "ns", "name": name, "labels": labels},
        "spec": {"nodeName": on, "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
        "status": {"phase": "Running"},
    }


def counts(index: ClusterIndex) -> tuple:
    avail = index.availability(PLAIN)
    return avail.capacity, avail.allocated, avail.free, avail.largest_free


def test_a_claim_event_alone_changes_the_mapped_count():
    index = index_with([node("dp-h100", gpus=4), node(MAPPED)])
    assert counts(index) == (6, 0, 6, 2)
    index.dra.claim_event("ADDED", claim("x", (MAPPED, "gpu-0"), consumers=("p",)))
    assert counts(index) == (6, 1, 5, 2)
    index.dra.claim_event("DELETED", claim("x", (MAPPED, "gpu-0"), consumers=("p",)))
    assert counts(index) == (6, 0, 6, 2)


def test_a_class_event_that_drops_the_mapping_drops_the_mapped_nodes():
    index = index_with([node("dp-h100", gpus=4), node(MAPPED)])
    assert counts(index)[0] == 6
    gpu_class = copy.deepcopy(next(c for c in d.device_classes() if c["spec"].get("extendedResourceName")))
    del gpu_class["spec"]["extendedResourceName"]
    index.dra.class_event("MODIFIED", gpu_class)
    assert counts(index)[0] == 4


def test_pods_that_fill_a_mapped_node_leave_its_devices_unusable():
    index = index_with([node("dp-h100", gpus=4), node(MAPPED)])
    index.set_notebook(Notebook(requests={"cpu": 1000, "pods": 1}))  # the notebook asks for a core beside its GPU
    assert counts(index) == (6, 0, 6, 2)
    # A cpu-only pod that takes all the DRA node's cpu: its GPUs stay unallocated but no notebook fits.
    index.pod_event("ADDED", cpu_pod("hog", MAPPED, "32"))
    assert counts(index) == (6, 0, 4, 2)
    index.pod_event("DELETED", cpu_pod("hog", MAPPED, "32"))
    assert counts(index) == (6, 0, 6, 2)


def test_a_node_event_and_the_listed_state_reach_the_mapped_count():
    index = index_with([node("dp-h100", gpus=4), node(MAPPED)])
    assert counts(index)[0] == 6
    index.node_event("MODIFIED", node(MAPPED, labels={}))  # no longer labelled as the offering selects
    assert counts(index)[0] == 4
    index.node_event("MODIFIED", node(MAPPED))
    assert counts(index)[0] == 6
    index.dra.synced = False  # DRA streams not listed: the mapped part is unknown
    assert index.availability(PLAIN).capacity is None
    index.dra.synced = True
    assert counts(index)[0] == 6


def test_a_reservation_on_a_mapped_node_is_counted_and_released():
    index = index_with([node(MAPPED)])
    assert counts(index) == (2, 0, 2, 2)
    assert index.reserve("ns/p", PLAIN, 1) == MAPPED
    assert counts(index) == (2, 1, 1, 1)
    index.release("ns/p")
    assert counts(index) == (2, 0, 2, 2)


def test_a_relist_fed_page_by_page_replaces_every_pod():
    index = ClusterIndex()
    index.replace(nodes=[node("dp-h100", gpus=4)], pods=[plain_pod("a", "dp-h100", 1), plain_pod("b", "dp-h100", 2)])
    assert counts(index) == (4, 3, 1, 1)
    index.begin_pods()
    index.add_pods([plain_pod("a", "dp-h100", 1)])
    assert counts(index) == (4, 3, 1, 1)  # until the relist ends, the counts are the last list's
    index.add_pods([])
    index.add_pods([plain_pod("c", "dp-h100", 1)])
    index.end_pods()  # b went between the two lists: gone
    assert set(index.pods) == {"ns/a", "ns/c"}
    assert counts(index) == (4, 2, 2, 2)


def test_this_hubs_user_pods_follow_every_event():
    index = ClusterIndex()
    index.replace(
        nodes=[node("n", gpus=4)],
        pods=[cpu_pod("a", "n", "1", user="ann", hub="h1"), cpu_pod("b", "n", "1", user="bob", hub="h2"), cpu_pod("c", "n", "1")],
    )
    assert set(index.user_pods("h1")) == {"ns/a"} and set(index.user_pods("h2")) == {"ns/b"}
    assert set(index.user_pods("")) == set() and set(index.user_pods()) == {"ns/a", "ns/b"}
    index.pod_event("ADDED", cpu_pod("d", "n", "1", user="dan"))  # no hub label
    index.pod_event("MODIFIED", cpu_pod("a", "n", "1"))  # its user label removed
    index.pod_event("DELETED", cpu_pod("b", "n", "1", user="bob", hub="h2"))
    index.pod_event("MODIFIED", cpu_pod("c", "n", "1", user="cat", hub="h1"))
    assert set(index.user_pods("h1")) == {"ns/c"} and set(index.user_pods("")) == {"ns/d"}
    assert set(index.user_pods()) == {"ns/c", "ns/d"}
    index.replace(pods=[cpu_pod("e", "n", "2", user="eve", hub="h2")])
    assert set(index.user_pods()) == {"ns/e"} and index.user_pods("h1") == {}


def test_quantities_parsed_once_give_the_same_amounts():
    for _ in range(2):
        assert amount("cpu", "250m") == 250 and amount("memory", "250m") == 1
        assert amount("cpu", "1") == 1000 and amount("memory", "1Gi") == 2**30
        assert amount("cpu", "bogus") is None and amount("cpu", True) is None and amount("cpu", 2) == 2000


def test_a_dra_offerings_count_follows_claims_reservations_slices_and_the_listed_state():
    index = index_with([node(MAPPED)])
    dra_h100 = {o.slug: o for o in index.discovered()}["dra-gpu-h100-80gb"]

    def free() -> int | None:
        return index.availability(dra_h100).free

    assert free() == 2
    index.dra.claim_event("ADDED", claim("x", (MAPPED, "gpu-0"), consumers=("p",)))
    assert free() == 1
    assert index.reserve("ns/q", dra_h100, 1) == MAPPED  # counted inside reserve, then held
    assert free() == 0
    index.release("ns/q")
    assert free() == 1
    index.dra.synced = False
    assert free() is None
    index.dra.synced = True
    index.dra.slice_event("DELETED", d.resource_slices(MAPPED, d.node_devices(d.EXTRES_NODE))[0])
    assert index.availability(dra_h100).capacity == 0


def test_the_queue_mapping_is_made_again_when_its_settings_change_even_in_place():
    from types import SimpleNamespace

    from gpuspawner.spawner import GPUSpawner

    routing = GPUSpawner.kueue_routing.fget  # type: ignore[attr-defined]
    settings = SimpleNamespace(kueue_queues={"default": "a"}, kueue_priority_classes={})
    first = routing(settings)
    assert first.default == "a" and routing(settings) is first  # kept while the settings are the same
    settings.kueue_queues["default"] = "b"  # changed in place
    assert routing(settings).default == "b"
    settings.kueue_queues = {"default": "Not A Name"}
    assert not routing(settings).enabled  # wrong settings: empty (config_problems refuses the spawn)
    settings.kueue_queues = {"groups": {"students": "s"}}
    assert routing(settings).groups == {"students": "s"}
