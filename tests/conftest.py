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



def pytest_collection_modifyitems(items):
    """The tests that need Prefect's API server (~1 min with its start) run first: on `make test`'s two xdist
    workers the other worker meanwhile takes the rest, instead of one worker finishing that file alone."""
    items.sort(key=lambda item: "prefect_api" not in getattr(item, "fixturenames", ()))
