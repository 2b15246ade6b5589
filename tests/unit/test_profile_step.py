"""The profile step (memx.pipeline.steps): a scratch folder under MEMX_HOME that an interrupted profile
resumes from, removed once stored; with --backend records, each GPU type keeps only its own rows."""

from __future__ import annotations

import pandas as pd
import pytest

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.domain.errors import NothingUsable
from memx.pipeline import steps
from memx.pipeline.store.local import LocalStore
from memx.pipeline.versioning import profile_key
from memx.profiling import STAGE_RUNS_FILE


@pytest.fixture()
def specs(tmp_path, monkeypatch, conf_root):
    monkeypatch.setenv("MEMX_HOME", str(tmp_path / "home"))
    return load_cluster("xy-2", conf_root), load_model("llama-6l", conf_root), load_search("small", conf_root)


def _profile(cluster, gpu, model, space, backend, options, conf_root):
    key = profile_key(cluster, gpu, model, space, backend=backend, seed=0, options=options)
    return key, steps.compute_profile(cluster, gpu, model, space, backend=backend, seed=0, conf_root=conf_root,
                                      options=options, key=key)


def test_an_interrupted_profile_resumes_from_its_scratch_folder(specs, conf_root, tmp_path):
    cluster, model, space = specs
    gpu = cluster.gpu_types[0].name
    key, first = _profile(cluster, gpu, model, space, "simulated", {}, conf_root)
    scratch = steps.profiling_scratch(key)
    saved = scratch / STAGE_RUNS_FILE
    assert saved.is_file() and scratch.is_relative_to(tmp_path / "home")
    # Mark the points already measured: a resumed run must take them from the scratch folder, not re-measure.
    runs = pd.read_parquet(saved)
    runs["time_ms"] = 12345.0
    runs.to_parquet(saved)
    _, again = _profile(cluster, gpu, model, space, "simulated", {}, conf_root)
    times = again.tables["stage_runs"]["time_ms"]
    assert len(times) == len(first.tables["stage_runs"]) and (times == 12345.0).all()


def test_the_scratch_folder_is_removed_once_stored(specs, conf_root, tmp_path):
    cluster, model, space = specs
    gpu = cluster.gpu_types[0].name
    run = steps.profile_one(LocalStore(root=tmp_path / "store"), cluster, gpu, model, space, backend="simulated", seed=0,
                            conf_root=conf_root, options={})
    key = profile_key(cluster, gpu, model, space, backend="simulated", seed=0, options={})
    assert not run.reused and not steps.profiling_scratch(key).exists()


def test_records_keep_only_each_gpu_types_rows(specs, conf_root, tmp_path):
    cluster, model, space = specs
    both = pd.concat([_profile(cluster, g.name, model, space, "simulated", {}, conf_root)[1].tables["stage_runs"]
                      for g in cluster.gpu_types], ignore_index=True)
    measured = both.loc[both["status"] == "ok"]
    path = tmp_path / "records.parquet"
    measured.to_parquet(path)
    for g in cluster.gpu_types:
        _, res = _profile(cluster, g.name, model, space, "records", {"records": path}, conf_root)
        rows = res.tables["stage_runs"]
        assert set(rows["gpu"]) == {g.name} and len(rows) == int((measured["gpu"] == g.name).sum())
        assert res.manifest["rows"] == len(rows)
    only_one = tmp_path / "one.parquet"
    measured.loc[measured["gpu"] == cluster.gpu_types[0].name].to_parquet(only_one)
    with pytest.raises(NothingUsable, match=cluster.gpu_types[1].name):
        _profile(cluster, cluster.gpu_types[1].name, model, space, "records", {"records": only_one}, conf_root)
