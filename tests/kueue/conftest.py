"""One devcluster with the real Kueue for all of tests/kueue (run in a pytest process of its own:
`make kueue-check`, and the second step of `make test`), its kubeconfig the one KubeSpawner loads."""

from __future__ import annotations

import os
import secrets

import pytest

from gpuspawner.devcluster.cluster import DevCluster
from gpuspawner.devcluster.nodes import standard_nodes
from tests.conftest import fresh_namespace


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


@pytest.fixture(scope="session")
def kube(cluster):
    return cluster.client()


@pytest.fixture
def ns(kube, request):
    """A namespace of the test's own, named after its module (``kueue_spawn`` -> ``ks-...``)."""
    prefix = "k" + request.module.__name__.rsplit("_", 1)[-1][:1]
    yield from fresh_namespace(kube, f"{prefix}-{secrets.token_hex(3)}")
