"""Integration fixtures: a real Prefect API (prefect_test_harness, temporary server) with its state in
a temp dir set *before* prefect is imported (ECOSYSTEM.md), real local services on loopback."""

from __future__ import annotations

import os
import tempfile

import pytest

_PREFECT_DIR = tempfile.mkdtemp(prefix="memx-prefect-")
os.environ.setdefault("PREFECT_HOME", _PREFECT_DIR)
os.environ.setdefault("PREFECT_LOCAL_STORAGE_PATH", os.path.join(_PREFECT_DIR, "storage"))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")


@pytest.fixture(scope="session")
def prefect_api():
    """One temporary Prefect server for the session (~15 s to start on 2 cores)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
