"""One devcluster with the real Kueue for all of tests/kueue (run in a pytest process of its own:
`make kueue-check`, and the second step of `make test`), its kubeconfig the one KubeSpawner loads."""

from __future__ import annotations

import os

import pytest

from gpuspawner.devcluster.cluster import DevCluster
from gpuspawner.devcluster.nodes import standard_nodes


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    cluster = DevCluster(tmp_path_factory.mktemp("kueue-devcluster"))
    try:
        cluster.up(nodes=standard_nodes(), kueue=True)
        from kubernetes_asyncio.config import kube_config

        os.environ.update(cluster.env())
        kube_config.KUBE_CONFIG_DEFAULT_LOCATION = str(cluster.kubeconfig)
        yield cluster
    finally:
        cluster.down(quiet=True)
