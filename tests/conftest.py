"""Shared fixtures: the devcluster (started once per test run) and a namespace per test."""

from __future__ import annotations

import os
import secrets
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuspawner.devcluster.cluster import DevCluster
from gpuspawner.devcluster.clusterstate import KubeHTTP

ARTIFACTS = Path(os.environ.get("GPUSPAWNER_TEST_ARTIFACTS", Path(__file__).resolve().parent.parent / "test-artifacts"))

#: tests/kueue runs on a devcluster of its own with Kueue's controller, in a pytest process
#: apart from the main run (GPUSPAWNER_KUEUE_TESTS=1): `make test` starts it beside the main run
#: (with tests that use no `devcluster` of this file: the scale benchmark's, Karpenter's, the
#: culler's against real hubs), `make kueue-check` alone. (Kueue's webhooks take every pod of
#: its cluster, and KubeSpawner's client is one per process.)
collect_ignore = [] if os.environ.get("GPUSPAWNER_KUEUE_TESTS") else ["kueue"]

#: The run leaves nothing running: a process the tests started and left alive fails it.
pytest_plugins = ["tests.leftovers"]


def process_cluster(directory: Path, **up: Any) -> Iterator[DevCluster]:
    """A devcluster in ``directory``, up (``DevCluster.up(**up)``) for this test process, its
    kubeconfig the one KubeSpawner loads; down afterwards."""
    cluster = DevCluster(directory)
    try:
        cluster.up(**up)
        # KubeSpawner loads the default kubeconfig; kubernetes_asyncio reads $KUBECONFIG at import.
        from kubernetes_asyncio.config import kube_config

        os.environ.update(cluster.env())
        kube_config.KUBE_CONFIG_DEFAULT_LOCATION = str(cluster.kubeconfig)
        yield cluster
    finally:
        cluster.down(quiet=True)


@pytest.fixture(scope="session")
def devcluster(tmp_path_factory) -> Iterator[DevCluster]:
    """A real kube-apiserver, kube-scheduler, kube-controller-manager and kwok, with the
    simulated GPU nodes of nodes.yaml. Built from Go modules on first use (cached)."""
    yield from process_cluster(tmp_path_factory.mktemp("devcluster"))


@pytest.fixture(scope="session")
def kube(devcluster) -> KubeHTTP:
    return devcluster.client()


@pytest.fixture(scope="session")
def k8s_release(kube: KubeHTTP) -> tuple[int, int]:
    """The devcluster's Kubernetes release as the API server reports it (``/version``): (1, 37)."""
    version = kube.request("GET", "/version")
    return int(version["major"]), int(version["minor"].rstrip("+"))


@pytest.fixture(autouse=True)
def _needs_k8s(request) -> None:
    """Skip a test marked ``@pytest.mark.k8s("1.36", "partitionable devices (DRAPartitionableDevices)")``
    on an older server (``make test-oldest-k8s`` runs the suites on the oldest release GPUSpawner
    supports), the reason naming both releases and the feature. Only for features newer than
    that release: everything else must pass on it."""
    marker = request.node.get_closest_marker("k8s")
    if marker is None:
        return
    reason = too_old(request.getfixturevalue("k8s_release"), *marker.args)
    if reason:
        pytest.skip(reason)


def too_old(have: tuple[int, int], need: str, feature: str) -> str | None:
    """Why a test of ``feature``, which needs release ``need``, cannot run on a server of release ``have``; None if it can."""
    if have < tuple(int(part) for part in need.split(".")):
        return f"{feature} needs Kubernetes {need} or newer; this devcluster runs {have[0]}.{have[1]}"
    return None


@pytest.fixture(scope="module")
def dra_driver(kube: KubeHTTP):
    """The simulated NVIDIA DRA driver on the devcluster for one test module: its DeviceClasses,
    three kwok nodes and their ResourceSlices (gpuspawner.devcluster.dradriver). Removed after the
    module, so other modules see the nodes of nodes.yaml only."""
    from gpuspawner.devcluster.dradriver import SimulatedDriver

    yield from installed(SimulatedDriver(kube))


def installed(driver):
    """A simulated DRA driver's objects on the devcluster while the fixture lasts (a fixture's body)."""
    driver.install()
    try:
        yield driver
    finally:
        driver.uninstall()


@pytest.fixture
def namespace(kube: KubeHTTP):
    """A fresh namespace; its pods are deleted (and the namespace removed) afterwards."""
    yield from fresh_namespace(kube, f"t-{secrets.token_hex(4)}")


def fresh_namespace(kube: KubeHTTP, name: str):
    """Create namespace ``name``, yield it, then delete its pods and remove it (a fixture's body)."""
    kube.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    wait_for(lambda: _has_default_sa(kube, name), "default service account", timeout=30)
    yield name
    # A Job's controller makes its pods again (a Kueue test's Job admitted late, say): Jobs go first.
    kube.request("DELETE", f"/apis/batch/v1/namespaces/{name}/jobs?propagationPolicy=Background")
    kube.request("DELETE", f"/api/v1/namespaces/{name}/pods?gracePeriodSeconds=0")
    # (on a loaded machine the controllers take their time: the wait is for the event, generously bounded)
    wait_for(lambda: not kube.request("GET", f"/api/v1/namespaces/{name}/pods")["items"], f"pods of {name} gone", timeout=180)
    kube.request("DELETE", f"/api/v1/namespaces/{name}")


def _has_default_sa(kube: KubeHTTP, ns: str) -> bool:
    try:
        kube.request("GET", f"/api/v1/namespaces/{ns}/serviceaccounts/default")
        return True
    except urllib.error.HTTPError:
        return False


def wait_for(check, what: str, timeout: float = 30.0, interval: float = 0.1):
    """Poll ``check`` until it returns something truthy; fail the test with ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
