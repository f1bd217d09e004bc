"""Which of Kueue's pending workloads wait for an offering's GPU (capacity.kueuewaiting): those
in the ClusterQueue behind the offering's LocalQueue or in its cohort tree, asking for its
resource in a flavor its servers use, each counted once per offering."""

from __future__ import annotations

from gpuspawner.capacity.kueuequota import STREAMS, KueueState
from gpuspawner.capacity.kueuewaiting import PendingWorkload, waiting
from gpuspawner.offerings.config import offering_from_config
from gpuspawner.pod.notebook import Notebook

PRODUCT = "nvidia.com/gpu.product"
H100 = offering_from_config({"slug": "h100", "kind": "full", "display_name": "H100", "product": "NVIDIA-H100-80GB-HBM3"}, 0)
A100 = offering_from_config({"slug": "a100", "kind": "full", "display_name": "A100", "product": "NVIDIA-A100-SXM4-40GB"}, 0)
MIG = offering_from_config(
    {"slug": "mig-1g", "kind": "mig", "display_name": "MIG 1g", "profile": "1g.5gb", "product": "NVIDIA-A100-SXM4-40GB"}, 0
)


def cq(name: str, cohort: str = "") -> dict:
    gpu = {"name": "nvidia.com/gpu", "nominalQuota": "2"}
    mig = {"name": "nvidia.com/mig-1g.5gb", "nominalQuota": "2"}
    return {
        "metadata": {"name": name},
        "spec": {
            "cohortName": cohort,
            "resourceGroups": [
                {
                    "coveredResources": ["cpu"],
                    "flavors": [{"name": "default-flavor", "resources": [{"name": "cpu", "nominalQuota": "64"}]}],
                },
                {
                    "coveredResources": ["nvidia.com/gpu", "nvidia.com/mig-1g.5gb"],
                    "flavors": [
                        {"name": "h100", "resources": [gpu, {**mig, "nominalQuota": "0"}]},
                        {"name": "a100", "resources": [gpu, mig]},
                    ],
                },
            ],
        },
    }


def state(*queues: dict) -> KueueState:
    kueue = KueueState()
    kueue.replace(
        "localqueues",
        [
            {"metadata": {"namespace": "jhub", "name": "gpu"}, "spec": {"clusterQueue": "team"}},
            {"metadata": {"namespace": "jhub", "name": "gpu-too"}, "spec": {"clusterQueue": "team"}},
        ],
    )
    kueue.replace("clusterqueues", list(queues))
    kueue.replace(
        "resourceflavors",
        [
            {"metadata": {"name": "default-flavor"}, "spec": {}},
            {"metadata": {"name": "h100"}, "spec": {"nodeLabels": {PRODUCT: "NVIDIA-H100-80GB-HBM3"}}},
            {"metadata": {"name": "a100"}, "spec": {"nodeLabels": {PRODUCT: "NVIDIA-A100-SXM4-40GB"}}},
        ],
    )
    kueue.replace("cohorts", [])
    kueue.synced = dict.fromkeys(STREAMS, True)
    return kueue


def workload(ns: str, name: str, requests: dict[str, str], selector: dict[str, str] | None = None, count: int = 1) -> dict:
    spec = {"containers": [{"name": "main", "resources": {"requests": requests, "limits": requests}}], "nodeSelector": selector or {}}
    return {
        "metadata": {"namespace": ns, "name": name},
        "spec": {"podSets": [{"name": "main", "count": count, "template": {"spec": spec}}]},
    }


def pending(obj: dict, cluster_queue: str = "team") -> PendingWorkload:
    return PendingWorkload.from_object(obj, cluster_queue)


def test_a_batch_job_for_the_same_flavor_and_resource_waits_for_the_offering():
    kueue = state(cq("team"))
    job = pending(workload("batch", "job-train", {"nvidia.com/gpu": "1", "cpu": "4"}, {PRODUCT: "NVIDIA-H100-80GB-HBM3"}))
    counts = waiting([H100, A100, MIG], {"h100": ["gpu"], "a100": ["gpu"], "mig-1g": ["gpu"]}, "jhub", kueue, Notebook(), [job])
    assert counts == {("h100", "team"): 1}  # not the A100 (its flavor's nodes differ), not the MIG slice (another resource)


def test_a_workload_any_flavor_would_take_waits_for_every_offering_of_its_resource():
    kueue = state(cq("team"))
    anywhere = pending(workload("batch", "job-any", {"nvidia.com/gpu": "2"}))  # no selector: h100 or a100
    mig = pending(workload("other-hub", "pod-x", {"nvidia.com/mig-1g.5gb": "1"}, {PRODUCT: "NVIDIA-A100-SXM4-40GB"}))
    cpu_only = pending(workload("batch", "job-cpu", {"cpu": "8"}))
    counts = waiting(
        [H100, A100, MIG], {"h100": ["gpu"], "a100": ["gpu"], "mig-1g": ["gpu"]}, "jhub", kueue, Notebook(), [anywhere, mig, cpu_only]
    )
    assert counts == {("h100", "team"): 1, ("a100", "team"): 1, ("mig-1g", "team"): 1}


def test_the_cohort_counts_and_other_queues_do_not():
    kueue = state(cq("team", "research"), cq("lab", "research"), cq("elsewhere"))
    ask = {"nvidia.com/gpu": "1"}
    h100 = {PRODUCT: "NVIDIA-H100-80GB-HBM3"}
    jobs = [pending(workload("lab", "job-1", ask, h100), "lab"), pending(workload("x", "job-2", ask, h100), "elsewhere")]
    counts = waiting([H100], {"h100": ["gpu"]}, "jhub", kueue, Notebook(), jobs)
    assert counts == {("h100", "lab"): 1}  # the cohort's other queue borrows what this hub gives back; an unrelated one does not


def test_each_workload_once_per_offering_whatever_the_queues_and_namespaces():
    kueue = state(cq("team"))
    job = pending(workload("batch", "job-1", {"nvidia.com/gpu": "1"}, {PRODUCT: "NVIDIA-H100-80GB-HBM3"}))
    # two LocalQueues of the hub on the same ClusterQueue
    assert waiting([H100], {"h100": ["gpu", "gpu-too"]}, "jhub", kueue, Notebook(), [job]) == {("h100", "team"): 1}
    # a LocalQueue of another namespace is not this hub's (None: any namespace, user namespaces)
    assert waiting([H100], {"h100": ["gpu"]}, "elsewhere", kueue, Notebook(), [job]) == {}
    assert waiting([H100], {"h100": ["gpu"]}, None, kueue, Notebook(), [job]) == {("h100", "team"): 1}
    # an offering that goes through no queue counts none
    assert waiting([H100], {}, "jhub", kueue, Notebook(), [job]) == {}
