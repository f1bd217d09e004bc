"""Fixtures for the culler's tests (tests/culler only)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest
import pytest_asyncio

from tests.culler.loopback_pods import GpuAnswers, Pod, loopback_hub


@pytest.fixture
def now() -> datetime:
    return datetime(2026, 5, 4, 12, 0, 0, tzinfo=UTC)


@pytest.fixture
def culler_log() -> logging.Logger:
    log = logging.getLogger("test.gpuspawner.culler")
    log.setLevel(logging.DEBUG)
    return log


@pytest_asyncio.fixture(loop_scope="session")
async def make_hub(tmp_path):
    """A hub of the test's own: ``await make_hub({user: (offering, pod, (mean, max, fb))})``."""
    opened = []

    async def make(servers: dict[str, tuple[str, Pod, tuple[float, float, float]]]):
        gpus = GpuAnswers()
        for user, (_, _, gpu) in servers.items():
            gpus.pods[f"jupyter-{user}"] = gpu
        cm = loopback_hub(tmp_path / f"hub{len(opened)}", {u: (o, p) for u, (o, p, _) in servers.items()}, gpus)
        hub = await cm.__aenter__()
        opened.append(cm)
        return hub, gpus

    yield make
    for cm in opened:
        await cm.__aexit__(None, None, None)
