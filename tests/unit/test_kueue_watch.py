"""The inventory's watch of Kueue's queues against a scripted API: listed, then watched, only once
asked for; Kueue not installed (404) or not readable (403) leaves each queue's limit unknown and
the nodes' counts untouched. (The real Kueue: tests/kueue/test_kueue_counts.py.)"""

from __future__ import annotations

import asyncio
import json

from gpuspawner.hub.inventory import Inventory
from gpuspawner.hub.optionalstreams import KUEUE_FORBIDDEN, KUEUE_NOT_SERVED
from gpuspawner.offerings.config import offering_from_config
from gpuspawner.pod.notebook import Notebook
from tests.unit.test_inventory_stream import Body, Nodes, event

H100 = offering_from_config({"slug": "h100", "kind": "full", "product": "NVIDIA-H100-80GB-HBM3"}, 0)
LOCAL = {"metadata": {"namespace": "jhub", "name": "team", "resourceVersion": "1"}, "spec": {"clusterQueue": "cq"}}
FLAVOR = {"metadata": {"name": "h100", "resourceVersion": "1"}, "spec": {"nodeLabels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}}


def cq(reserved: str, rv: str) -> dict:
    return {
        "metadata": {"name": "cq", "resourceVersion": rv},
        "spec": {
            "resourceGroups": [
                {
                    "coveredResources": ["nvidia.com/gpu"],
                    "flavors": [{"name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "2"}]}],
                }
            ]
        },
        "status": {"flavorsReservation": [{"name": "h100", "resources": [{"name": "nvidia.com/gpu", "total": reserved}]}]},
    }


class Api:
    """Nodes and pods that list once and stay quiet."""

    def __init__(self):
        self.list_node = Nodes()
        self.list_pod_for_all_namespaces = Nodes()


class Refusing(Body):
    def __init__(self, status: int):
        super().__init__(json.dumps({"message": "nope"}).encode())
        self.status = status


class Custom:
    """CustomObjectsApi's two list calls, answering from ``items`` by plural (or refusing with ``status``)."""

    def __init__(self, status: int = 200, refuse: tuple[str, ...] = ()):
        self.status, self.refuse = status, refuse  # refuse: only these plurals get ``status``
        self.calls: list[tuple] = []
        self.items = {"localqueues": [LOCAL], "clusterqueues": [cq("0", "1")], "resourceflavors": [FLAVOR], "cohorts": []}
        self.watch_events = {"clusterqueues": [event("MODIFIED", cq("1", "2"))]}

    async def _answer(self, plural: str, kwargs: dict):
        if self.status == 0 and plural in self.refuse:
            raise ConnectionResetError("Kueue's stream dropped")
        if self.status != 200 and (not self.refuse or plural in self.refuse):
            return Refusing(self.status)
        if kwargs.get("watch"):
            return Body(b"", self.watch_events.pop(plural, []))
        return Body(json.dumps({"items": self.items[plural], "metadata": {"resourceVersion": "1"}}).encode())

    async def list_cluster_custom_object(self, group, version, plural, **kwargs):
        self.calls.append((group, version, None, plural))
        return await self._answer(plural, kwargs)

    async def list_namespaced_custom_object(self, group, version, namespace, plural, **kwargs):
        self.calls.append((group, version, namespace, plural))
        return await self._answer(plural, kwargs)


async def until(check, tries: int = 500) -> None:
    for _ in range(tries):
        if check():
            return
        await asyncio.sleep(0.01)


async def test_queues_are_listed_then_watched_once_asked_for():
    custom = Custom()
    inventory = Inventory(Api(), kueue_api=custom)
    inventory.start()
    try:
        assert await inventory.wait_ready(5)
        assert custom.calls == []  # nothing of Kueue's until a spawner asks (kueue_queues set)
        inventory.watch_kueue("jhub")
        inventory.watch_kueue("jhub")  # once
        kueue = inventory.index.kueue

        def free() -> int | None:
            return kueue.room(H100, Notebook(), "jhub", "team").free

        await until(lambda: free() == 1)  # listed (2 - 0), then the watch's MODIFIED: 1 reserved
        assert free() == 1
        assert ("kueue.x-k8s.io", "v1beta2", "jhub", "localqueues") in custom.calls
        assert ("kueue.x-k8s.io", "v1beta2", None, "clusterqueues") in custom.calls
        assert ("kueue.x-k8s.io", "v1beta2", None, "resourceflavors") in custom.calls
    finally:
        await inventory.stop()


async def test_kueue_not_installed_or_not_readable_leaves_the_limit_unknown_and_the_nodes_counted():
    for status, why in ((404, KUEUE_NOT_SERVED), (403, KUEUE_FORBIDDEN)):
        inventory = Inventory(Api(), kueue_api=Custom(status), forbidden_retry=60)
        inventory.start()
        try:
            assert await inventory.wait_ready(5)
            inventory.watch_kueue(None)
            kueue = inventory.index.kueue
            await until(lambda: kueue.unavailable)  # noqa: B023 (awaited here, in this iteration)
            room = kueue.room(H100, Notebook(), "jhub", "team")
            assert not room.known and room.unknown == why
            assert inventory.ready and inventory.health.ready and not inventory.forbidden  # the nodes' counts stand
        finally:
            await inventory.stop()


async def test_one_kind_refused_keeps_the_limit_unknown_and_kueues_failures_are_not_outages():
    inventory = Inventory(Api(), kueue_api=Custom(403, refuse=("resourceflavors",)), forbidden_retry=60)
    inventory.start()
    try:
        assert await inventory.wait_ready(5)
        inventory.watch_kueue("jhub")
        kueue = inventory.index.kueue
        await until(lambda: kueue.synced["localqueues"] and kueue.synced["clusterqueues"] and kueue.unavailable)
        await asyncio.sleep(0.05)  # the other streams' watches are accepted: the refusal stays
        assert kueue.unavailable == KUEUE_FORBIDDEN and not kueue.room(H100, Notebook(), "jhub", "team").known
    finally:
        await inventory.stop()

    inventory = Inventory(Api(), kueue_api=Custom(0, refuse=("clusterqueues",)))
    inventory.start()
    try:
        assert await inventory.wait_ready(5)
        inventory.watch_kueue("jhub")
        await asyncio.sleep(0.3)  # the ClusterQueue stream fails and retries meanwhile
        assert inventory.stream_failures == 0 and inventory.health.ready and not inventory.last_error
        assert inventory.index.kueue.room(H100, Notebook(), "jhub", "team").unknown  # not listed: unknown, no number
    finally:
        await inventory.stop()
