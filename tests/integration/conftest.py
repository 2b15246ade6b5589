"""Integration fixtures: a real Prefect API (prefect_test_harness, temporary server) with its state in
a temp dir set *before* prefect is imported (ECOSYSTEM.md), real local services on loopback."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

_PREFECT_DIR = tempfile.mkdtemp(prefix="memx-prefect-")
os.environ.setdefault("PREFECT_HOME", _PREFECT_DIR)
os.environ.setdefault("PREFECT_LOCAL_STORAGE_PATH", os.path.join(_PREFECT_DIR, "storage"))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
# MemX's flows use no Prefect blocks (memx.cli.orchestration.prefect_env sets the same for `memx plan`)
os.environ.setdefault("PREFECT_API_BLOCKS_REGISTER_ON_START", "false")


@pytest.fixture(scope="session")
def prefect_api():
    """One temporary Prefect server for the session, on a real SQLite database.

    The harness makes its database in a new temporary folder (`prefect.testing.utilities.mkdtemp`, file
    `prefect-test.db`) and the server migrates it empty (~12 s of a ~20 s start on 2 cores). Where `make install`
    built the migrated template (memx.cli.orchestration.build_prefect_template, what a first `memx plan` seeds
    its own database from), that folder starts with a copy of it. Should a later Prefect name the folder or the
    file otherwise, the copy is simply not used and the server migrates as before: slower, never different."""
    from prefect.testing import utilities
    from prefect.testing.utilities import prefect_test_harness

    from memx.cli.orchestration import prefect_template

    template = prefect_template()
    seeded = template.is_file() and hasattr(utilities, "mkdtemp")
    with pytest.MonkeyPatch.context() as patch:
        if seeded:  # the harness removes this folder at exit, as it does its own
            folder = tempfile.mkdtemp(prefix="memx-prefect-db-")
            shutil.copyfile(template, os.path.join(folder, "prefect-test.db"))
            patch.setattr(utilities, "mkdtemp", lambda: folder)
        with prefect_test_harness(server_startup_timeout=120):
            yield
