"""NodePools GPUSpawner cannot use, for the tests of tests/unit and tests/karpenter: the devcluster's
H100 pool (gpuspawner/devcluster/karpenter.py) renamed, naming a node class that does not exist,
and renamed again with no GPU in its template (and a taint of its own, so that the real Karpenter
never gives it a pending pod)."""

from __future__ import annotations

import copy
from typing import Any

from gpuspawner.devcluster.karpenter import POOLS, node_pool


def unusable_pools() -> tuple[dict[str, Any], dict[str, Any]]:
    """("elsewhere": node class ``no-such-class``, "cpu-only": no GPU labels)."""
    elsewhere = copy.deepcopy(node_pool(POOLS[0]))
    elsewhere["metadata"]["name"] = "elsewhere"
    elsewhere["spec"]["template"]["spec"]["nodeClassRef"]["name"] = "no-such-class"
    no_gpu = copy.deepcopy(node_pool(POOLS[0]))
    no_gpu["metadata"]["name"] = "cpu-only"
    no_gpu["spec"]["template"]["metadata"]["labels"] = {"team": "data"}
    no_gpu["spec"]["template"]["spec"]["taints"] = [{"key": "team", "value": "data", "effect": "NoSchedule"}]
    return elsewhere, no_gpu
