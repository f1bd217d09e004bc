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
