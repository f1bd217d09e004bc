"""Karpenter's NodePools -> offerings (gpuspawner/offerings/nodepools.py): a pool with no node
yet offers what its nodes will serve, under the slug its real nodes give."""

from __future__ import annotations

import copy
import json

from gpuspawner.devcluster.karpenter import NODE_CLASS, NODE_CLASS_GROUP, POOLS, node_pool
from gpuspawner.devcluster.nodes import node_classes, node_manifest
from gpuspawner.offerings.discovery import discover
from gpuspawner.offerings.nodepools import NODEPOOL_LABEL, Pool, read_pools
from tests.nodepools import unusable_pools

CLASSES = [(NODE_CLASS_GROUP, "KWOKNodeClass", NODE_CLASS)]


def test_each_pool_offers_what_a_node_of_its_class_offers():
    entries = {e["x-gpuspawner-class"]: e for e in node_classes()}
    for pool in POOLS:
        pools, offerings, ignored = read_pools([node_pool(pool)], CLASSES)
        real = discover([node_manifest(entries[pool.node_class], 0)])
        assert ignored == []
        assert [o.slug for o in offerings] == [o.slug for o in real]
        assert [o.resources for o in offerings] == [o.resources for o in real]
        assert [o.tolerations for o in offerings] == [o.tolerations for o in real]
        assert pools == [Pool(pool.name, tuple(o.slug for o in real), pool.max_nodes, 0)]


def test_limits_and_the_nodes_a_pool_has():
    h100 = node_pool(POOLS[0])
    nodes = [{"metadata": {"name": f"n{i}", "labels": {NODEPOOL_LABEL: "gpu-h100"}}} for i in range(4)]
    (pool,), _, _ = read_pools([h100], CLASSES, nodes[:1])
    assert (pool.limit, pool.nodes, pool.room) == (4, 1, 3)
    assert pool.describe() == "up to 4 nodes, 1 now: can grow by 3"
    (full,), _, _ = read_pools([h100], CLASSES, nodes)
    assert full.room == 0 and full.describe().endswith("the pool is at its limit")
    unlimited = copy.deepcopy(h100)
    del unlimited["spec"]["limits"]
    (free,), _, _ = read_pools([unlimited], CLASSES)
    assert free.room is None and free.describe() == "no node limit, 0 now"


def test_pools_it_cannot_use_are_ignored_with_the_reason():
    unknown_class, no_gpu = unusable_pools()
    odd_limit = copy.deepcopy(node_pool(POOLS[0]))
    odd_limit["metadata"]["name"] = "odd"
    odd_limit["spec"]["limits"] = {"nodes": "lots"}
    pools, offerings, ignored = read_pools([unknown_class, no_gpu, odd_limit], CLASSES)
    assert pools == [] and offerings == []
    reasons = dict(ignored)
    assert reasons["elsewhere"] == "its node class KWOKNodeClass no-such-class (karpenter.kwok.sh) does not exist"
    assert reasons["cpu-only"].startswith("no GPU: its template's labels say none (nvidia.com/gpu.count")
    assert reasons["odd"] == "its limits.nodes 'lots' is not a whole number of nodes"
    # node classes unknown (not readable): not checked
    assert [p.name for p in read_pools([unknown_class], None)[0]] == ["elsewhere"]


def test_offerings_cli_reads_nodepools_offline(tmp_path, capsys):
    from gpuspawner.tools import cli

    cpu = [node_manifest(e, i) for i, e in enumerate(node_classes()) if e["x-gpuspawner-class"] == "cpu"]
    (tmp_path / "nodes.json").write_text(json.dumps({"items": cpu}))
    (tmp_path / "pools.json").write_text(json.dumps({"items": [node_pool(p) for p in POOLS]}))
    args = ["offerings", "--nodes", str(tmp_path / "nodes.json"), "--nodepools", str(tmp_path / "pools.json")]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "  gpu-h100: gpu-nvidia-h100-80gb-hbm3; up to 4 nodes, 0 now: can grow by 4" in out
    assert "gpu-nvidia-h100-80gb-hbm3" in out.split("Autoscaled pools")[0]  # its offering, in the table
    (tmp_path / "pools.json").write_text("[not json")
    assert cli.main(args) == 2
    assert "pools.json: not JSON" in capsys.readouterr().err


def test_the_autoscaled_demo_finds_its_pools_and_says_about_1_min(monkeypatch):
    """make demo AUTOSCALE=1 declares no pool offering (hub_config/demo_config.py): the hub's
    discovery finds each pool's, autoscaled with its limit, and the demo's overrides give them its
    boot time (about 1 min) and who may use them; each one's pod is placed on its pool's nodes (so
    the real Karpenter makes a node of that pool for it)."""
    from gpuspawner.capacity.counts import availability
    from gpuspawner.capacity.index import ClusterIndex
    from gpuspawner.capacity.karpenterpools import NODEPOOLS
    from gpuspawner.offerings.catalog import CatalogConfig, build_catalog
    from gpuspawner.offerings.nodepools import template_node
    from gpuspawner.tools.cli import _config_from_file

    monkeypatch.setenv("GPUSPAWNER_DEMO_AUTOSCALE", "1")
    settings = _config_from_file("hub_config/demo_config.py").GPUSpawner
    assert not [e for e in settings.offerings if e.get("scalable_nodes")]
    index = ClusterIndex()
    index.pools.replace(NODEPOOLS, [node_pool(p) for p in POOLS])
    index.pools.synced[NODEPOOLS] = True
    config = CatalogConfig(offerings=settings.offerings, overrides=settings.offering_overrides)
    catalog = {o.slug: o for o in build_catalog(config, discovered=index.discovered())}
    for pool in POOLS:
        (found,), offerings, _ = read_pools([node_pool(pool)], CLASSES)
        for slug in found.slugs:
            offering = catalog[slug]
            assert (offering.scalable_nodes, offering.scale_up_minutes) == (pool.max_nodes, 1), slug
            assert offering.pool is not None and offering.pool.limit == pool.max_nodes
            assert offering.groups, slug
            node = template_node(node_pool(pool))
            assert availability(offering, [node], []).nodes == (node["metadata"]["name"],)
    assert catalog["gpu-nvidia-h100-80gb-hbm3"].price_per_hour == 5.0
