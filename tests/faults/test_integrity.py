"""Integrity (issue #11): every stored part carries a sha256 in its manifest and is checked on read; a
truncated or tampered part, or a manifest that does not parse, makes its version absent (a warning
names it) and the step recomputes; a tampered prediction cache is discarded and rebuilt; a stored plan
is validated before it is served. Local store and a real moto S3 server on 127.0.0.1 (no mocks)."""

from __future__ import annotations

import hashlib
import json
import logging

import numpy as np
import pandas as pd
import pytest

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.learn.cache import SPOT_CHECKS, CachedPredictor
from memx.pipeline import registry
from memx.pipeline.local import run_local, search_step, train_config
from memx.pipeline.store import CorruptArtifact, LocalStore, store_from_uri
from memx.planner.cost import AnalyticStageModel
from memx.planner.signatures import PREDICTION_COLUMNS, SIGNATURE_COLUMNS
from memx.profiling import profile
from support.services import FAKE_AWS_ENV, s3_server

FAST = train_config(0, trials=1, seconds=5)


def _runs(n: int = 4) -> pd.DataFrame:
    return pd.DataFrame({"gpu": [f"g{i}" for i in range(n)], "tp": list(range(1, n + 1)), "time_ms": [1.5 * i for i in range(n)]})


def _check_store(store, root_obj, caplog):
    """Truncated table, tampered file, garbled manifest: each version is absent, named in a warning,
    and a second put (the step recomputing) restores it."""
    store.put_step("profile", "a", tables={"stage_runs": _runs()}, manifest={})
    store.put_step("search", "b", files={"plan.json": b'{"dp": 2}'}, manifest={})
    store.put_step("augment", "c", tables={"train": _runs(2)}, manifest={})
    data = root_obj.read("profile/a/stage_runs.parquet")
    root_obj.write("profile/a/stage_runs.parquet", data[: len(data) // 2])
    root_obj.write("search/b/plan.json", b'{"dp": 3}')
    root_obj.write("augment/c/manifest.json", root_obj.read("augment/c/manifest.json")[:40])
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert not store.has_step("profile", "a") and not store.has_step("search", "b")
        assert [r.version for r in store.list_versions()] == ["b", "a"]  # c's manifest does not parse: skipped
        assert not store.has_step("augment", "c")
    text = caplog.text
    assert "profile/a/stage_runs.parquet fails its sha256 check" in text
    assert "search/b/plan.json fails its sha256 check" in text
    assert "manifest of augment/c" in text and "does not parse" in text
    with pytest.raises(CorruptArtifact, match="stage_runs.parquet fails its sha256 check"):
        store.get_table("profile", "a", "stage_runs")
    with pytest.raises(CorruptArtifact, match="plan.json fails its sha256 check"):
        store.get_file("search", "b", "plan.json")
    store.put_step("profile", "a", tables={"stage_runs": _runs()}, manifest={})
    store.put_step("search", "b", files={"plan.json": b'{"dp": 2}'}, manifest={})
    store.put_step("augment", "c", tables={"train": _runs(2)}, manifest={})
    pd.testing.assert_frame_equal(store.get_table("profile", "a", "stage_runs"), _runs())
    assert store.get_file("search", "b", "plan.json") == b'{"dp": 2}' and store.has_step("augment", "c")


class _Local:
    def __init__(self, root):
        self.root = root

    def read(self, key):
        return (self.root / key).read_bytes()

    def write(self, key, data):
        (self.root / key).write_bytes(data)


class _S3:
    def __init__(self, store):
        self.store = store

    def read(self, key):
        return self.store._client.get_object(Bucket=self.store.bucket, Key=self.store._key(key))["Body"].read()

    def write(self, key, data):
        self.store._client.put_object(Bucket=self.store.bucket, Key=self.store._key(key), Body=data)


def test_local_store_corrupt_parts_are_absent_and_recomputed(tmp_path, caplog):
    store = LocalStore(root=tmp_path / "store")
    _check_store(store, _Local(store.root), caplog)


def test_s3_store_corrupt_parts_are_absent_and_recomputed(monkeypatch, caplog):
    for key, value in FAKE_AWS_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with s3_server(buckets=("memx-integrity",)) as s3:
        monkeypatch.setenv("MEMX_S3_ENDPOINT_URL", s3.endpoint)
        store = store_from_uri("s3://memx-integrity/art")
        _check_store(store, _S3(store), caplog)


# --- the prediction cache --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sigs():
    cl, mo, sp = load_cluster("xy-2"), load_model("llama-6l"), load_search("small")
    runs = profile(cl, mo, sp, backend="simulated", seed=0).stage_runs
    return cl, runs.loc[:, list(SIGNATURE_COLUMNS)].head(30)


def test_tampered_cache_is_discarded_and_rebuilt(sigs, tmp_path, caplog):
    cl, s = sigs
    inner = AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types})
    path = tmp_path / "predictions.parquet"
    truth = CachedPredictor(inner, version="v1", path=path).predict(s)
    df = pd.read_parquet(path)
    df.loc[:, list(PREDICTION_COLUMNS)] *= 0.5  # scaled values, same version
    df.to_parquet(path, index=False)
    with caplog.at_level(logging.WARNING):
        again = CachedPredictor(inner, version="v1", path=path)
    assert len(again) == 0 and f"prediction cache {path} discarded (sha256 check failed)" in caplog.text
    assert np.array_equal(again.predict(s).to_numpy(), truth.to_numpy()) and again.last_hit_rate == 0.0
    assert CachedPredictor(inner, version="v1", path=path).predict(s).equals(truth)  # rebuilt, verified, served
    path.write_bytes(path.read_bytes()[:100])  # truncated
    (path.parent / "predictions.parquet.sha256").write_text(hashlib.sha256(path.read_bytes()).hexdigest())
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        third = CachedPredictor(inner, version="v1", path=path)
    assert len(third) == 0 and "discarded" in caplog.text and not path.exists()
    assert np.array_equal(third.predict(s).to_numpy(), truth.to_numpy())


@pytest.mark.parametrize("forge", ["alternate-rows-scaled", "one-row-scaled", "signature-swapped"])
def test_forged_cache_with_a_rewritten_sha256_is_detected(sigs, tmp_path, caplog, forge):
    """Issue #25: the forger rewrites the data and the .sha256 beside it; the load still refuses it (keys
    checked against the stored signatures, random entries predicted again)."""
    cl, s = sigs
    inner = AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types})
    path = tmp_path / "predictions.parquet"
    truth = CachedPredictor(inner, version="v1", path=path).predict(s)
    df = pd.read_parquet(path)
    if forge == "alternate-rows-scaled":
        df.loc[::2, "time_ms"] *= 0.03
    elif forge == "one-row-scaled":  # with fewer entries than SPOT_CHECKS every entry is checked
        assert len(df) <= SPOT_CHECKS
        df.loc[len(df) // 2, "peak_mem_mib"] *= 0.5
    else:
        df.loc[0, "layers"] = int(df.loc[0, "layers"]) + 1  # a value moved under another signature
    df.to_parquet(path, index=False)
    (path.parent / "predictions.parquet.sha256").write_text(hashlib.sha256(path.read_bytes()).hexdigest() + "\n")
    with caplog.at_level(logging.WARNING):
        again = CachedPredictor(inner, version="v1", path=path)
    assert len(again) == 0 and f"prediction cache {path} discarded" in caplog.text
    assert np.array_equal(again.predict(s).to_numpy(), truth.to_numpy())


# --- the pipeline: recompute what is corrupt, validate a stored plan --------------------------------

# ~11 s (two local pipeline runs): `make test-all`; corrupt parts are recomputed in the default set by
# test_s3_store_corrupt_parts_are_absent_and_recomputed and the cache by test_tampered_cache_is_discarded_and_rebuilt.
@pytest.mark.slow
def test_pipeline_recomputes_a_corrupt_profile_and_refuses_an_invalid_stored_plan(monkeypatch, caplog):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MEMX_STORE", raising=False)
    cl, mo, sp = load_cluster("xy-2"), load_model("llama-6l"), load_search("small")
    first = run_local(cl, mo, sp, config=FAST, top_k=3)
    store = store_from_uri()
    gpu, version = sorted(first.profiles.items())[0]
    part = store.root / "profile" / version / "stage_runs.parquet"
    part.write_bytes(part.read_bytes()[:64])
    (store.root / "augment" / first.trained.augment.version / "manifest.json").write_text("{not json")
    with caplog.at_level(logging.WARNING):
        second = run_local(cl, mo, sp, config=FAST, top_k=3)
    assert f"profile/{version}/stage_runs.parquet fails its sha256 check" in caplog.text
    assert second.profiles == first.profiles and second.plan["plan"] == first.plan["plan"]
    assert not second.trained.augment.reused and second.trained.train.reused and second.search.reused
    assert len(store.get_table("profile", version, "stage_runs")) == store.manifest("profile", version)["rows"] > 0
    # a hand-edited stored plan (manifest hash updated too): invalid for this model, so not served
    plan_path = store.root / "search" / second.search.version / "plan.json"
    obj = json.loads(plan_path.read_text())
    obj["plan"]["stages"][0]["layers"] += 5
    plan_path.write_bytes(json.dumps(obj).encode())
    doc_path = plan_path.with_name("manifest.json")
    doc = json.loads(doc_path.read_text())
    doc["files"]["plan.json"]["sha256"] = hashlib.sha256(plan_path.read_bytes()).hexdigest()
    doc_path.write_text(json.dumps(doc))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        run, plan = search_step(cl, mo, sp, top_k=3)
    assert f"stored plan search/{second.search.version} is not served" in caplog.text and "layers" in caplog.text
    assert not run.reused and run.version == second.search.version and plan["plan"] == first.plan["plan"]
    assert registry.champion(second.trained.fingerprint) is not None
