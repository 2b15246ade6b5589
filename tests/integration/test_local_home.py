"""The library entry points write only under $MEMX_HOME: profile → train → the registered predictor,
with HOME an empty folder and the working directory another; both stay empty."""

from __future__ import annotations

import pytest

import os
from pathlib import Path

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.pipeline.local import profile_step, registered_predictor, train_step
from memx.planner.search import search


def _files(root: Path) -> list[str]:
    return sorted(str(Path(d, f).relative_to(root)) for d, dirs, files in os.walk(root) for f in files + dirs)


@pytest.mark.slow  # ~5 s; test_cli_sequence checks the same in the default set, through the CLI (issue #17)
def test_profile_train_predict_write_only_under_memx_home(tmp_path, monkeypatch):
    home, fake_home, cwd = tmp_path / "memx", tmp_path / "user", tmp_path / "cwd"
    fake_home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("MEMX_HOME", str(home))
    monkeypatch.setenv("HOME", str(fake_home))
    for var in ("MLFLOW_TRACKING_URI", "MEMX_STORE", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(cwd)
    cl, mo, sp = load_cluster("xy-2"), load_model("llama-6l"), load_search("small")

    profiles = profile_step(cl, mo, sp, backend="simulated", seed=0)
    trained = train_step(cl, mo, sp, seed=0, trials=1, seconds=5)
    pred = registered_predictor(cl, mo, sp)
    best = search(cl, mo, sp, pred, weights="default", top_k=1).best

    assert best.plan.stages and trained.model_version == 1 and set(profiles) == {g.name for g in cl.gpu_types}
    written = _files(home)
    assert "mlflow.db" in written and any(f.startswith("artifacts/profile/") for f in written)
    assert any(f.startswith("mlartifacts") for f in written) and any(f.startswith("models/") for f in written)
    assert _files(fake_home) == [], "written under HOME"
    assert _files(cwd) == [], "written in the working directory"
