"""`gpuspawner offerings` on a cluster without Karpenter's CRDs: the offerings of its nodes as
before, and one line saying no autoscaled pool was read, and why (gpuspawner/tools/pools.py)."""

from __future__ import annotations

from gpuspawner.tools import cli


def test_no_nodepools_served_says_so_in_one_line(devcluster, capsys):
    assert cli.main(["offerings", "--kubeconfig", str(devcluster.kubeconfig)]) == 0
    out = capsys.readouterr().out
    assert "gpu-nvidia-h100-80gb-hbm3" in out  # the nodes' offerings, as without Karpenter
    lines = [line for line in out.splitlines() if "utoscaled pools" in line]
    assert lines == ["# Autoscaled pools: none read (Karpenter's NodePools (karpenter.sh/v1) are not served by this cluster)."]


async def test_the_hubs_inventory_without_karpenter_says_so_once_and_discovers_as_before(devcluster, caplog):
    """The hub's inventory asked to watch NodePools on a kube-apiserver without Karpenter's CRDs:
    one log line, asked again quietly, the nodes' offerings as before, none flagged autoscaled."""
    import asyncio

    from kubespawner.clients import load_config, shared_client

    from gpuspawner.capacity.karpenterpools import NODECLAIMS, NODEPOOLS
    from gpuspawner.hub.inventory import Inventory
    from gpuspawner.hub.optionalstreams import POOLS_NOT_SERVED

    load_config()
    inventory = Inventory(shared_client("CoreV1Api"), forbidden_retry=0.05)
    inventory.start()
    try:
        assert await inventory.wait_ready(120), inventory.last_error
        before = inventory.index.discovered()
        caplog.set_level("INFO", logger="gpuspawner.hub.inventory")
        inventory.watch_pools()

        async def refused_and_asked_again() -> None:
            while min(inventory.refusals[NODEPOOLS], inventory.refusals[NODECLAIMS]) < 3:
                await asyncio.sleep(0.02)

        await asyncio.wait_for(refused_and_asked_again(), 120)  # (a guard against a hang, not a timing)
        said = [r.getMessage() for r in caplog.records if "Karpenter" in r.getMessage()]
        assert said == [
            f"inventory: Karpenter's pools are not read: {POOLS_NOT_SERVED}; offerings come from the nodes and the settings as before"
        ]
        assert inventory.index.discovered() == before and all(o.pool is None and not o.scalable_nodes for o in before)
        assert inventory.ready  # the nodes' counts are untouched
    finally:
        await inventory.stop()
