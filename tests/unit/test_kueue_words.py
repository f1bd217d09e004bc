"""What the hub says of a spawn Kueue holds, refuses, preempts, or cannot be asked about, from
Kueue's own shapes (Workload conditions, the visibility API's summary, the API server's
webhook refusal, the pod condition Kueue sets before it deletes a pod)."""

from __future__ import annotations

import json

from kubernetes_asyncio.client import ApiException

from gpuspawner.hub import kueue as hubkueue
from gpuspawner.hub.kueue import KueueReader, Place, cluster_queue_place, held_words, local_queue_place, stop_notice, webhook_refusal

PENDING = "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor h100, 1 more needed"


def workload(reason: str, message: str, status: str = "False") -> dict:
    return {
        "metadata": {"name": "pod-x-1"},
        "status": {"conditions": [{"type": "QuotaReserved", "status": status, "reason": reason, "message": message}]},
    }


def test_held_words_wait_refuse_or_say_the_place():
    assert held_words(None, "ml") == ("Waiting for GPU quota in queue ml.", None)
    words, refusal = held_words(workload("Pending", PENDING), "ml", Place(3, 7))
    assert words == f"Waiting for GPU quota in queue ml (position 3 of 7). Kueue says: {PENDING}." and refusal is None
    # the ClusterQueue's place, with the LocalQueue's beside it where they differ
    words, _ = held_words(workload("Pending", PENDING), "ml", Place(3, 3, "gpus", (2, 2)))
    assert words.startswith("Waiting for GPU quota in queue ml (position 3 of 3 in ClusterQueue gpus; 2 of 2 in queue ml). Kueue says:")
    assert held_words(None, "ml", Place(2, 2, "gpus", (2, 2)))[0] == "Waiting for GPU quota in queue ml (position 2 of 2)."
    _, refusal = held_words(workload("Inadmissible", "LocalQueue ml doesn't exist"), "ml")
    assert refusal == "Kueue cannot admit this server in queue ml: LocalQueue ml doesn't exist. Please tell your administrator."
    never = "couldn't assign flavors to pod set main: insufficient quota for nvidia.com/gpu in flavor h100, previously considered podsets requests (0) + current podset request (4) > maximum capacity (2)"
    assert held_words(workload("Pending", never), "ml")[1].startswith("Kueue can never admit this server in queue ml: couldn't assign")
    # one flavor can never fit, another may once quota frees up: waiting helps
    assert held_words(workload("Pending", f"{never}; {PENDING}"), "ml")[1] is None
    assert held_words(workload("QuotaReserved", "", "True"), "ml")[0] == "Kueue has reserved GPU quota in queue ml."


def pending(*items: tuple[str, str, str]) -> dict:
    """A PendingWorkloadsSummary as Kueue v0.17.0 answers it: (namespace, workload, LocalQueue) in
    queue order, with its positions (positionInLocalQueue counted by the LocalQueue's name only)."""
    seen: dict[str, int] = {}
    out = []
    for index, (ns, name, lq) in enumerate(items):
        out.append(
            {
                "metadata": {"namespace": ns, "name": name},
                "localQueueName": lq,
                "positionInClusterQueue": index,
                "positionInLocalQueue": seen.get(lq, 0),
            }
        )
        seen[lq] = seen.get(lq, 0) + 1
    return {"items": out}


def test_the_place_is_the_cluster_queues_with_the_local_queues_counted_by_namespace():
    # another team's Job first, then a same-named LocalQueue of another namespace, then ours
    summary = pending(("batch", "job-nightly", "batch"), ("other", "pod-y-1", "ml"), ("jhub", "pod-a-1", "ml"), ("jhub", "pod-x-1", "ml"))
    assert summary["items"][3]["positionInLocalQueue"] == 2  # Kueue v0.17.0's count: both "ml" queues together
    assert cluster_queue_place(summary, "jhub", "pod-x-1", "gpus") == Place(4, 4, "gpus", (2, 2))
    assert cluster_queue_place(summary, "jhub", "pod-a-1", "gpus") == Place(3, 4, "gpus", (1, 2))
    assert cluster_queue_place(summary, "jhub", "gone", "gpus") is None and cluster_queue_place(None, "jhub", "a", "gpus") is None
    # the workload of that name in another namespace is not ours
    assert cluster_queue_place(summary, "jhub", "pod-y-1", "gpus") is None


def test_a_local_queues_list_counts_only_its_own_namespace():
    # Kueue v0.17.0 lists the other namespace's same-named LocalQueue's workloads here too (#10672)
    summary = pending(("other", "pod-y-1", "ml"), ("jhub", "pod-a-1", "ml"), ("jhub", "pod-x-1", "ml"))
    assert local_queue_place(summary, "jhub", "pod-x-1") == Place(2, 2)
    assert local_queue_place(summary, "jhub", "pod-y-1") is None and local_queue_place(None, "jhub", "a") is None


def test_a_failed_webhook_call_is_a_503_message_naming_kueue():
    body = json.dumps(
        {
            "kind": "Status",
            "message": 'Internal error occurred: failed calling webhook "mpod.kb.io": failed to call webhook: Post "https://127.0.0.1:1/mutate--v1-pod": dial tcp 127.0.0.1:1: connect: connection refused',
        }
    )
    exc = ApiException(status=500, reason="Internal Server Error")
    exc.body = body
    assert webhook_refusal(exc).startswith("Kueue, which admits this cluster's servers, is not answering")
    other = ApiException(status=500)
    other.body = json.dumps({"message": 'failed calling webhook "policy.example.org": timeout'})
    assert webhook_refusal(other).startswith('The cluster\'s admission webhook "policy.example.org" is not answering')
    forbidden = ApiException(status=403)
    forbidden.body = body
    assert webhook_refusal(forbidden) is None and webhook_refusal(ValueError("x")) is None


def test_kueues_stop_reasons_in_words():
    preempted = "Preempted to accommodate a workload (UID: u, JobUID: j) due to prioritization in the ClusterQueue; preemptor path: /cq; preemptee path: /cq"
    notice = stop_notice(
        {"reason": "WorkloadEvictedDueToPreempted", "message": preempted, "lastTransitionTime": "2026-11-27T14:02:00Z"}, "research"
    )
    assert notice == {"time": "2026-11-27T14:02:00Z", "why": "to make room for a higher-priority job in queue research"}
    reclaimed = preempted.replace("prioritization in the ClusterQueue", "reclamation within the cohort")
    assert "took back the GPU quota" in stop_notice({"reason": "WorkloadEvictedDueToPreempted", "message": reclaimed}, "ml")["why"]
    ready = stop_notice({"reason": "WorkloadEvictedDueToPodsReadyTimeout", "message": "Exceeded the PodsReady timeout ns/pod-x."}, "ml")
    assert ready["why"] == "by Kueue in queue ml: it was not ready within the time Kueue allows (its waitForPodsReady timeout)"
    other = stop_notice({"reason": "WorkloadEvictedDueToDeactivated", "message": "The workload is deactivated."}, "ml")
    assert other["why"] == "by Kueue in queue ml: The workload is deactivated"


async def test_a_pod_kueue_stops_while_the_server_starts_ends_the_spawn_with_why():
    import asyncio
    import logging
    from types import SimpleNamespace

    from gpuspawner.hub import kueue as hubkueue
    from gpuspawner.hub.spawnstate import SpawnState
    from gpuspawner.names.kueuenames import QUEUE_LABEL
    from gpuspawner.pod.podspec import PodChanges

    state = SpawnState(pod_changes=PodChanges(labels={QUEUE_LABEL: "ml"}))
    state.decided.set()
    state.held_in = "ml"  # the progress said Kueue held it; now admitted, bound, not yet ready
    pod = {"metadata": {"uid": "u", "labels": {QUEUE_LABEL: "ml"}}, "spec": {"nodeName": "gpu-h100-8x"}}
    reflector = SimpleNamespace(pods={"ns/jupyter-a": pod}, ended={})
    spawner = SimpleNamespace(
        spawn_state=state,
        namespace="ns",
        pod_name="jupyter-a",
        pod_reflector=reflector,
        api=SimpleNamespace(api_client=None),
        log=logging.getLogger("t"),
        log_name="a",
    )
    watching = asyncio.ensure_future(hubkueue.held(spawner))
    await asyncio.sleep(0.1)
    assert not watching.done() and state.messages == ["Kueue admitted the server in queue ml."]
    reflector.ended["ns/jupyter-a"] = (
        {
            "type": "TerminationTarget",
            "status": "True",
            "reason": "WorkloadEvictedDueToPodsReadyTimeout",
            "message": "Exceeded the PodsReady timeout ns/pod-jupyter-a",
        },
        "ml",
    )
    refusal = await asyncio.wait_for(watching, 5)
    assert (
        refusal
        == "The server was stopped before it started by Kueue in queue ml: it was not ready within the time Kueue allows (its waitForPodsReady timeout)."
    )
    assert reflector.ended == {}  # taken: poll will not explain it a second time


class _Api:
    """A spawner's API client whose visibility API answers ``status`` (0: a summary), and
    ``cluster_status`` for a ClusterQueue's summary (0: one)."""

    def __init__(self, status: int, body: dict | None = None, cluster_status: int = 0) -> None:
        self.api_client, self.status, self.body, self.calls = self, status, body or {}, 0
        self.cluster_status, self.paths = cluster_status, []

    async def call_api(self, path, *args, **kwargs):
        self.calls += 1
        self.paths.append(path)
        status = self.cluster_status if "/clusterqueues/" in path else self.status
        if status:
            exc = ApiException(status=status)
            exc.body = json.dumps(self.body)
            raise exc
        return pending(("batch", "job-1", "batch"), ("ns", "w", "ml")) if "/clusterqueues/" in path else pending(("ns", "w", "ml"))


def reader(api: _Api, cluster_queue: str = "") -> KueueReader:
    found = KueueReader(api, "ns")
    found._cluster_queues["ml"] = cluster_queue  # (what the LocalQueue's spec.clusterQueue says)
    return found


async def test_a_visibility_api_not_served_is_asked_again_after_a_while(monkeypatch):
    monkeypatch.setattr(KueueReader, "unserved_until", 0.0)
    monkeypatch.setattr(KueueReader, "cluster_view_until", 0.0)
    clock = [1000.0]
    monkeypatch.setattr(hubkueue.time, "monotonic", lambda: clock[0])
    missing = _Api(404, {"kind": "Status", "reason": "NotFound"})  # no such API on this cluster
    assert await reader(missing).place("ml", "w") is None
    assert await reader(missing).place("ml", "w") is None and missing.calls == 1  # not asked again at once
    served = _Api(0)
    clock[0] += hubkueue.VISIBILITY_RETRY
    assert await reader(served).place("ml", "w") == Place(1, 1) and served.calls == 1  # asked again after a while
    # Kueue's own "no such LocalQueue" says the API is served: the next read asks at once
    no_queue = _Api(404, {"kind": "Status", "details": {"name": "ml", "group": "visibility.kueue.x-k8s.io", "kind": "localqueue"}})
    assert await reader(no_queue).place("ml", "w") is None
    assert await reader(served).place("ml", "w") == Place(1, 1) and served.calls == 2


async def test_the_cluster_queues_view_first_and_the_local_queues_where_it_may_not_be_read(monkeypatch):
    monkeypatch.setattr(KueueReader, "unserved_until", 0.0)
    monkeypatch.setattr(KueueReader, "cluster_view_until", 0.0)
    served = _Api(0)
    assert await reader(served, "gpus").place("ml", "w") == Place(2, 2, "gpus", (1, 1))
    assert served.paths == ["/apis/visibility.kueue.x-k8s.io/v1beta2/clusterqueues/gpus/pendingworkloads"]
    forbidden = _Api(0, cluster_status=403)  # an older chart: the LocalQueue's view only, and not asked again at once
    assert await reader(forbidden, "gpus").place("ml", "w") == Place(1, 1)
    assert await reader(forbidden, "gpus").place("ml", "w") == Place(1, 1)
    assert [p.split("/v1beta2/")[1] for p in forbidden.paths] == [
        "clusterqueues/gpus/pendingworkloads",
        "namespaces/ns/localqueues/ml/pendingworkloads",
        "namespaces/ns/localqueues/ml/pendingworkloads",
    ]


def test_the_home_pages_notice_names_the_server_and_always_the_date():
    from gpuspawner.hub.kueue import home_notice

    preempted = {
        "reason": "WorkloadEvictedDueToPreempted",
        "message": "Preempted to accommodate a workload (UID: u, JobUID: j) due to prioritization in the ClusterQueue",
        "lastTransitionTime": "2026-11-27T14:02:00Z",
    }
    assert home_notice((preempted, "research"), "train") == {
        "time": "2026-11-27T14:02:00Z",
        "text": "Your server 'train' was stopped at Nov 27 14:02 UTC to make room for a higher-priority job in queue research.",
    }
    assert home_notice((preempted, "research"), "")["text"].startswith("Your server was stopped at Nov 27 14:02 UTC ")
