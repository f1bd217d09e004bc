"""Borrowing within a Kueue cohort (capacity.kueuequota.QuotaTree, KueueState.room), held to
Kueue's documented rules: the examples of Kueue v0.17.0's ``site/content/en/docs/concepts/
cluster_queue.md`` ("BorrowingLimit", "LendingLimit") and ``cohort.md`` ("Configuring Quotas"),
and the arithmetic of ``pkg/cache/scheduler/resource_node.go`` (``available``,
``accumulateFromChild``, ``localQuota``) where the docs give no numbers."""

from __future__ import annotations

from gpuspawner.capacity.kueuequota import STREAMS, ClusterQueue, Cohort, KueueState, QuotaTree
from gpuspawner.core.model import QueueRoom
from gpuspawner.core.wording import queue_words
from gpuspawner.offerings.config import offering_from_config
from gpuspawner.pod.notebook import Notebook

CPU = ("default-flavor", "cpu")
GPU = "nvidia.com/gpu"
H100 = offering_from_config(
    {"slug": "h100", "kind": "full", "display_name": "H100", "product": "NVIDIA-H100-80GB-HBM3", "counts": [1, 2, 4]}, 0
)


def resource(name: str, nominal: str, borrowing: str | None = None, lending: str | None = None) -> dict:
    entry = {"name": name, "nominalQuota": nominal}
    if borrowing is not None:
        entry["borrowingLimit"] = borrowing
    if lending is not None:
        entry["lendingLimit"] = lending
    return entry


def cq(name: str, cohort: str, flavor: str, *resources: dict, reserved: dict[str, str] | None = None) -> dict:
    covered = [r["name"] for r in resources]
    return {
        "metadata": {"name": name},
        "spec": {
            "cohortName": cohort,
            "resourceGroups": [{"coveredResources": covered, "flavors": [{"name": flavor, "resources": list(resources)}]}],
        },
        "status": {"flavorsReservation": [{"name": flavor, "resources": [{"name": r, "total": t} for r, t in (reserved or {}).items()]}]},
    }


def cohort(name: str, parent: str = "", flavor: str = "", *resources: dict) -> dict:
    spec: dict = {"parentName": parent} if parent else {}
    if resources:
        spec["resourceGroups"] = [
            {"coveredResources": [r["name"] for r in resources], "flavors": [{"name": flavor, "resources": list(resources)}]}
        ]
    return {"metadata": {"name": name}, "spec": spec}


def tree(queues: list[dict], cohorts: list[dict] = ()) -> QuotaTree:
    cqs = {q.name: q for q in map(ClusterQueue.from_object, queues)}
    return QuotaTree(cqs, {c.name: c for c in map(Cohort.from_object, cohorts)})


def cpus(t: QuotaTree, queue: str) -> float:
    return t.available(queue, CPU) / 1000


def test_borrowing_limit_as_kueues_docs_say():
    # cluster_queue.md, BorrowingLimit: team-a-cq 9 cpu (borrowingLimit 1), team-b-cq 12, both in team-ab
    a = cq("team-a-cq", "team-ab", "default-flavor", resource("cpu", "9", borrowing="1"))
    b = cq("team-b-cq", "team-ab", "default-flavor", resource("cpu", "12"))
    t = tree([a, b])
    assert cpus(t, "team-a-cq") == 10  # "team-a-cq can admit Workloads with resources adding up to 9+1=10 CPUs"
    assert cpus(t, "team-b-cq") == 21  # "team-b-cq can use up to 12+9 CPUs"
    assert t.nominal_available("team-a-cq", CPU) == 9000  # without borrowing: its nominal quota


def test_lending_limit_as_kueues_docs_say():
    # cluster_queue.md, LendingLimit: team-a-cq 9, team-b-cq 12 with lendingLimit 1
    a = cq("team-a-cq", "team-ab", "default-flavor", resource("cpu", "9"))
    b = cq("team-b-cq", "team-ab", "default-flavor", resource("cpu", "12", lending="1"))
    t = tree([a, b])
    assert cpus(t, "team-a-cq") == 10  # "team-a-cq can admit Workloads with resources adding up to 9+1=10 CPUs"
    assert cpus(t, "team-b-cq") == 21  # "team-b-cq can use up to 9+12 CPUs"
    # team-b using 11 (below nominal - lendingLimit): the 1 it lends is still free for team-a
    t = tree([a, cq("team-b-cq", "team-ab", "default-flavor", resource("cpu", "12", lending="1"), reserved={"cpu": "11"})])
    assert cpus(t, "team-a-cq") == 10
    # team-b using all 12: it took back the one it lent; team-a has its own 9
    t = tree([a, cq("team-b-cq", "team-ab", "default-flavor", resource("cpu", "12", lending="1"), reserved={"cpu": "12"})])
    assert cpus(t, "team-a-cq") == 9


def test_what_others_use_is_not_lent():
    a = cq("team-a-cq", "team-ab", "default-flavor", resource("cpu", "9"), reserved={"cpu": "9"})
    b = cq("team-b-cq", "team-ab", "default-flavor", resource("cpu", "12"), reserved={"cpu": "10"})
    t = tree([a, b])
    assert cpus(t, "team-a-cq") == 2  # its own used up; 2 of team-b's unused
    assert t.nominal_available("team-a-cq", CPU) == 0
    assert cpus(t, "team-b-cq") == 2
    # a queue over its nominal quota (borrowing 3) leaves the cohort that much less
    t = tree([cq("team-a-cq", "team-ab", "default-flavor", resource("cpu", "9"), reserved={"cpu": "12"}), b])
    assert cpus(t, "team-b-cq") == 0 and cpus(t, "team-a-cq") == 0


def test_no_cohort_no_borrowing():
    a = cq("alone", "", "default-flavor", resource("cpu", "4"), reserved={"cpu": "1"})
    assert cpus(tree([a]), "alone") == 3
    # over-admitted (quota lowered under what is reserved): Kueue's Available is never below 0
    assert cpus(tree([cq("alone", "", "default-flavor", resource("cpu", "4"), reserved={"cpu": "6"})]), "alone") == 0


def test_a_cohorts_own_quota_is_a_shared_pool():
    # cohort.md, Configuring Quotas: a ClusterQueue of nominalQuota 0 "may access the 12 shared CPUs defined by its Cohort"
    mine = cq("my-cluster-queue", "hello-cohort", "default-flavor", resource("cpu", "0"))
    pool = cohort("hello-cohort", "", "default-flavor", resource("cpu", "12"))
    assert cpus(tree([mine], [pool]), "my-cluster-queue") == 12
    # and without the Cohort object the cohort has no quota of its own
    assert cpus(tree([mine]), "my-cluster-queue") == 0


def test_hierarchical_cohorts_borrow_up_the_tree_within_each_borrowing_limit():
    # root-cohort lends 10; org may borrow at most 3 of it (its borrowingLimit); team-x has 2 of its own
    root = cohort("root", "", "default-flavor", resource("cpu", "10"))
    org = cohort("org", "root", "default-flavor", resource("cpu", "0", borrowing="3"))
    x = cq("team-x", "org", "default-flavor", resource("cpu", "2"))
    t = tree([x], [root, org])
    assert cpus(t, "team-x") == 5  # 2 + org's 3 borrowed from the root
    # a queue of another org using 8 of the root's 10 leaves 2 for org
    y = cq("team-y", "other", "default-flavor", resource("cpu", "0"), reserved={"cpu": "8"})
    t = tree([x, y], [root, org, cohort("other", "root")])
    assert cpus(t, "team-x") == 4


def test_a_cycle_of_cohorts_does_not_hang():
    a = cq("a", "c1", "default-flavor", resource("cpu", "2"))
    t = tree([a], [cohort("c1", "c2"), cohort("c2", "c1")])
    assert cpus(t, "a") == 2


def gpu_state(queues: list[dict], cohorts: list[dict] = ()) -> KueueState:
    kueue = KueueState()
    kueue.replace("localqueues", [{"metadata": {"namespace": "jhub", "name": "team"}, "spec": {"clusterQueue": "team-cq"}}])
    kueue.replace("clusterqueues", queues)
    kueue.replace(
        "resourceflavors", [{"metadata": {"name": "h100"}, "spec": {"nodeLabels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}}]
    )
    kueue.replace("cohorts", list(cohorts))
    kueue.synced = dict.fromkeys(STREAMS, True)
    return kueue


def test_the_page_counts_what_kueue_would_admit_by_borrowing():
    mine = cq("team-cq", "gpus", "h100", resource(GPU, "1"), reserved={GPU: "1"})
    other = cq("other-cq", "gpus", "h100", resource(GPU, "4"), reserved={GPU: "1"})
    kueue = gpu_state([mine, other])
    room = kueue.room(H100, Notebook(), "jhub", "team")
    # its own GPU is taken; 3 of the other queue's are unused and lent: a 2-GPU server fits too
    assert room == QueueRoom("team", free=3, largest=2, borrowed=3, cohort="gpus")
    assert queue_words("team", room.free or 0, 5, room.borrowed, room.cohort) == (
        "5 free on the nodes; your queue 'team' allows 3 more by borrowing from cohort 'gpus'"
    )
    # a borrowing limit of 1 caps it
    kueue = gpu_state([cq("team-cq", "gpus", "h100", resource(GPU, "1", borrowing="1"), reserved={GPU: "1"}), other])
    assert kueue.room(H100, Notebook(), "jhub", "team") == QueueRoom("team", free=1, largest=1, borrowed=1, cohort="gpus")
    # the other queue lends none (lendingLimit 0): none more
    kueue = gpu_state([mine, cq("other-cq", "gpus", "h100", resource(GPU, "4", lending="0"), reserved={GPU: "1"})])
    assert kueue.room(H100, Notebook(), "jhub", "team") == QueueRoom("team", free=0, largest=0)
    # some of its own and some borrowed
    kueue = gpu_state([cq("team-cq", "gpus", "h100", resource(GPU, "2"), reserved={GPU: "1"}), other])
    room = kueue.room(H100, Notebook(), "jhub", "team")
    assert room == QueueRoom("team", free=4, largest=4, borrowed=3, cohort="gpus")
    assert queue_words("team", 4, 6, room.borrowed, room.cohort).endswith("allows 4 more (3 by borrowing from cohort 'gpus')")
