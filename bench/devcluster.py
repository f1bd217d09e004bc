"""The devcluster for one benchmark run: up in a scratch folder, KUBECONFIG set, down at the end."""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

from gpuspawner.devcluster.cluster import DevCluster


@contextlib.asynccontextmanager
async def running_devcluster(
    nodes: Iterable[dict[str, Any]] | None = None, kueue: bool = False, karpenter: bool = False
) -> AsyncIterator[DevCluster]:
    """Up with ``nodes`` (default: the standard GPU node classes); with ``kueue``, also the real
    Kueue (built from its Go module the first time: `gpuspawner devcluster build --kueue`); with
    ``karpenter``, the real Karpenter and its GPU pools at zero nodes (`... build --karpenter`)."""
    from kubernetes_asyncio.config import kube_config

    with tempfile.TemporaryDirectory() as tmp:
        cluster = DevCluster(Path(tmp))
        await asyncio.to_thread(cluster.up, list(nodes) if nodes is not None else None, 600.0, lambda m: None, kueue, karpenter)
        try:
            os.environ.update(cluster.env())  # KubeSpawner loads the default kubeconfig
            kube_config.KUBE_CONFIG_DEFAULT_LOCATION = str(cluster.kubeconfig)  # read by kubernetes_asyncio at import
            yield cluster
        finally:
            cluster.down(quiet=True)


def kubespawner_traits(changes: Any) -> dict[str, Any]:
    """KubeSpawner's settings for the pod a GPUSpawner offering's ``changes`` (``pod.podspec.pod_changes``)
    make: its limits (as guarantees too), node selection, tolerations and required affinity."""
    from gpuspawner.pod.podspec import merge_affinity_terms

    return {
        "extra_resource_limits": dict(changes.limits),
        "extra_resource_guarantees": dict(changes.limits),
        "node_selector": dict(changes.node_selector),
        "tolerations": [dict(t) for t in changes.tolerations],
        "node_affinity_required": merge_affinity_terms([], changes.node_affinity),
    }
