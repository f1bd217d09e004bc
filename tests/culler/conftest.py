"""Fixtures for the culler's tests (tests/culler only)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest


@pytest.fixture
def now() -> datetime:
    return datetime(2026, 5, 4, 12, 0, 0, tzinfo=UTC)


@pytest.fixture
def culler_log() -> logging.Logger:
    log = logging.getLogger("test.gpuspawner.culler")
    log.setLevel(logging.DEBUG)
    return log
