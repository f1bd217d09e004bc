"""One devcluster with the real Karpenter (its kwok cloud provider, built from its Go module) for
all of tests/karpenter, with the devcluster's CPU node only: every GPU node is one Karpenter makes.

Run only with GPUSPAWNER_KARPENTER_TESTS=1 (`make test` and `make karpenter-check` set it, after
`gpuspawner devcluster build --karpenter`); skipped, saying so, without it."""

from __future__ import annotations

import os
import secrets

import pytest

from gpuspawner.devcluster.cluster import DevCluster
from gpuspawner.devcluster.nodes import CLASS_LABEL, standard_nodes
from tests.conftest import fresh_namespace

ENABLE = "GPUSPAWNER_KARPENTER_TESTS"


def pytest_collection_modifyitems(config, items) -> None:
    if os.environ.get(ENABLE):
        return
    skip = pytest.mark.skip(
        reason=f"the real Karpenter's tests run with {ENABLE}=1 (`make karpenter-check`, or `make test`): they build it from its Go module"
    )
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(skip)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Module-scoped: down before the next folder's cluster (tests/kueue, in the same process) starts."""
    cluster = DevCluster(tmp_path_factory.mktemp("karpenter-devcluster"))
    try:
        cluster.up(nodes=[n for n in standard_nodes() if n["metadata"]["labels"][CLASS_LABEL] == "cpu"], karpenter=True)
        yield cluster
    finally:
        cluster.down(quiet=True)


@pytest.fixture(scope="module")
def kube(cluster):
    return cluster.client()


@pytest.fixture
def ns(kube):
    yield from fresh_namespace(kube, f"karp-{secrets.token_hex(3)}")
