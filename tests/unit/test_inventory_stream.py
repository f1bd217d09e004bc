"""The inventory's list-then-watch loop against a scripted API: resourceVersion bookkeeping,
relist on 410 Gone, reconnect after a dropped connection, readiness. (The real API server
path, with restarts, is tested in tests/integration/test_admission.py.)"""

from __future__ import annotations

import asyncio
import json

from gpuspawner.inventory import Inventory


def pod(name: str, node: str, gpus: int, rv: str) -> dict:
    return {
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv},
        "spec": {"nodeName": node, "containers": [{"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
        "status": {"phase": "Running"},
    }


class Body:
    """What kubernetes_asyncio returns with _preload_content=False (an aiohttp response)."""

    def __init__(self, payload: bytes, chunks: list[bytes] | None = None, fail_after: bool = False):
        self.payload, self.chunks, self.fail_after = payload, chunks or [], fail_after
        self.content = self

    async def read(self) -> bytes:
        return self.payload

    async def iter_any(self):
        for chunk in self.chunks:
            yield chunk
            await asyncio.sleep(0)
        if self.fail_after:
            raise ConnectionResetError("API server went away")
        await asyncio.sleep(3600)  # an open watch that stays quiet

    def release(self) -> None:
        pass


def event(kind: str, obj: dict) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


class ScriptedPods:
    """list_pod_for_all_namespaces: answers lists and watches from a script, records the calls."""

    def __init__(self):
        self.calls: list[dict] = []
        self.watches = [
            # 1st watch: an event split across chunks, then 410 Gone -> relist
            [event("ADDED", pod("b", "n1", 2, "11"))[:25], event("ADDED", pod("b", "n1", 2, "11"))[25:],
             event("ERROR", {"kind": "Status", "code": 410, "message": "too old resource version"})],
            # 2nd watch (after the relist): a bookmark, then the connection drops
            ([event("BOOKMARK", {"metadata": {"resourceVersion": "30"}})], True),
            # 3rd watch (after the reconnect and relist): a deletion
            [event("DELETED", pod("c", "n1", 1, "41"))],
        ]
        self.lists = [
            ([pod("a", "n1", 1, "5")], "10"),
            ([pod("a", "n1", 1, "5"), pod("c", "n1", 1, "21")], "20"),
            ([pod("a", "n1", 1, "5"), pod("c", "n1", 1, "21")], "40"),
        ]

    async def __call__(self, **kwargs):
        self.calls.append(kwargs)
        if kwargs.get("watch"):
            script = self.watches.pop(0) if self.watches else []
            chunks, fail = script if isinstance(script, tuple) else (script, False)
            return Body(b"", chunks, fail)
        items, version = self.lists.pop(0)
        return Body(json.dumps({"items": items, "metadata": {"resourceVersion": version}}).encode())


class Nodes:
    async def __call__(self, **kwargs):
        if kwargs.get("watch"):
            return Body(b"")
        node = {"metadata": {"name": "n1", "labels": {"nvidia.com/gpu.product": "X"}},
                "status": {"allocatable": {"nvidia.com/gpu": "8"}}}
        return Body(json.dumps({"items": [node], "metadata": {"resourceVersion": "1"}}).encode())


class Api:
    def __init__(self):
        self.list_node = Nodes()
        self.list_pod_for_all_namespaces = ScriptedPods()


async def test_list_then_watch_relists_on_410_and_reconnects():
    api = Api()
    inventory = Inventory(api)
    inventory.start()
    try:
        assert await inventory.wait_ready(5)
        pods = api.list_pod_for_all_namespaces
        for _ in range(200):
            if not pods.watches and "ns/c" not in inventory.index.pods:
                break
            await asyncio.sleep(0.01)
        watches = [c for c in pods.calls if c.get("watch")]
        lists = [c for c in pods.calls if not c.get("watch")]
        # Each watch resumes from the version the list (or the last event) gave.
        assert [w["resource_version"] for w in watches] == ["10", "20", "40"]
        assert all(w["allow_watch_bookmarks"] and w["field_selector"] for w in watches)
        assert len(lists) == 3 and inventory.relists["pods"] == 3
        # After all that: a and the relisted c were counted, b vanished with the relist, c was deleted.
        assert set(inventory.index.pods) == {"ns/a"}
        assert inventory.index.used["n1"]["nvidia.com/gpu"] == 1
        assert inventory.ready and "API server went away" in inventory.last_error
    finally:
        await inventory.stop()
