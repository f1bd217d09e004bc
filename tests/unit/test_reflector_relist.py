"""A pod that leaves while the pod watch is down keeps the cluster's words for it.

KubeSpawner's pod reflector lists again every ``restart_seconds`` (30 by default) and replaces its
pods whole; a pod deleted between the end of one watch and the next list has no DELETED event. The
home page's notice of a server whose pod left behind the hub's back reads what the reflector kept
of it (hub/departures.py): without this, such a pod read as "deleted outside the hub" although
the cluster had said it was evicted (a full CI run on a loaded machine failed so, in
tests/api/test_held_from_cluster.py)."""

from __future__ import annotations

from gpuspawner.hub.reflector import VerdictPodReflector

KEY = "ns/jupyter-ann"


def pod(evicted: bool = False) -> dict:
    status: dict = {"phase": "Running"}
    meta: dict = {"name": "jupyter-ann", "namespace": "ns"}
    if evicted:
        status["conditions"] = [
            {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI", "message": "Eviction API: evicting"}
        ]
        meta["deletionTimestamp"] = "2026-11-29T12:23:50Z"
    return {"metadata": meta, "spec": {"nodeName": "node-a"}, "status": status}


async def test_a_pod_a_relist_no_longer_has_is_gone_with_the_words_last_seen():
    reflector = VerdictPodReflector(namespace="ns", labels={"component": "singleuser-server"})
    other = "ns/jupyter-bo"
    reflector.resources = {KEY: pod(), other: pod()}  # the first list
    reflector.resources[KEY] = pod(evicted=True)  # the watch: evicted, its deletion begun
    assert reflector.gone == {}
    reflector.resources = {other: pod()}  # the next list: the pod went while the watch was down
    assert reflector.gone[KEY] == {
        "reason": "EvictionByEvictionAPI",
        "message": "Eviction API: evicting",
        "node": "node-a",
        "time": "2026-11-29T12:23:50Z",
    }
    assert other not in reflector.gone  # (still there: not gone)


async def test_a_pod_that_comes_back_in_the_list_is_not_gone_and_a_deleted_event_still_counts():
    reflector = VerdictPodReflector(namespace="ns", labels={"component": "singleuser-server"})
    reflector.resources = {KEY: pod()}
    reflector.resources = {KEY: pod()}  # listed again, still there
    assert reflector.gone == {}
    reflector.resources.pop(KEY, None)  # the watch's DELETED event, as KubeSpawner applies it
    assert reflector.gone[KEY]["node"] == "node-a" and reflector.gone[KEY]["reason"] == ""
