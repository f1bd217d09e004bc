"""A view after an inventory event makes again only what moved (issue 39): the catalog is the very
objects of the last build until the settings or the discovered offerings change, and each row (and
so its card) is the very row of the last view until what it reads moves."""

from __future__ import annotations

from datetime import UTC, datetime

from gpuspawner.capacity.access import Requester
from gpuspawner.capacity.index import ClusterIndex
from gpuspawner.core.settingskey import SettingsKey
from gpuspawner.hub.catalogs import _built
from gpuspawner.offerings.catalog import CatalogConfig
from gpuspawner.page.cards import RowCache, option_views
from gpuspawner.page.views import OptionView

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8", "nvidia.com/gpu.memory": "81559"}
A100 = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.count": "8", "nvidia.com/gpu.memory": "40960"}


def node(name: str, labels: dict[str, str], gpus: int = 8) -> dict:
    allocatable = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    return {"metadata": {"name": name, "labels": dict(labels)}, "spec": {}, "status": {"allocatable": allocatable}}


def pod(name: str, on: str, gpus: int) -> dict:
    return {
        "metadata": {"namespace": "ns", "name": name},
        "spec": {"nodeName": on, "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
        "status": {"phase": "Running"},
    }


def cluster() -> ClusterIndex:
    index = ClusterIndex()
    index.replace(nodes=[node("h1", H100), node("a1", A100)], pods=[])
    return index


def gpu_offerings(catalog: list) -> list:
    return [o for o in catalog if o.resources]


def test_a_pod_event_keeps_the_catalogs_very_objects_a_node_or_settings_change_builds_it_again():
    index = cluster()
    config = CatalogConfig()
    first = _built(config, index)
    assert len(gpu_offerings(first)) == 2
    index.pod_event("ADDED", pod("p1", "h1", 2))  # a count moved, nothing discovered did
    again = _built(config, index)
    assert all(a is b for a, b in zip(first, again, strict=True))
    index.node_event("ADDED", node("h2", H100))  # a new node: what is discovered may differ
    assert not any(a is b for a, b in zip(gpu_offerings(first), gpu_offerings(_built(config, index)), strict=True))
    settled = _built(config, index)
    other = _built(CatalogConfig(overrides={gpu_offerings(settled)[0].slug: {"display_name": "Big GPU"}}), index)
    assert "Big GPU" in [o.display_name for o in other]
    assert "Big GPU" not in [o.display_name for o in _built(config, index)]
    assert _built(config, index)[0] is settled[0]  # (each settings keeps its own)


def test_a_row_whose_inputs_did_not_move_is_the_same_row_and_only_the_moved_one_is_made_again():
    index = cluster()
    catalog = gpu_offerings(_built(CatalogConfig(), index))
    kept = RowCache()

    def rows() -> dict[str, OptionView]:
        return {r.slug: r for r in option_views(catalog, Requester("ada"), index.availability, NOW, kept=kept)}

    before = rows()
    h100 = next(o.slug for o in catalog if "H100" in o.display_name)
    a100 = next(o.slug for o in catalog if "A100" in o.display_name)
    index.pod_event("ADDED", pod("p1", "h1", 2))
    after = rows()
    assert after[a100] is before[a100]  # nothing it reads moved
    assert after[h100] is not before[h100] and after[h100].free == before[h100].free - 2
    uncached = {r.slug: r for r in option_views(catalog, Requester("ada"), index.availability, NOW)}
    assert uncached == after  # (kept or made now, a row reads the same)
    index.pod_event("DELETED", pod("p1", "h1", 2))
    assert rows()[h100] is before[h100]  # back as it was: the row kept from the first view


def test_an_offering_equal_to_a_kept_one_but_another_object_gets_its_own_row():
    index = cluster()
    kept = RowCache()
    first = gpu_offerings(_built(CatalogConfig(), index))
    rows = option_views(first, Requester("ada"), index.availability, NOW, kept=kept)
    index.node_event("ADDED", node("a2", A100))
    index.node_event("DELETED", node("a2", A100))
    rebuilt = gpu_offerings(_built(CatalogConfig(), index))
    assert not any(a is b for a, b in zip(first, rebuilt, strict=True))
    again = option_views(rebuilt, Requester("ada"), index.availability, NOW, kept=kept)
    assert again == rows and not any(a is b for a, b in zip(again, rows, strict=True))


def test_a_rows_hash_is_its_fields_hash_kept_once():
    row = OptionView("s", "full", "H100", "", "", "", "", "1 of 8 free", 1, 8, "", (1,))
    same = OptionView("s", "full", "H100", "", "", "", "", "1 of 8 free", 1, 8, "", (1,))
    assert hash(row) == hash(same) and row == same and hash(row) == hash(row)
    assert {row: 1}[same] == 1


def test_settings_keys_compare_by_value_written_out_and_see_an_edit_in_place():
    offerings = [{"slug": "a", "counts": [1, 2]}]
    key = SettingsKey(offerings)
    assert key == SettingsKey([{"slug": "a", "counts": [1, 2]}]) and hash(key) == hash(SettingsKey(list(offerings)))
    offerings[0]["counts"].append(4)
    assert SettingsKey(offerings) != key
    hook = SettingsKey((offerings, print))  # marshal cannot write a function: its repr is the key
    assert isinstance(hook.key, str) and hook == SettingsKey((offerings, print))
    assert SettingsKey(1) != SettingsKey(True) and SettingsKey(1) != SettingsKey(1.0)
