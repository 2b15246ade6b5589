"""Local artifact store: round trip, manifest-last atomicity, listing, no-op re-put, URI choice,
endpoint resolution, content versions, and the `artifacts` CLI on a local store."""

from __future__ import annotations

import hashlib

import json
import os
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from memx.cli.app import app as memx_app
from memx.domain.errors import InputError
from memx.pipeline.store import ArtifactNotFound, LocalStore, s3_endpoint, s3_env, store_from_uri
from memx.pipeline.versioning import content_version


class Unwritable:
    """A cell value Parquet cannot hold: to_parquet raises partway through a put."""


def runs(n: int = 3) -> pd.DataFrame:
    return pd.DataFrame({"gpu": [f"g{i}" for i in range(n)], "tp": list(range(1, n + 1)), "time_ms": [1.5 * i for i in range(n)]})


@pytest.fixture
def store(tmp_path) -> LocalStore:
    return LocalStore(root=tmp_path / "store")


def test_round_trip_tables_files_manifest(store):
    ref = store.put_step("profile", "abc", tables={"stage_runs": runs()}, files={"plan.json": b'{"dp": 2}'}, manifest={"inputs": {"cluster": "c"}, "metrics": {"mape": 0.1}})
    assert ref.step == "profile" and ref.stage == ref.step and ref.version == "abc" and ref.created_at
    assert store.has_step("profile", "abc")
    pd.testing.assert_frame_equal(store.get_table("profile", "abc", "stage_runs"), runs(), check_dtype=False)
    assert store.get_file("profile", "abc", "plan.json") == b'{"dp": 2}'
    doc = store.manifest("profile", "abc")
    assert doc["inputs"] == {"cluster": "c"} and doc["metrics"] == {"mape": 0.1}
    table_sha = hashlib.sha256((store.root / "profile/abc/stage_runs.parquet").read_bytes()).hexdigest()
    assert doc["tables"] == {"stage_runs": {"rows": 3, "columns": ["gpu", "tp", "time_ms"], "sha256": table_sha}}
    assert doc["files"] == {"plan.json": {"bytes": 9, "sha256": hashlib.sha256(b'{"dp": 2}').hexdigest()}}
    assert doc["format"] == 2
    assert Path(store.uri("profile", "abc", "stage_runs")) == store.root / "profile/abc/stage_runs.parquet"
    assert Path(store.uri("profile", "abc", "plan.json")) == store.root / "profile/abc/plan.json"


def test_crash_mid_put_leaves_no_complete_version(store):
    bad = pd.DataFrame({"x": [Unwritable()]})
    with pytest.raises(Exception):
        store.put_step("augment", "v1", tables={"first": runs(), "second": bad}, manifest={})
    assert not store.has_step("augment", "v1")
    assert store.list_versions() == []
    assert not (store.root / "augment/v1/manifest.json").exists()
    # every table is serialised before anything is written: nothing at all is left
    assert not (store.root / "augment/v1").exists() or not list((store.root / "augment/v1").iterdir())
    with pytest.raises(ArtifactNotFound):
        store.get_table("augment", "v1", "first")  # written, but the version is not complete
    store.put_step("augment", "v1", tables={"first": runs(), "second": runs(1)}, manifest={})  # resume
    assert [r.version for r in store.list_versions("augment")] == ["v1"]


def test_reput_is_a_noop(store):
    first = store.put_step("train", "v", tables={"t": runs(2)}, manifest={"n": 1})
    mtime = (store.root / "train/v/manifest.json").stat().st_mtime_ns
    again = store.put_step("train", "v", tables={"t": runs(5)}, manifest={"n": 2})
    assert again == first
    assert store.manifest("train", "v")["n"] == 1 and len(store.get_table("train", "v", "t")) == 2
    assert (store.root / "train/v/manifest.json").stat().st_mtime_ns == mtime


def test_list_versions_newest_first_and_by_step(store):
    for step, version in [("profile", "a"), ("train", "b"), ("profile", "c")]:
        store.put_step(step, version, tables={"t": runs(1)}, manifest={})
    (store.root / "profile/incomplete").mkdir()
    (store.root / "profile/incomplete/t.parquet").write_bytes(b"junk")
    assert [(r.step, r.version) for r in store.list_versions()] == [("profile", "c"), ("train", "b"), ("profile", "a")]
    assert [r.version for r in store.list_versions("profile")] == ["c", "a"]
    assert store.list_versions("search") == []


def test_missing_items_and_bad_names(store):
    store.put_step("s", "v", tables={"t": runs(1)}, manifest={})
    with pytest.raises(ArtifactNotFound):
        store.manifest("s", "nope")
    with pytest.raises(ArtifactNotFound):
        store.get_table("s", "v", "other")
    with pytest.raises(ArtifactNotFound):
        store.get_file("s", "v", "x.json")
    for step, version in [("../x", "v"), ("s", "a/b"), (".hidden", "v"), ("", "v")]:
        with pytest.raises(InputError):
            store.put_step(step, version, manifest={})
    with pytest.raises(InputError):
        store.put_step("s", "w", files={"manifest.json": b"{}"}, manifest={})
    with pytest.raises(InputError):
        store.put_step("s", "w", tables={"t": runs(1)}, files={"t.parquet": b""}, manifest={})
    with pytest.raises(InputError):
        store.put_step("s", "w", tables={"a.b": runs(1)}, manifest={})
    assert [r.version for r in store.list_versions("s")] == ["v"] and not store.has_step("s", "w")


def test_reserved_manifest_keys_are_the_store_s(store):
    store.put_step("s", "v", tables={"t": runs(2)}, manifest={"tables": "mine", "step": "other", "code_version": "abc"})
    doc = store.manifest("s", "v")
    assert doc["step"] == "s" and doc["tables"]["t"]["rows"] == 2 and doc["code_version"] == "abc"


def test_content_version_is_stable():
    a = content_version({"b": 1, "a": [1, 2]}, "profile", Path("x"))
    assert a == content_version({"a": [1, 2], "b": 1}, "profile", Path("x"))
    assert len(a) == 16 and int(a, 16) >= 0
    assert a != content_version({"a": [1, 2], "b": 2}, "profile", Path("x"))
    with pytest.raises(TypeError):
        content_version(object())


def test_store_from_uri(tmp_path, monkeypatch):
    monkeypatch.delenv("MEMX_STORE", raising=False)
    assert store_from_uri().root == Path(os.environ["MEMX_HOME"]).absolute() / "artifacts"
    assert store_from_uri(str(tmp_path / "a")).root == tmp_path / "a"
    monkeypatch.setenv("MEMX_STORE", str(tmp_path / "b"))
    assert store_from_uri().root == tmp_path / "b"
    monkeypatch.setenv("MEMX_S3_ENDPOINT_URL", "http://127.0.0.1:9")
    s3 = store_from_uri("s3://bucket/some/prefix/")
    assert (s3.bucket, s3.prefix, s3.endpoint) == ("bucket", "some/prefix", "http://127.0.0.1:9")
    assert s3.uri("st", "v", "t") == "s3://bucket/some/prefix/st/v/t.parquet"
    with pytest.raises(InputError):
        store_from_uri("gs://bucket/x")


def test_s3_endpoint_precedence(monkeypatch):
    for var in ("MEMX_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(var, raising=False)
    assert s3_endpoint() is None and s3_env() == {}
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://generic:1")
    assert s3_endpoint() == "http://generic:1"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://s3only:2/")
    assert s3_endpoint() == "http://s3only:2"
    monkeypatch.setenv("MEMX_S3_ENDPOINT_URL", "http://memx:3")
    assert s3_endpoint() == "http://memx:3"
    assert s3_env()["MLFLOW_S3_ENDPOINT_URL"] == "http://memx:3"


def _cli():
    return memx_app


def test_cli_ls_and_show(store):
    store.put_step("profile", "v1", tables={"stage_runs": runs(4)}, files={"notes.txt": b"hi"}, manifest={"inputs": {"gpu": "a100"}})
    store.put_step("train", "v2", tables={"metrics": runs(2)}, manifest={})
    cli = CliRunner()
    out = cli.invoke(_cli(), ["artifacts", "ls", "--store", str(store.root)])
    assert out.exit_code == 0, out.output
    lines = out.output.strip().splitlines()
    assert lines[0].split()[:2] == ["train", "v2"] and "stage_runs[4]" in lines[1]
    out = cli.invoke(_cli(), ["artifacts", "ls", "profile", "--store", str(store.root), "--json"])
    assert [d["version"] for d in json.loads(out.output)] == ["v1"]
    out = cli.invoke(_cli(), ["artifacts", "show", "profile", "v1", "--store", str(store.root), "--table", "stage_runs", "--head", "2"])
    assert out.exit_code == 0, out.output
    assert '"gpu": "a100"' in out.output and "stage_runs.parquet" in out.output and "notes.txt" in out.output
    assert "g1" in out.output and "g2" not in out.output
    out = cli.invoke(_cli(), ["artifacts", "show", "profile", "nope", "--store", str(store.root)])
    assert out.exit_code == 2 and "no complete version" in out.output


def test_cli_uses_memx_home_by_default(monkeypatch):
    monkeypatch.delenv("MEMX_STORE", raising=False)
    store_from_uri().put_step("search", "v9", tables={"top": runs(1)}, manifest={})
    out = CliRunner().invoke(_cli(), ["artifacts", "ls"])
    assert out.exit_code == 0 and "search" in out.output and "v9" in out.output
