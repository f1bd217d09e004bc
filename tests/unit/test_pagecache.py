"""The spawn page kept whole (gpuspawner.hub.pagecache): a kept page is found again only by a view
that would read the same. Its key must move with every inventory event that changes a count,
every reservation, the quota ledger, the wait queues, the clock, the settings (edited in place
too) and the user; and a key matches another user's view only where their pages cannot differ (issue 39)."""

from __future__ import annotations

from datetime import datetime
from types import SimpleNamespace
from zoneinfo import ZoneInfo

import pytest
from traitlets import Callable, Dict, HasTraits, List, Unicode, Union

from gpuspawner.capacity.access import Requester
from gpuspawner.capacity.admission import Held, QuotaLedger
from gpuspawner.capacity.index import ClusterIndex, Health
from gpuspawner.hub import pagecache
from gpuspawner.hub.inventory import Inventory
from gpuspawner.hub.pagecache import PageCache, view_key
from gpuspawner.hub.scheduling import WaitQueue
from gpuspawner.offerings.config import offering_from_config

NOON = datetime(2026, 11, 24, 12, 0, 5, tzinfo=ZoneInfo("Europe/Zurich"))
H100_LABELS = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
H100 = offering_from_config({"slug": "h100", "kind": "full", "product": "NVIDIA-H100-80GB-HBM3", "counts": [1]}, 0)


def node(name: str, gpus: int) -> dict:
    allocatable = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    return {"metadata": {"name": name, "labels": dict(H100_LABELS)}, "spec": {}, "status": {"allocatable": allocatable}}


def pod(name: str, on: str, gpus: int) -> dict:
    return {
        "metadata": {"namespace": "ns", "name": name},
        "spec": {"nodeName": on, "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
        "status": {"phase": "Running"},
    }


def cpu_node(name: str) -> dict:
    return {"metadata": {"name": name}, "spec": {}, "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"}}}


def cpu_pod(name: str, on: str) -> dict:
    limits = {"cpu": "2", "memory": "4Gi"}
    return {
        "metadata": {"namespace": "batch", "name": name},
        "spec": {"nodeName": on, "containers": [{"name": "c", "resources": {"limits": limits, "requests": limits}}]},
        "status": {"phase": "Running"},
    }


def test_a_hub_users_pod_moves_the_key_even_where_it_moves_no_count(inventory):
    """A user's server (KubeSpawner's user label) counts against quotas: its arrival is a new key."""
    ada = Spawner(user_quota={"total": 1})
    before = view_key(ada, "")
    server = cpu_pod("jupyter-ada", "cpu-a")
    server["metadata"]["labels"] = {"hub.jupyter.org/username": "ada"}
    inventory.index.node_event("ADDED", cpu_node("cpu-a"))
    after_node = view_key(ada, "")
    assert after_node != before
    inventory.index.pod_event("ADDED", server)
    assert view_key(ada, "") != after_node


class Spawner(HasTraits):
    """What view_key reads of a GPUSpawner: its configurable traits, the user and the hub's state."""

    offerings = List().tag(config=True)
    offering_overrides = Dict().tag(config=True)
    user_quota = Dict().tag(config=True)
    group_quotas = Dict().tag(config=True)
    user_gpu_budget = Dict().tag(config=True)
    group_gpu_budgets = Dict().tag(config=True)
    image = Unicode("quay.io/jupyter/base-notebook").tag(config=True)
    profile_list = Union([List(), Callable()]).tag(config=True)

    def __init__(self, name: str = "ada", groups=(), admin: bool = False, **traits) -> None:
        super().__init__(**traits)
        self.user = SimpleNamespace(name=name, admin=admin, groups=[SimpleNamespace(name=g, users=[]) for g in groups])
        self.hub_id, self.name, self.api = "hub", "", object()
        self.orm_spawner, self.user_options, self.refused_options = None, {}, None
        self.quota_ledger = QuotaLedger()
        self.clock = NOON

    def user_groups(self):
        return [(g.name, g) for g in self.user.groups]

    def requester(self) -> Requester:
        return Requester(self.user.name, frozenset(g.name for g in self.user.groups), self.user.admin)

    def now(self) -> datetime:
        return self.clock


@pytest.fixture
def inventory(monkeypatch):
    """The hub's running inventory, as view_key finds it: a real index, live."""
    index = ClusterIndex()
    index.replace(nodes=[node("h100-a", 8)], pods=[pod("other-team", "h100-a", 2)])
    found = SimpleNamespace(index=index, health=Health(ready=True), forbidden="")
    monkeypatch.setattr(Inventory, "running", classmethod(lambda cls, api: found))
    return found


def test_the_same_view_again_has_the_same_key(inventory):
    ada = Spawner()
    assert view_key(ada, "") == view_key(ada, "")


def test_an_inventory_event_that_moves_a_count_moves_the_key_and_one_that_does_not_leaves_it(inventory):
    ada = Spawner()
    index = inventory.index
    assert index.availability(H100).free == 6  # the page counted it when it was made: tracked from then on
    before = view_key(ada, "")
    index.node_event("MODIFIED", node("h100-a", 8))  # a status heartbeat: nothing counted changed
    index.pod_event("MODIFIED", pod("other-team", "h100-a", 2))
    index.node_event("ADDED", cpu_node("cpu-a"))  # a new node: a new key, whatever it serves
    assert view_key(ada, "") != before
    before = view_key(ada, "")
    index.pod_event("ADDED", cpu_pod("batch-1", "cpu-a"))  # another team's pod where no offering counts
    index.pod_event("DELETED", cpu_pod("batch-1", "cpu-a"))
    assert view_key(ada, "") == before
    index.pod_event("ADDED", pod("new-pod", "h100-a", 1))
    assert index.availability(H100).free == 5
    after = view_key(ada, "")
    assert after != before
    index.pod_event("DELETED", pod("new-pod", "h100-a", 1))  # the count is back where it was: still a new key
    assert view_key(ada, "") not in (before, after)


def test_every_write_of_the_index_moves_its_changes():
    index = ClusterIndex()
    seen = {index.changes}

    def moved() -> None:
        assert index.changes not in seen
        seen.add(index.changes)

    index.replace(nodes=[node("h100-a", 8)])
    moved()
    index.begin_pods()
    index.add_pods([pod("p", "h100-a", 1)])
    index.end_pods()
    moved()
    index.node_event("ADDED", node("h100-b", 4))
    moved()
    index.node_event("DELETED", node("h100-b", 4))
    moved()
    index.reserve("ns/spawn", H100, 1)  # admission holds units before any pod exists
    moved()
    index.release("ns/spawn")
    moved()
    assert ClusterIndex().changes not in seen  # another index never takes a value this one had


def test_a_dra_or_kueue_event_the_inventory_applies_moves_the_key():
    inventory = Inventory(api=object(), dra_api=object(), kueue_api=object())
    for stream in ("claims", "slices", "classes"):
        before = inventory.index.changes
        inventory._apply(stream)("ADDED", {"metadata": {"name": "x"}})
        assert inventory.index.changes != before, stream


def test_another_user_gets_the_key_only_where_nothing_on_the_page_reads_who_asks(inventory):
    researcher, student = Spawner("bob", groups=["researchers"]), Spawner("ada", groups=["students"])
    assert view_key(researcher, "") != view_key(student, "")
    # The same groups and nothing read by name: one page for both (a class's students share it) ...
    assert view_key(Spawner("ada"), "") == view_key(Spawner("bob"), "")
    # ... but not where the page reads the name: an offering open to a user by name, or a quota.
    by_name = [{"slug": "site", "kind": "custom", "resources": {"nvidia.com/gpu": 1}, "users": ["ada"]}]
    assert view_key(Spawner("ada", offerings=by_name), "") != view_key(Spawner("bob", offerings=by_name), "")
    overridden = {"gpu-nvidia-h100-80gb-hbm3": {"users": ["ada"]}}
    assert view_key(Spawner("ada", offering_overrides=overridden), "") != view_key(Spawner("bob", offering_overrides=overridden), "")
    assert view_key(Spawner("ada", user_quota={"total": 1}), "") != view_key(Spawner("bob", user_quota={"total": 1}), "")
    assert view_key(Spawner("ada", group_quotas={"x": {"total": 1}}), "") != view_key(Spawner("bob", group_quotas={"x": {"total": 1}}), "")
    ada_again = Spawner("ada")
    ada_again.user_options = {"offering": "gpu-nvidia-h100-80gb-hbm3"}  # her last choice is checked on her page only
    assert view_key(ada_again, "") != view_key(Spawner("bob"), "")
    admin = Spawner("ada", admin=True)
    assert view_key(admin, "") != view_key(Spawner("ada"), "")
    ada = Spawner("ada", groups=["students"])
    before = view_key(ada, "")
    ada.user.groups.append(SimpleNamespace(name="researchers", users=[]))  # the admin added her to a group
    assert view_key(ada, "") != before


def test_settings_changed_in_place_by_a_hook_move_the_key(inventory):
    ada = Spawner(offerings=[{"slug": "site", "kind": "custom", "resources": {"nvidia.com/gpu": 1}}])
    before = view_key(ada, "")
    ada.offerings[0]["groups"] = ["researchers"]  # edited in place: the same list object
    assert view_key(ada, "") != before


def test_the_users_quota_state_and_the_wait_queues_move_the_key(inventory):
    ada = Spawner(user_quota={"total": 1})
    before = view_key(ada, "")
    ada.quota_ledger.grants["ns/jupyter-ada"] = Held("full", 1, "ada")  # her spawn was admitted, no pod yet
    granted = view_key(ada, "")
    assert granted != before
    queue = WaitQueue.for_offering("page-key-test")
    queue.waiting["ns/someone"] = None
    try:
        assert view_key(ada, "") != granted
    finally:
        WaitQueue._queues.pop("page-key-test")


def test_the_users_last_and_refused_choices_move_the_key(inventory):
    ada = Spawner()
    before = view_key(ada, "")
    ada.user_options = {"offering": "h100"}
    chosen = view_key(ada, "")
    ada.refused_options = {"offering": "h100", "count": 8}
    assert len({before, chosen, view_key(ada, "")}) == 3


def test_the_clock_moves_the_key_each_minute_or_each_second_while_the_counts_are_not_live(inventory):
    ada = Spawner()
    before = view_key(ada, "")
    ada.clock = NOON.replace(second=59)
    assert view_key(ada, "") == before
    ada.clock = NOON.replace(minute=1)
    assert view_key(ada, "") != before
    inventory.health = Health(ready=False, as_of=1.0)  # the page says how old the counts are, to the second
    lost = view_key(ada, "")
    ada.clock = NOON.replace(minute=1, second=1)
    assert view_key(ada, "") != lost


def test_kubespawners_form_and_a_budget(inventory):
    ada = Spawner()
    assert view_key(ada, "<select>a</select>") != view_key(ada, "<select>b</select>")
    ada.user_gpu_budget = {"hours": 20, "window": "week"}  # its usage moves with the clock: made on each view
    assert view_key(ada, "") is None
    bob = Spawner("bob", profile_list=lambda spawner: [])  # may give other profiles (and images) on each call
    assert view_key(bob, "") is None


def test_the_cache_keeps_equal_pages_once_and_forgets_the_least_recently_viewed():
    cache = PageCache(size=3, max_chars=20)
    page = "x" * 8
    cache.put("ada", page)
    cache.put("bob", "x" * 8)  # the same page for another key: kept once
    assert cache.chars == 8 and cache.get("bob") is cache.get("ada")
    cache.put("cid", "y" * 8)
    assert cache.get("ada") == page  # ada is the most recent now
    cache.put("dan", "z" * 8)  # 24 characters: bob, the least recently viewed, goes
    assert cache.get("bob") is None and cache.get("ada") == page
    assert cache.chars <= 20 and len(cache.pages) <= 3
    cache.put("ada", "w" * 4)  # a key's new page replaces its old one
    assert cache.get("ada") == "w" * 4
    assert cache.chars == sum(len(p) for p in set(cache.pages.values()))


def test_a_page_found_is_counted_as_a_hit():
    cache = PageCache()
    assert cache.get("k") is None
    cache.put("k", "page")
    assert cache.get("k") == "page"
    assert (cache.hits, cache.misses) == (1, 1)
    assert pagecache.PAGES is not cache
