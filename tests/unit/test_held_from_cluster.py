"""Held = what the cluster says is running (issue 38), the pure parts: the index tells the quota
ledger when a pod of its hub is bound or leaves, a grant ends when the pod it was made for
leaves (and only then), and the words the home page shows for a pod the cluster took away."""

from __future__ import annotations

from datetime import UTC, datetime

from gpuspawner.capacity.admission import ADMIT, REFUSE, Held, QuotaLedger, QuotaRequest, Quotas
from gpuspawner.capacity.index import ClusterIndex
from gpuspawner.hub.departures import departure, gone_at, home_notice
from tests.offerings import T4_SHARE, offering

T4 = offering(T4_SHARE, 0)
QUOTA = Quotas(user={"total": 2})
NODE = {"metadata": {"name": "n1", "labels": {}}, "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"}}}


def pod(name: str, hub: str | None = "hub-a", user: str | None = "ann", phase: str = "Running", **meta) -> dict:
    labels = {"gpuspawner.io/offering": T4.slug}
    if user:
        labels["hub.jupyter.org/username"] = user
    if hub is not None:
        labels["gpuspawner.io/hub"] = hub
    return {
        "metadata": {"namespace": "jhub", "name": name, "labels": labels, **meta},
        "spec": {"nodeName": "n1", "containers": [{"name": "notebook", "resources": {"requests": {"cpu": "1"}}}]},
        "status": {"phase": phase},
    }


def watched_index() -> tuple[ClusterIndex, list[tuple[str, str, bool]]]:
    index = ClusterIndex()
    index.replace(nodes=[NODE], pods=[])
    told: list[tuple[str, str, bool]] = []
    for hub in ("hub-a", "hub-b", ""):
        index.observe_user_pods(hub, lambda key, present, hub=hub: told.append((hub, key, present)))
    return index, told


def test_the_index_tells_each_hub_when_its_user_pods_arrive_and_leave():
    index, told = watched_index()
    index.pod_event("ADDED", pod("a1"))
    index.pod_event("MODIFIED", pod("a1", deletionTimestamp="2026-11-28T10:00:00Z"))  # still there: nothing new
    index.pod_event("ADDED", pod("b1", hub="hub-b"))
    index.pod_event("ADDED", pod("x", user=None))  # not a hub user's pod: nobody is told
    index.pod_event("ADDED", pod("none", hub=None))
    assert told == [("hub-a", "jhub/a1", True), ("hub-b", "jhub/b1", True), ("", "jhub/none", True)]
    told.clear()
    index.pod_event("MODIFIED", pod("a1", phase="Failed"))  # evicted by its kubelet: terminal, it holds nothing
    index.pod_event("DELETED", pod("b1", hub="hub-b"))
    index.pod_event("MODIFIED", pod("none", hub="hub-a"))  # relabelled: it left one hub for another
    assert told == [("hub-a", "jhub/a1", False), ("hub-b", "jhub/b1", False), ("", "jhub/none", False), ("hub-a", "jhub/none", True)]
    told.clear()
    index.replace(pods=[pod("a2"), pod("none", hub="hub-a")])  # a relist: what went and what came while the watch was away
    assert sorted(told) == [("hub-a", "jhub/a2", True)]
    index.replace(pods=[])
    assert sorted(told[1:]) == [("hub-a", "jhub/a2", False), ("hub-a", "jhub/none", False)]


def test_an_observer_is_kept_once():
    index, _ = watched_index()
    ledger = QuotaLedger()
    for _ in range(3):
        index.observe_user_pods("hub-a", ledger.pod_event)
    assert index._observers["hub-a"].count(ledger.pod_event) == 1


def request(key: str, bound: dict[str, Held] | None = None) -> QuotaRequest:
    return QuotaRequest(key, T4, 1, "ann", QUOTA, {}, bound or {})


def test_a_pod_deleted_behind_the_hubs_back_frees_its_quota_at_its_event():
    index, _ = watched_index()
    ledger = QuotaLedger()
    index.observe_user_pods("hub-a", ledger.pod_event)

    def bound() -> dict[str, Held]:
        return {key: Held("shared", 1, p.user or "") for key, p in index.user_pods("hub-a").items()}

    assert ledger.grant(request("jhub/s1", bound())).action == ADMIT
    assert ledger.grant(request("jhub/s2", bound())).action == ADMIT
    assert ledger.check(request("jhub/s3", bound())).action == REFUSE  # two granted, not bound yet: they count
    index.pod_event("ADDED", pod("s1"))
    index.pod_event("ADDED", pod("s2"))
    refused = ledger.check(request("jhub/s3", bound()))
    assert refused.action == REFUSE and "already hold 2" in refused.message
    index.pod_event("DELETED", pod("s2"))  # an eviction: the hub never stops it
    assert "jhub/s2" not in ledger.grants
    assert ledger.grant(request("jhub/s3", bound())).action == ADMIT  # one held, one more allowed
    assert ledger.check(request("jhub/s4", bound())).action == REFUSE


def test_the_old_pod_of_a_server_leaving_late_does_not_take_the_new_grant():
    index, _ = watched_index()
    ledger = QuotaLedger()
    index.observe_user_pods("hub-a", ledger.pod_event)
    index.pod_event("ADDED", pod("s1"))  # the server's old pod, still going
    assert ledger.grant(request("jhub/s1")).action == ADMIT  # started again
    index.pod_event("DELETED", pod("s1"))  # the old pod's DELETED comes after the new grant
    assert "jhub/s1" in ledger.grants  # still on its way: it counts
    index.pod_event("ADDED", pod("s1"))  # the new pod is bound ...
    index.pod_event("DELETED", pod("s1"))  # ... and taken away
    assert ledger.grants == {}


def test_another_hubs_pod_of_the_same_name_never_ends_a_grant():
    index, _ = watched_index()
    ledger = QuotaLedger()
    index.observe_user_pods("hub-a", ledger.pod_event)
    assert ledger.grant(request("jhub/s1")).action == ADMIT
    index.pod_event("ADDED", pod("s1", hub="hub-b"))
    index.pod_event("DELETED", pod("s1", hub="hub-b"))
    assert "jhub/s1" in ledger.grants


def test_restored_grants_end_when_their_bound_pods_leave():
    ledger = QuotaLedger()
    saved = {"jhub/run": Held("shared", 1, "ann"), "jhub/gated": Held("shared", 1, "ann")}
    ledger.restore(saved, bound=["jhub/run"])
    ledger.pod_event("jhub/gated", False)  # (not bound yet: a Kueue-gated pod stays counted)
    ledger.pod_event("jhub/run", False)
    assert set(ledger.grants) == {"jhub/gated"}


def test_the_words_for_a_pod_the_cluster_took_away():
    now = datetime(2026, 11, 28, 14, 5, tzinfo=UTC)
    evicted = pod("s1", deletionTimestamp="2026-11-28T14:02:00Z")
    evicted["status"]["conditions"] = [
        {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI", "message": "Eviction API: evicting"}
    ]
    gone = departure(evicted)
    assert gone == {"reason": "EvictionByEvictionAPI", "message": "Eviction API: evicting", "node": "n1", "time": "2026-11-28T14:02:00Z"}
    assert gone_at(gone) == datetime(2026, 11, 28, 14, 2, tzinfo=UTC)
    assert home_notice(gone, False, "train", now)["text"] == (
        "Your server 'train' was stopped at Nov 28 14:02 UTC because its pod was evicted through the Kubernetes eviction API"
        " (a node drain, or an administrator) (the cluster says: Eviction API: evicting). Please start it again."
    )
    collected = pod("s1", deletionTimestamp="2026-11-28T14:02:00Z")
    collected["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC"}]
    assert "because its node n1 is gone from the cluster." in home_notice(departure(collected), False, "", now)["text"]
    plain = departure(pod("s1", deletionTimestamp="2026-11-28T14:02:00Z"))
    assert (
        "because its pod was deleted outside the hub (by an administrator or another program)" in home_notice(plain, False, "", now)["text"]
    )
    assert "because its node n1 is gone from the cluster" in home_notice(plain, True, "", now)["text"]  # the node left first
    kubelet = pod("s1", phase="Failed")
    kubelet["status"].update(reason="Evicted", message="The node was low on resource: memory.")
    assert (
        "because its node n1 evicted its pod (the cluster says: The node was low on resource: memory)"
        in home_notice(departure(kubelet), False, "", now)["text"]
    )
    unknown = home_notice(None, False, "", now)  # the watch missed its last words: when the hub found it gone
    assert unknown["time"] == now.isoformat() and unknown["text"].startswith(
        "Your server was stopped at Nov 28 14:05 UTC because its pod was deleted"
    )
