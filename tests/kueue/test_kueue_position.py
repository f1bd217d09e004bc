"""A held spawn's place in its Kueue queue, from Kueue's own visibility API (v0.17.0), served on
the devcluster through the API server's aggregation layer (issue #27): the APIServices Kueue
ships are Available, the API server answers the LocalQueue's pending workloads with their
places, and a spawn Kueue holds says its place in its progress, moving up as the queue does."""

from __future__ import annotations

import asyncio

import pytest

from gpuspawner.devcluster.kueuecontroller import VISIBILITY_GROUP, VISIBILITY_VERSIONS
from gpuspawner.hub import kueue as hubkueue
from tests.conftest import wait_for
from tests.kueue.test_kueue_devcluster import queues
from tests.kueue.test_kueue_spawn import spawner_in

pytestmark = pytest.mark.cluster


def said(spawner, words: str) -> list[str]:
    """The spawn's progress messages that say ``words``."""
    return [m for m in spawner.spawn_state.messages if words in m]


def pending(kube, ns: str) -> list[dict]:
    """The LocalQueue ml-course's pending workloads, as Kueue's visibility API lists them."""
    return kube.request("GET", f"/apis/{VISIBILITY_GROUP}/v1beta2/namespaces/{ns}/localqueues/ml-course/pendingworkloads")["items"]


def test_kueues_visibility_api_is_served_through_the_api_server(kube):
    for version in VISIBILITY_VERSIONS:
        api_service = kube.request("GET", f"/apis/apiregistration.k8s.io/v1/apiservices/{version}.{VISIBILITY_GROUP}")
        conditions = {c["type"]: c["status"] for c in api_service["status"]["conditions"]}
        assert conditions.get("Available") == "True", api_service
        resources = kube.request("GET", f"/apis/{VISIBILITY_GROUP}/{version}")["resources"]
        assert "localqueues/pendingworkloads" in [r["name"] for r in resources]


async def test_a_held_spawn_says_its_place_in_the_queue_and_moves_up(cluster, kube, ns, monkeypatch):
    monkeypatch.setattr(hubkueue.KueueReader, "unserved_until", 0.0)  # (whatever an earlier test saw)
    queues(kube, ns, gpus=1)
    running = spawner_in(cluster, ns)
    await running.start()
    first, second = spawner_in(cluster, ns), spawner_in(cluster, ns)
    started = []
    try:
        started.append(asyncio.ensure_future(first.start()))
        await asyncio.to_thread(wait_for, lambda: said(first, "(position 1 of 1)"), "the first held spawn's place", timeout=60)
        started.append(asyncio.ensure_future(second.start()))
        await asyncio.to_thread(wait_for, lambda: said(second, "(position 2 of 2)"), "the second held spawn's place", timeout=60)
        await asyncio.to_thread(wait_for, lambda: said(first, "(position 1 of 2)"), "the first held spawn's place, 2 waiting", timeout=60)
        assert said(second, "(position 2 of 2)")[0].startswith("Waiting for GPU quota in queue ml-course (position 2 of 2).")

        items = pending(kube, ns)  # what the hub read, as the API server answers it
        assert [(i["positionInLocalQueue"], i["metadata"]["ownerReferences"][0]["name"]) for i in items] == [
            (0, first.pod_name),
            (1, second.pod_name),
        ], items
        assert not started[0].done() and not started[1].done()

        await running.stop(now=True)  # its GPU back: Kueue admits the first held spawn
        await asyncio.wait_for(started[0], 90)
        assert "Kueue admitted the server in queue ml-course." in first.spawn_state.messages
        await asyncio.to_thread(wait_for, lambda: said(second, "(position 1 of 1)"), "the second held spawn moved up", timeout=60)
        assert [i["metadata"]["ownerReferences"][0]["name"] for i in pending(kube, ns)] == [second.pod_name]
        assert not started[1].done()
    finally:
        for future in started:
            future.cancel()
            await asyncio.gather(future, return_exceptions=True)
        for spawner in (running, first, second):
            await spawner.stop(now=True)
