"""Shared fixtures: catalog root, published data folder (../shared/realdata, skipped when absent)."""

from __future__ import annotations

import os
from pathlib import Path

import atexit
import shutil
import tempfile

import pytest
from hypothesis import settings
from hypothesis.configuration import set_hypothesis_home_dir

REPO = Path(__file__).resolve().parents[1]

# Tests never write into the source tree: no example database and no constants cache (.hypothesis/)
# in the working directory.
settings.register_profile("memx", database=None)
settings.load_profile("memx")
_HYPOTHESIS_HOME = tempfile.mkdtemp(prefix="memx-hypothesis-")
set_hypothesis_home_dir(Path(_HYPOTHESIS_HOME))
atexit.register(shutil.rmtree, _HYPOTHESIS_HOME, True)


def realdata_root() -> Path:
    return Path(os.environ.get("MEMX_REALDATA", REPO.parent / "shared" / "realdata"))


@pytest.fixture(scope="session")
def realdata() -> Path:
    root = realdata_root()
    if not root.is_dir():
        pytest.skip(f"published measurements not present at {root}")
    return root


@pytest.fixture(scope="session")
def conf_root() -> Path:
    return REPO / "conf"


@pytest.fixture(autouse=True)
def _memx_home(tmp_path, monkeypatch):
    """Every test gets its own $MEMX_HOME: nothing is written to the working tree."""
    monkeypatch.setenv("MEMX_HOME", str(tmp_path / "memx-home"))


@pytest.fixture(scope="session")
def scenario():
    """xy-2 + llama-6l + the `small` search, profiled once on the virtual cluster: (cluster, model, space,
    stage_runs) for the tests that train a predictor from a real profile."""
    from memx.domain.catalog import load_cluster, load_model, load_search
    from memx.profiling import profile

    cl, mo, sp = load_cluster("xy-2"), load_model("llama-6l"), load_search("small")
    return cl, mo, sp, profile(cl, mo, sp, backend="simulated", seed=0).stage_runs



PREFECT_FILES = "tests/integration/test_flows_"  # the only test files that may use the prefect_api fixture


def pytest_collection_modifyitems(items):
    """The tests that need Prefect's API server (~1 min with its start) run first: on `make test`'s two xdist
    workers the other worker meanwhile takes the rest, instead of one worker finishing that file alone. They all
    live in PREFECT_FILES, which the scheduler below hands to one worker, so one Prefect server starts, not two."""
    stray = sorted({item.nodeid.split("::")[0] for item in items if "prefect_api" in getattr(item, "fixturenames", ())
                    and not item.nodeid.startswith(PREFECT_FILES)})
    if stray:
        raise pytest.UsageError(f"{', '.join(stray)}: a test that uses prefect_api belongs in {PREFECT_FILES}*.py")
    items.sort(key=lambda item: "prefect_api" not in getattr(item, "fixturenames", ()))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` (the Makefile's), with every PREFECT_FILES file in one scope: one worker runs the tests
    that need Prefect's API server and starts it once (~15 CPU s a start); other files are scheduled by file."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class PrefectOnOneWorker(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return PREFECT_FILES if nodeid.startswith(PREFECT_FILES) else super()._split_scope(nodeid)

    return PrefectOnOneWorker(config, log)
