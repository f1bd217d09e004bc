"""`gpuspawner offerings` on a cluster whose GPU pools are Karpenter's and have no node yet: each
pool's offering is there, with its limit, and the pools it cannot use are named with the reason
(gpuspawner/offerings/nodepools.py, gpuspawner/tools/pools.py)."""

from __future__ import annotations

import json

from gpuspawner.devcluster.karpenter import POOLS
from gpuspawner.tools import cli
from tests.nodepools import unusable_pools


def test_offerings_of_pools_at_zero_nodes_and_the_pools_ignored(cluster, kube, capsys):
    assert kube.request("GET", "/api/v1/nodes?labelSelector=nvidia.com/gpu.present")["items"] == []
    elsewhere, no_gpu = unusable_pools()
    for extra in (elsewhere, no_gpu):
        cluster.karpenter().apply(extra)
    try:
        assert cli.main(["offerings", "--kubeconfig", str(cluster.kubeconfig)]) == 0
        table = capsys.readouterr().out
        assert cli.main(["offerings", "--kubeconfig", str(cluster.kubeconfig), "--json"]) == 0
        rows = {row["slug"]: row for row in json.loads(capsys.readouterr().out)}
    finally:
        for extra in (elsewhere, no_gpu):
            kube.request("DELETE", f"/apis/karpenter.sh/v1/nodepools/{extra['metadata']['name']}")
    assert "Autoscaled pools (Karpenter NodePools):" in table
    for pool in POOLS:
        assert f"  {pool.name}: " in table
    h100 = rows["gpu-nvidia-h100-80gb-hbm3"]
    assert h100["pools"] == [{"name": "gpu-h100", "limit": 4, "nodes": 0, "room": 4}]
    assert (h100["capacity"], h100["free"]) == (0, 0)  # no node yet: nothing free now, exactly
    assert "gpu-h100: gpu-nvidia-h100-80gb-hbm3; up to 4 nodes, 0 now: can grow by 4" in table
    mig = [row for row in rows.values() if row["pools"] and row["pools"][0]["name"] == "gpu-a100-mig"]
    assert sorted(r["limits"] and next(iter(r["limits"])) for r in mig) == [
        "nvidia.com/mig-1g.5gb",
        "nvidia.com/mig-2g.10gb",
        "nvidia.com/mig-3g.20gb",
    ]
    assert "  elsewhere: ignored: its node class KWOKNodeClass no-such-class (karpenter.kwok.sh) does not exist" in table
    assert "  cpu-only: ignored: no GPU: its template's labels say none" in table
