"""One devcluster with the real Kueue for all of tests/kueue (run in a pytest process of its own:
`make kueue-check`, and the second step of `make test`), its kubeconfig the one KubeSpawner loads."""

from __future__ import annotations

import secrets

import pytest

from gpuspawner.devcluster.nodes import standard_nodes
from tests.conftest import fresh_namespace, process_cluster


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    yield from process_cluster(tmp_path_factory.mktemp("kueue-devcluster"), nodes=standard_nodes(), kueue=True)


@pytest.fixture(scope="session")
def kube(cluster):
    return cluster.client()


@pytest.fixture
def ns(kube, request):
    """A namespace of the test's own, named after its module (``kueue_spawn`` -> ``ks-...``)."""
    prefix = "k" + request.module.__name__.rsplit("_", 1)[-1][:1]
    yield from fresh_namespace(kube, f"{prefix}-{secrets.token_hex(3)}")
