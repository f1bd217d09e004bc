"""The inventory's list-then-watch loop against a scripted API: resourceVersion bookkeeping,
relist on 410 Gone, reconnect after a dropped connection, readiness. (The real API server
path, with restarts, is tested in tests/integration/test_admission.py.)"""

from __future__ import annotations

import asyncio
import json

from gpuspawner.hub.inventory import Inventory


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
            [
                event("ADDED", pod("b", "n1", 2, "11"))[:25],
                event("ADDED", pod("b", "n1", 2, "11"))[25:],
                event("ERROR", {"kind": "Status", "code": 410, "message": "too old resource version"}),
            ],
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
        node = {"metadata": {"name": "n1", "labels": {"nvidia.com/gpu.product": "X"}}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}}
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


class Down:
    """An API server that refuses every connection, or (``api.lists`` > 0) answers that many
    lists first and drops the watches once both streams have listed."""

    def __init__(self, api: DownApi):
        self.api = api

    async def __call__(self, **kwargs):
        if self.api.up:
            return Body(b'{"items": [], "metadata": {"resourceVersion": "1"}}')
        if kwargs.get("watch") and self.api.lists:
            while self.api.listed < self.api.lists:
                await asyncio.sleep(0.01)
        if kwargs.get("watch") or self.api.listed >= self.api.lists:
            raise ConnectionRefusedError("Connect call failed ('127.0.0.1', 6443)")
        self.api.listed += 1
        return Body(b'{"items": [], "metadata": {"resourceVersion": "1"}}')


class DownApi:
    def __init__(self, lists: int = 0):
        self.lists, self.listed, self.up = lists, 0, False
        self.list_node = Down(self)
        self.list_pod_for_all_namespaces = Down(self)


async def test_an_api_server_that_is_down_is_noticed_at_once_not_waited_for():
    inventory = Inventory(DownApi())
    inventory.start()
    try:
        health = await inventory.wait_answered(60)  # returns at the first failure, not after 60 s
        assert not health.ready and health.answered and health.as_of is None
        assert "Connect call failed" in health.error
    finally:
        await inventory.stop()


async def test_counts_that_stop_being_live_say_since_when_and_come_back():
    import time

    api = DownApi(lists=2)  # one list each, then the API server goes away (the watches fail)
    inventory = Inventory(api)
    inventory.start()
    try:
        assert (await inventory.wait_answered(5)).answered
        for _ in range(500):
            if not inventory.ready and inventory.health.as_of is not None:
                break
            await asyncio.sleep(0.01)
        health = inventory.health
        assert not health.ready and health.answered
        assert time.time() - 60 < health.as_of <= time.time()
        first_loss = health.as_of
        await asyncio.sleep(0.5)  # more failed retries do not move the time the counts are from
        assert inventory.health.as_of == first_loss
        api.up = True
        assert await inventory.wait_ready(30)
        assert inventory.health.ready and inventory.health.as_of is None
    finally:
        await inventory.stop()


class PagedPods:
    """list_pod_for_all_namespaces answering in pages of ``limit`` (continue tokens), one list per
    script entry; each watch gives its chunks, the first one then 410 Gone (a relist)."""

    def __init__(self, lists: list[list[dict]], chunks: list[bytes]):
        self.lists, self.chunks, self.listed = lists, chunks, 0
        self.pages: list[int] = []

    async def __call__(self, limit: int = 500, _continue: str | None = None, watch: bool = False, **_):
        if watch:
            if self.listed == 1:
                return Body(b"", [*self.chunks, event("ERROR", {"kind": "Status", "code": 410, "message": "gone"})])
            return Body(b"")
        start = int(_continue or 0)
        items = self.lists[0][start : start + limit]
        self.pages.append(len(items))
        metadata = {"resourceVersion": str(10 * (self.listed + 1))}
        if start + limit < len(self.lists[0]):
            metadata["continue"] = str(start + limit)
        else:
            self.lists.pop(0)
            self.listed += 1
        return Body(json.dumps({"items": items, "metadata": metadata}).encode())


async def test_a_paged_relist_replaces_every_pod_and_an_event_may_come_byte_by_byte():
    first = [pod(name, "n1", 1, "5") for name in "abcde"]
    second = [pod(name, "n1", 1, "5") for name in "ace"]  # b and d went between the two lists
    added = event("ADDED", pod("f", "n1", 2, "11"))
    api = Api()
    api.list_pod_for_all_namespaces = PagedPods([first, second], [added[i : i + 1] for i in range(len(added))])
    inventory = Inventory(api, page_size=2)
    seen: list[tuple[str, str]] = []
    apply = inventory.index.pod_event

    def recording(kind: str, raw: dict) -> None:
        seen.append((kind, raw["metadata"]["name"]))
        apply(kind, raw)

    inventory.index.pod_event = recording  # type: ignore[method-assign]
    inventory.start()
    try:
        assert await inventory.wait_ready(5)
        for _ in range(500):
            if inventory.relists["pods"] == 2:
                break
            await asyncio.sleep(0.01)
        assert api.list_pod_for_all_namespaces.pages == [2, 2, 1, 2, 1]
        assert seen == [("ADDED", "f")]  # put together from one-byte chunks
        assert set(inventory.index.pods) == {"ns/a", "ns/c", "ns/e"}  # f, seen before the relist, is not in it either
        assert inventory.index.used["n1"]["nvidia.com/gpu"] == 3
    finally:
        await inventory.stop()


class Stopping:
    """An API server shutting down: the watches it had stay open (and quiet), but a new
    connection is refused while ``refusing``, as kube-apiserver does after SIGTERM."""

    def __init__(self) -> None:
        self.refusing = False
        self.list_node = self._call
        self.list_pod_for_all_namespaces = self._call

    async def _call(self, **kwargs):
        if self.refusing and not kwargs.get("watch"):
            raise ConnectionRefusedError("Connect call failed ('127.0.0.1', 6443)")
        return Body(b'{"items": [], "metadata": {"resourceVersion": "1"}}')


async def test_an_api_server_that_stops_taking_connections_is_noticed_while_its_watches_stay_open():
    api = Stopping()
    inventory = Inventory(api, heartbeat=0.02)
    inventory.start()
    try:
        assert await inventory.wait_ready(5)
        api.refusing = True  # nobody spawns: only the inventory's own question can notice
        for _ in range(500):
            if not inventory.health.ready:
                break
            await asyncio.sleep(0.01)
        health = inventory.health
        assert not health.ready and "Connect call failed" in health.error and health.as_of is not None
        assert inventory.ready  # the streams themselves never failed
        api.refusing = False
        for _ in range(2000):  # the probe asks again (backoff from 0.5 s) and the counts are live again
            if inventory.health.ready:
                break
            await asyncio.sleep(0.01)
        assert inventory.health.ready
    finally:
        await inventory.stop()


class Slow(Stopping):
    timed_out = 0

    async def _call(self, **kwargs):
        if self.refusing and not kwargs.get("watch"):
            self.timed_out += 1
            raise TimeoutError()
        return await super()._call(**kwargs)


async def test_a_slow_answer_to_the_heartbeat_is_not_an_outage():
    api = Slow()
    inventory = Inventory(api, heartbeat=0.01)
    inventory.start()
    try:
        assert await inventory.wait_ready(5)
        api.refusing = True
        for _ in range(2000):  # five heartbeats, each timing out
            if api.timed_out >= 5:
                break
            await asyncio.sleep(0.01)
        assert api.timed_out >= 5
        assert inventory.health.ready and not inventory.unreachable
    finally:
        await inventory.stop()


class Restarting:
    """resource.k8s.io/v1 of an API server that restarts: the first watch drops, the next request is
    answered 404 (the API not installed yet while the server starts), then it is served again."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def __call__(self, **kwargs):
        self.calls.append("watch" if kwargs.get("watch") else "list")
        if kwargs.get("watch"):
            return Body(b"", [], fail_after=self.calls.count("watch") == 1)
        if self.calls.count("list") == 2:
            return NotServed()
        return Body(b'{"items": [], "metadata": {"resourceVersion": "1"}}')


class NotServed(Body):
    status = 404

    def __init__(self) -> None:
        super().__init__(b'{"message": "the server could not find the requested resource"}')


class DraApi:
    def __init__(self) -> None:
        self.list_resource_slice = Restarting()
        self.list_device_class = Restarting()
        self.list_resource_claim_for_all_namespaces = Restarting()


async def test_a_dra_stream_refused_once_after_a_drop_is_asked_again_soon_not_after_forbidden_retry():
    dra = DraApi()
    inventory = Inventory(Api(), dra_api=dra, forbidden_retry=3600, heartbeat=3600)
    inventory.start()
    try:
        assert await inventory.wait_ready(5)
        for _ in range(1000):
            if all(s.calls.count("list") >= 3 for s in vars(dra).values()) and inventory.index.dra.synced:
                break
            await asyncio.sleep(0.01)
        assert all(s.calls.count("list") >= 3 for s in vars(dra).values()), {k: s.calls for k, s in vars(dra).items()}
        assert inventory.index.dra.synced
    finally:
        await inventory.stop()


def test_an_inventory_started_in_another_event_loop_is_not_this_loops(monkeypatch):
    """One process, two event loops (a test module's own loop in a thread, say): the inventory the
    first started never hears another event once that loop stops, so the second starts its own."""
    monkeypatch.setattr(Inventory, "_instances", {})
    api = Api()

    async def shared() -> tuple[Inventory, Inventory | None]:
        return Inventory.shared(api), Inventory.running(api)

    first_loop, second_loop = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        first, _ = first_loop.run_until_complete(shared())
        second, running = second_loop.run_until_complete(shared())
        assert second is not first and running is second
        again, _ = second_loop.run_until_complete(shared())
        assert again is second  # in its own loop it is shared
    finally:
        first_loop.run_until_complete(first.stop())
        second_loop.run_until_complete(second.stop())
        first_loop.close()
        second_loop.close()


class NeverServed:
    """An API that is not served at all (DeviceTaintRules before Kubernetes 1.37): every list answers 404."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, **kwargs):
        self.calls += 1
        return NotServed()


async def test_device_taint_rules_not_served_leave_the_dra_counts_live_without_rules():
    """Issue 41: the fifth DRA stream is optional: a 404 (before 1.37) or 403 counts as no rules, once said."""
    dra = DraApi()
    dra.list_device_taint_rule = NeverServed()  # type: ignore[attr-defined]
    inventory = Inventory(Api(), dra_api=dra, forbidden_retry=3600, heartbeat=3600)
    inventory.start()
    try:
        assert await inventory.wait_ready(5)
        for _ in range(1000):
            if inventory.index.dra.synced:
                break
            await asyncio.sleep(0.01)
        assert inventory.index.dra.synced and inventory.index.dra.rules == {}
        assert dra.list_device_taint_rule.calls == 1  # type: ignore[attr-defined]  # asked again only after forbidden_retry
    finally:
        await inventory.stop()
