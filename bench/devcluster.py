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
async def running_devcluster(nodes: Iterable[dict[str, Any]] | None = None, kueue: bool = False) -> AsyncIterator[DevCluster]:
    """Up with ``nodes`` (default: the standard GPU node classes); with ``kueue``, also the real
    Kueue (built from its Go module the first time: `gpuspawner devcluster build --kueue`)."""
    from kubernetes_asyncio.config import kube_config

    with tempfile.TemporaryDirectory() as tmp:
        cluster = DevCluster(Path(tmp))
        await asyncio.to_thread(cluster.up, list(nodes) if nodes is not None else None, 600.0, lambda m: None, kueue)
        try:
            os.environ.update(cluster.env())  # KubeSpawner loads the default kubeconfig
            kube_config.KUBE_CONFIG_DEFAULT_LOCATION = str(cluster.kubeconfig)  # read by kubernetes_asyncio at import
            yield cluster
        finally:
            cluster.down(quiet=True)
