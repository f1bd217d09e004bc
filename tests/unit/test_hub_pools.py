"""The hub's view of Karpenter's pools (gpuspawner/capacity/karpenterpools.py, on the cluster index): a pool
with no node yet has its offering in discovery, flagged autoscaled with its limit; counts stay
exact for the nodes that exist; the page says "a new node starts for you" where the pool can grow
and "the pool is at its limit" where it cannot, and admission refuses that at once."""

from __future__ import annotations

import copy
from datetime import UTC, datetime

from gpuspawner.capacity.access import Requester
from gpuspawner.capacity.admission import REFUSE, WARN, admit
from gpuspawner.capacity.index import ClusterIndex
from gpuspawner.capacity.karpenterpools import DEFAULT_SCALE_UP_MINUTES, NODECLAIMS, NODEPOOLS, PoolState
from gpuspawner.core import wording
from gpuspawner.core.model import PoolSize
from gpuspawner.devcluster.karpenter import POOLS, node_pool
from gpuspawner.devcluster.nodes import node_classes, node_manifest
from gpuspawner.offerings.catalog import CatalogConfig, build_catalog
from gpuspawner.offerings.nodepools import NODEPOOL_LABEL
from gpuspawner.page.cards import availability_text, option_views

H100 = "gpu-nvidia-h100-80gb-hbm3"
H100_POOL = next(p for p in POOLS if p.name == "gpu-h100")


def claim(name: str, pool: str) -> dict:
    return {"kind": "NodeClaim", "metadata": {"name": name, "labels": {NODEPOOL_LABEL: pool}}, "status": {}}


def pool_node(name: str, pool=H100_POOL) -> dict:
    """A node of ``pool``'s class, as Karpenter makes it (its pool's label)."""
    entry = next(e for e in node_classes() if e["x-gpuspawner-class"] == pool.node_class)
    node = node_manifest(entry, 0, name)
    node["metadata"]["labels"][NODEPOOL_LABEL] = pool.name
    return node


def index_with(pools, claims=(), nodes=(), claims_read=True) -> ClusterIndex:
    index = ClusterIndex()
    index.replace(nodes=list(nodes), pods=[])
    index.pools.replace(NODEPOOLS, pools)
    index.pools.synced[NODEPOOLS] = True
    index.pools.replace(NODECLAIMS, list(claims))
    index.pools.synced[NODECLAIMS] = claims_read
    return index


def limited(nodes: int) -> dict:
    pool = copy.deepcopy(node_pool(H100_POOL))
    pool["spec"]["limits"] = {"nodes": str(nodes)}
    return pool


def test_a_pool_with_no_node_yet_is_discovered_autoscaled_with_its_limit():
    index = index_with([node_pool(p) for p in POOLS])
    found = {o.slug: o for o in index.discovered()}
    h100 = found[H100]
    assert h100.pool == PoolSize(limit=4, nodes=0) and h100.scalable_nodes == 4
    assert h100.scale_up_minutes == DEFAULT_SCALE_UP_MINUTES
    assert len(found) == 5  # H100, three MIG profiles, T4 time-sliced: one offering each
    avail = index.availability(h100)
    assert (avail.capacity, avail.free) == (0, 0)  # exact: nothing is free until a node exists
    assert availability_text(h100, avail, "block", 0) == ("a new node starts for you, about 5 min", "")
    assert admit(h100, 1, avail, "block").action == WARN


def test_an_admins_override_sets_the_boot_time_and_the_catalog_keeps_the_pool():
    index = index_with([node_pool(H100_POOL)])
    config = CatalogConfig(discover=True, overrides={H100: {"scale_up_minutes": 1, "display_name": "H100"}})
    (h100,) = [o for o in build_catalog(config, discovered=index.discovered()) if o.slug == H100]
    assert (h100.scale_up_minutes, h100.pool, h100.display_name) == (1, PoolSize(4, 0), "H100")


def test_nodes_that_exist_count_exactly_and_nodeclaims_count_against_the_limit():
    index = index_with([limited(2)], claims=[claim("c1", "gpu-h100"), claim("c2", "gpu-h100")], nodes=[pool_node("n1")])
    (h100,) = [o for o in index.discovered() if o.slug == H100]
    assert h100.pool == PoolSize(2, 2) and h100.pool.at_limit  # the second NodeClaim is in flight
    avail = index.availability(h100)
    assert (avail.capacity, avail.free) == (8, 8)  # the node that exists: its eight GPUs
    assert admit(h100, 1, avail, "block").action != REFUSE  # free now: at the limit or not


def test_a_pool_at_its_limit_says_so_and_is_refused_at_once_whatever_the_policy():
    index = index_with([limited(1)], claims=[claim("c1", "gpu-h100")])
    (h100,) = [o for o in index.discovered() if o.slug == H100]
    avail = index.availability(h100)
    assert availability_text(h100, avail, "queue", 0) == (wording.POOL_AT_LIMIT_BADGE, "the pool is at its limit")
    for policy in ("block", "warn", "queue"):
        decision = admit(h100, 1, avail, policy)
        assert decision.action == REFUSE
        assert "the pool is at its limit (1 node)" in decision.message


def test_the_card_says_how_many_nodes_the_pool_may_have():
    index = index_with([node_pool(H100_POOL)])
    (h100,) = [o for o in index.discovered() if o.slug == H100]
    (row,) = option_views([h100], Requester("bob", frozenset()), index.availability, now=datetime(2026, 11, 24, 12, 0, tzinfo=UTC))
    assert row.description.endswith("Up to 4 H100 80GB nodes.")
    assert row.availability == "a new node starts for you, about 5 min"


def test_without_nodeclaims_the_pools_nodes_are_counted_and_without_nodepools_nothing_changes():
    index = index_with([limited(1)], nodes=[pool_node("n1")], claims_read=False)
    (h100,) = [o for o in index.discovered() if o.slug == H100]
    assert h100.pool == PoolSize(1, 1)
    plain = ClusterIndex()
    plain.replace(nodes=[pool_node("n1")], pods=[])
    (before,) = [o for o in plain.discovered() if o.slug == H100]
    assert before.pool is None and before.scalable_nodes == 0  # Karpenter not read: as today


def test_pool_events_move_the_discovery_only_where_the_offerings_may_change():
    index = index_with([node_pool(H100_POOL)])
    key = index.discovery()
    state: PoolState = index.pools
    state.event(NODEPOOLS, "MODIFIED", {**node_pool(H100_POOL), "status": {"resources": {"nodes": "0"}}})
    assert index.discovery() == key  # the status alone
    state.event(NODECLAIMS, "ADDED", claim("c1", "gpu-h100"))
    assert index.discovery() != key
    key = index.discovery()
    state.event(NODECLAIMS, "MODIFIED", {**claim("c1", "gpu-h100"), "status": {"conditions": []}})
    assert index.discovery() == key  # its steps
    (h100,) = [o for o in index.discovered() if o.slug == H100]
    assert h100.pool == PoolSize(4, 1)
    state.event(NODEPOOLS, "DELETED", node_pool(H100_POOL))
    assert not [o for o in index.discovered() if o.slug == H100]


def test_the_admins_price_per_hour_is_on_the_card_and_a_wrong_one_is_a_clear_error():
    """Karpenter's instance-type prices are not readable from its API (docs/autoscaling.md): the
    admin says an offering's price, per unit, and the card shows it."""
    import pytest

    from gpuspawner.offerings.entry import OfferingConfigError

    index = index_with([node_pool(H100_POOL)])
    config = CatalogConfig(discover=True, overrides={H100: {"price_per_hour": 5}})
    (h100,) = [o for o in build_catalog(config, discovered=index.discovered()) if o.slug == H100]
    (row,) = option_views([h100], Requester("bob", frozenset()), index.availability, now=datetime(2026, 11, 24, 12, 0, tzinfo=UTC))
    assert "5.00 per hour" in row.facts
    for wrong in (-1, "5", True):
        with pytest.raises(OfferingConfigError, match="price_per_hour.*must be a number >= 0"):
            build_catalog(CatalogConfig(discover=True, overrides={H100: {"price_per_hour": wrong}}), discovered=index.discovered())
