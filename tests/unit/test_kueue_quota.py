"""What a Kueue queue still admits of an offering (capacity.kueuequota): the nominal quota of the
ClusterQueue's flavors that would take its pod, less what is reserved, per one-unit server."""

from __future__ import annotations

from gpuspawner.capacity.counts import offering_pod
from gpuspawner.capacity.kueuequota import NOT_FOR_DRA, NOT_LISTED, STREAMS, KueueState, restricted
from gpuspawner.core.model import QueueRoom
from gpuspawner.offerings.config import offering_from_config
from gpuspawner.pod.notebook import Notebook

H100 = offering_from_config(
    {"slug": "h100", "kind": "full", "display_name": "H100", "product": "NVIDIA-H100-80GB-HBM3", "counts": [1, 2, 4]}, 0
)
A100 = offering_from_config({"slug": "a100", "kind": "full", "display_name": "A100", "product": "NVIDIA-A100-SXM4-40GB"}, 0)
MIG = offering_from_config(
    {"slug": "mig-1g", "kind": "mig", "display_name": "MIG 1g", "profile": "1g.5gb", "product": "NVIDIA-A100-SXM4-40GB"}, 0
)
PRODUCT = "nvidia.com/gpu.product"
NOTEBOOK = Notebook(requests={"pods": 1, "cpu": 1000, "memory": 2 * 2**30})


def flavor(name: str, labels: dict[str, str] | None = None, taints: list | None = None) -> dict:
    return {"metadata": {"name": name}, "spec": {"nodeLabels": labels or {}, "nodeTaints": taints or []}}


def cluster_queue(name: str, groups: list[dict], reserved: dict[str, dict[str, str]] | None = None, **spec) -> dict:
    status = {
        "flavorsReservation": [
            {"name": f, "resources": [{"name": r, "total": t} for r, t in rs.items()]} for f, rs in (reserved or {}).items()
        ]
    }
    return {"metadata": {"name": name}, "spec": {"resourceGroups": groups, **spec}, "status": status}


def group(covered: list[str], **flavors: dict[str, str]) -> dict:
    return {
        "coveredResources": covered,
        "flavors": [{"name": f, "resources": [{"name": r, "nominalQuota": q} for r, q in quotas.items()]} for f, quotas in flavors.items()],
    }


def state(cqs: list[dict], flavors: list[dict], locals_: dict[str, str] | None = None) -> KueueState:
    kueue = KueueState()
    kueue.replace(
        "localqueues",
        [{"metadata": {"namespace": "jhub", "name": q}, "spec": {"clusterQueue": cq}} for q, cq in (locals_ or {"team": "cq"}).items()],
    )
    kueue.replace("clusterqueues", cqs)
    kueue.replace("resourceflavors", flavors)
    kueue.synced = dict.fromkeys(STREAMS, True)
    return kueue


FLAVORS = [flavor("h100", {PRODUCT: "NVIDIA-H100-80GB-HBM3"}), flavor("a100", {PRODUCT: "NVIDIA-A100-SXM4-40GB"})]


def test_the_queue_admits_what_the_nominal_quota_of_matching_flavors_leaves_per_unit():
    cq = cluster_queue(
        "cq", [group(["nvidia.com/gpu"], h100={"nvidia.com/gpu": "3"}, a100={"nvidia.com/gpu": "8"})], {"h100": {"nvidia.com/gpu": "1"}}
    )
    kueue = state([cq], FLAVORS)
    # only the flavor whose nodeLabels match the offering's selector counts: 3 - 1 reserved
    assert kueue.room(H100, Notebook(), "jhub", "team") == QueueRoom("team", free=2, largest=2)
    assert kueue.room(A100, Notebook(), "jhub", "team") == QueueRoom("team", free=8, largest=1)
    # the MIG slice asks for nvidia.com/mig-1g.5gb, which no group covers: Kueue admits none
    assert kueue.room(MIG, Notebook(), "jhub", "team") == QueueRoom("team", free=0, largest=0)


def test_the_notebooks_cpu_memory_and_pods_count_where_the_queue_covers_them():
    groups = [group(["cpu", "memory", "pods", "nvidia.com/gpu"], h100={"cpu": "3", "memory": "64Gi", "pods": "10", "nvidia.com/gpu": "8"})]
    kueue = state([cluster_queue("cq", groups)], FLAVORS)
    assert kueue.room(H100, NOTEBOOK, "jhub", "team").free == 3  # 3 cpus for 1-cpu notebooks, though 8 GPUs
    # uncovered cpu and memory are not counted (Kueue's configuration may exclude them)
    kueue = state([cluster_queue("cq", [group(["nvidia.com/gpu"], h100={"nvidia.com/gpu": "8"})])], FLAVORS)
    assert kueue.room(H100, NOTEBOOK, "jhub", "team").free == 8


def test_cpu_and_gpu_in_two_groups_each_limit():
    groups = [group(["cpu", "memory"], default={"cpu": "2", "memory": "100Gi"}), group(["nvidia.com/gpu"], h100={"nvidia.com/gpu": "8"})]
    kueue = state([cluster_queue("cq", groups, {"h100": {"nvidia.com/gpu": "5"}})], [*FLAVORS, flavor("default")])
    assert kueue.room(H100, NOTEBOOK, "jhub", "team") == QueueRoom("team", free=2, largest=2)  # the cpu group: 2 notebooks


def test_largest_is_the_most_units_one_server_may_take_from_one_flavor():
    groups = [group(["nvidia.com/gpu"], h100={"nvidia.com/gpu": "3"}, h100b={"nvidia.com/gpu": "3"})]
    flavors = [flavor("h100", {PRODUCT: "NVIDIA-H100-80GB-HBM3"}), flavor("h100b", {PRODUCT: "NVIDIA-H100-80GB-HBM3", "zone": "b"})]
    kueue = state([cluster_queue("cq", groups)], flavors)
    assert kueue.room(H100, Notebook(), "jhub", "team") == QueueRoom("team", free=6, largest=2)  # counts 1, 2, 4: 4 fits neither


def test_flavor_matching_as_kueue_does_it():
    keys = frozenset({PRODUCT})
    selector, terms = restricted(offering_pod(H100), keys)
    assert selector == {PRODUCT: "NVIDIA-H100-80GB-HBM3"} and terms == ()  # the affinity's keys are no flavor's: dropped
    # a flavor without node labels takes every pod; an untolerated taint keeps it out
    groups = [group(["nvidia.com/gpu"], tainted={"nvidia.com/gpu": "4"}, any={"nvidia.com/gpu": "1"})]
    flavors = [flavor("tainted", taints=[{"key": "team", "value": "x", "effect": "NoSchedule"}]), flavor("any")]
    kueue = state([cluster_queue("cq", groups)], flavors)
    assert kueue.room(H100, Notebook(), "jhub", "team").free == 1
    # the offering's GPU selector matches no flavor of the group: none
    kueue = state([cluster_queue("cq", [group(["nvidia.com/gpu"], a100={"nvidia.com/gpu": "8"})])], FLAVORS)
    assert kueue.room(H100, Notebook(), "jhub", "team").free == 0


def test_a_queue_that_admits_nothing_allows_none_and_an_unreadable_one_is_unknown():
    groups = [group(["nvidia.com/gpu"], h100={"nvidia.com/gpu": "8"})]
    # a LocalQueue the hub has not seen (made just now, or misnamed): Kueue decides, and refuses a misnamed one itself
    assert (
        state([cluster_queue("cq", groups)], FLAVORS).room(H100, Notebook(), "jhub", "other").unknown
        == "LocalQueue other is not known to the hub"
    )
    assert state([cluster_queue("cq", groups)], FLAVORS).room(H100, Notebook(), "elsewhere", "team").unknown
    assert (
        state([cluster_queue("other-cq", groups)], FLAVORS).room(H100, Notebook(), "jhub", "team").unknown
        == "ClusterQueue cq is not known to the hub"
    )
    assert state([cluster_queue("cq", groups, stopPolicy="Hold")], FLAVORS).room(H100, Notebook(), "jhub", "team").free == 0
    inactive = cluster_queue("cq", groups)
    inactive["status"]["conditions"] = [{"type": "Active", "status": "False", "reason": "FlavorNotFound"}]
    assert state([inactive], FLAVORS).room(H100, Notebook(), "jhub", "team").free == 0
    over = cluster_queue("cq", groups, {"h100": {"nvidia.com/gpu": "10"}})  # borrowed past its nominal quota
    assert state([over], FLAVORS).room(H100, Notebook(), "jhub", "team").free == 0

    kueue = state([cluster_queue("cq", groups)], FLAVORS)
    kueue.unavailable = "Kueue is not installed"
    assert kueue.room(H100, Notebook(), "jhub", "team") == QueueRoom("team", unknown="Kueue is not installed")
    fresh = KueueState()
    assert fresh.room(H100, Notebook(), "jhub", "team") == QueueRoom("team", unknown=NOT_LISTED)
    dra = offering_from_config({"slug": "dra-h100", "kind": "full", "dra": {"device_class": "gpu.nvidia.com"}}, 0)
    assert dra.claim is not None
    assert state([cluster_queue("cq", groups)], FLAVORS).room(dra, Notebook(), "jhub", "team").unknown == NOT_FOR_DRA


def test_watch_events_move_the_count():
    groups = [group(["nvidia.com/gpu"], h100={"nvidia.com/gpu": "2"})]
    kueue = state([cluster_queue("cq", groups)], FLAVORS)
    assert kueue.room(H100, Notebook(), "jhub", "team").free == 2
    kueue.event("clusterqueues")("MODIFIED", cluster_queue("cq", groups, {"h100": {"nvidia.com/gpu": "1"}}))
    assert kueue.room(H100, Notebook(), "jhub", "team").free == 1
    kueue.event("localqueues")("DELETED", {"metadata": {"namespace": "jhub", "name": "team"}, "spec": {}})
    assert kueue.room(H100, Notebook(), "jhub", "team").unknown == "LocalQueue team is not known to the hub"
