"""Fixtures for the culler's tests (tests/culler only)."""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

HERE = Path(__file__).parent
if str(HERE) not in sys.path:  # culler_fakes, culler_hub (works under any import mode)
    sys.path.insert(0, str(HERE))


@pytest.fixture
def now() -> datetime:
    return datetime(2026, 5, 4, 12, 0, 0, tzinfo=UTC)


@pytest.fixture
def culler_log() -> logging.Logger:
    log = logging.getLogger("test.gpuspawner.culler")
    log.setLevel(logging.DEBUG)
    return log
