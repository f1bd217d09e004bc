"""Fixtures for tests/api: a namespace and a real hub per test module, on the session's devcluster."""

from __future__ import annotations

import secrets

import pytest

from tests.api.gpuhub import GPUHub
from tests.conftest import fresh_namespace


@pytest.fixture(scope="module")
def hub_namespace(kube):
    yield from fresh_namespace(kube, f"api-{secrets.token_hex(3)}")


@pytest.fixture(scope="module")
def gpuhub(devcluster, hub_namespace, tmp_path_factory):
    hub = GPUHub(tmp_path_factory.mktemp("gpuhub"), devcluster, hub_namespace)
    try:
        yield hub.start()
    finally:
        hub.stop()
