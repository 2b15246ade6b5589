"""S3 artifact store against a real moto S3 server on 127.0.0.1, over HTTP (no mocks): round trip,
crash mid-put, no-op re-put, listing, retries across a server restart, the `artifacts` CLI."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pandas as pd
import pyarrow.parquet as pq
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError
from typer.testing import CliRunner

from memx.cli.app import app as memx_app
from support.services import FAKE_AWS_ENV, S3Server, free_port, s3_server, start_s3
from memx.pipeline.store import store_from_uri
from memx.pipeline.store.s3 import Retry, S3Store, is_transient, s3_client, s3_filesystem

BUCKET = "memx-store"


def _fake_aws(mp: pytest.MonkeyPatch) -> None:
    for key, value in FAKE_AWS_ENV.items():
        mp.setenv(key, value)
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "MEMX_STORE"):
        mp.delenv(key, raising=False)
    mp.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture(scope="module")
def s3() -> S3Server:
    with pytest.MonkeyPatch.context() as mp:
        _fake_aws(mp)
        with s3_server(buckets=(BUCKET,)) as server:
            yield server


@pytest.fixture(autouse=True)
def s3_env(s3, monkeypatch):
    _fake_aws(monkeypatch)
    monkeypatch.setenv("MEMX_S3_ENDPOINT_URL", s3.endpoint)


@pytest.fixture
def store() -> S3Store:
    st = store_from_uri(f"s3://{BUCKET}/t-{uuid.uuid4().hex[:8]}")
    assert isinstance(st, S3Store)
    return st


class Unwritable:
    """A cell value Parquet cannot hold."""


def runs(n: int = 3) -> pd.DataFrame:
    return pd.DataFrame({"gpu": [f"g{i}" for i in range(n)], "tp": list(range(1, n + 1)), "time_ms": [2.5 * i for i in range(n)]})


def keys(store: S3Store) -> list[str]:
    listing = s3_client().list_objects_v2(Bucket=store.bucket, Prefix=store.prefix + "/")
    return sorted(obj["Key"][len(store.prefix) + 1 :] for obj in listing.get("Contents", ()))


def test_endpoint_is_loopback(s3, store):
    assert s3.endpoint.startswith("http://127.0.0.1:") and store.endpoint == s3.endpoint


def test_round_trip(store):
    ref = store.put_step("profile", "v1", tables={"stage_runs": runs()}, files={"plan.json": b"{}"}, manifest={"inputs": {"gpu": "a100"}, "rows": 3})
    assert ref.uri == f"s3://{store.bucket}/{store.prefix}/profile/v1"
    assert keys(store) == ["profile/v1/manifest.json", "profile/v1/plan.json", "profile/v1/stage_runs.parquet"]
    pd.testing.assert_frame_equal(store.get_table("profile", "v1", "stage_runs"), runs(), check_dtype=False)
    assert store.get_file("profile", "v1", "plan.json") == b"{}"
    doc = store.manifest("profile", "v1")
    assert doc["inputs"] == {"gpu": "a100"} and doc["tables"]["stage_runs"]["rows"] == 3
    # Anyone can read the table by URI with pyarrow, given the shared endpoint function.
    uri = store.uri("profile", "v1", "stage_runs")
    assert pq.read_table(uri.removeprefix("s3://"), filesystem=s3_filesystem()).num_rows == 3
    assert [(r.step, r.version) for r in store.list_versions()] == [("profile", "v1")]


def test_crash_mid_put_leaves_no_complete_version(store):
    with pytest.raises(Exception):
        store.put_step("augment", "v1", tables={"first": runs(), "second": pd.DataFrame({"x": [Unwritable()]})}, manifest={})
    assert "augment/v1/manifest.json" not in keys(store)
    assert not store.has_step("augment", "v1") and store.list_versions() == []
    store.put_step("augment", "v1", tables={"first": runs(), "second": runs(1)}, manifest={})
    assert [r.version for r in store.list_versions("augment")] == ["v1"]


def test_reput_is_a_noop(store):
    first = store.put_step("train", "v", tables={"t": runs(2)}, manifest={"n": 1})
    head = s3_client().head_object(Bucket=store.bucket, Key=f"{store.prefix}/train/v/manifest.json")
    again = store.put_step("train", "v", tables={"t": runs(5)}, manifest={"n": 2})
    assert again == first and len(store.get_table("train", "v", "t")) == 2
    assert s3_client().head_object(Bucket=store.bucket, Key=f"{store.prefix}/train/v/manifest.json")["ETag"] == head["ETag"]


def test_list_versions_newest_first_and_isolated_by_prefix(store):
    for step, version in [("profile", "a"), ("train", "b"), ("profile", "c")]:
        store.put_step(step, version, tables={"t": runs(1)}, manifest={})
    s3_client().put_object(Bucket=store.bucket, Key=f"{store.prefix}/profile/partial/t.parquet", Body=b"x")
    assert [(r.step, r.version) for r in store.list_versions()] == [("profile", "c"), ("train", "b"), ("profile", "a")]
    assert [r.version for r in store.list_versions("profile")] == ["c", "a"]
    assert S3Store(bucket=store.bucket, prefix=store.prefix + "-other").list_versions() == []


def test_endpoint_from_aws_endpoint_url_s3(s3, monkeypatch):
    monkeypatch.delenv("MEMX_S3_ENDPOINT_URL")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3.endpoint)  # boto3 reads it; pyarrow gets it from us
    st = store_from_uri(f"s3://{BUCKET}/aws-var-{uuid.uuid4().hex[:6]}")
    st.put_step("s", "v", tables={"t": runs(2)}, manifest={})
    assert len(st.get_table("s", "v", "t")) == 2


@contextmanager
def down_for(server: S3Server, delay_s: float) -> Iterator[list[S3Server]]:
    """Stop `server`; a thread starts a new one on the same port `delay_s` later (yielded list)."""
    server.stop()
    restarted: list[S3Server] = []
    thread = threading.Thread(target=lambda: (time.sleep(delay_s), restarted.append(start_s3(port=server.port, buckets=()))))
    thread.start()
    try:
        yield restarted
    finally:
        thread.join()


def test_store_survives_server_restart_between_puts(monkeypatch):
    """Put, stop the server, start the second put while it is down; the server comes back on the
    same port a moment later and the put goes through on retries; the same for a table read. moto keeps its data in the process, as a real S3 keeps it on disk, so the first
    version is still there."""
    servers = [start_s3(buckets=("restart",))]
    monkeypatch.setenv("MEMX_S3_ENDPOINT_URL", servers[0].endpoint)
    store = S3Store(bucket="restart", prefix=uuid.uuid4().hex[:8], retry=Retry(attempts=10, base_s=0.05, max_s=0.5))
    try:
        store.put_step("profile", "v1", tables={"t": runs(2)}, manifest={})
        with down_for(servers[-1], 0.6) as servers:
            with pytest.raises(EndpointConnectionError):
                S3Store(bucket="restart", retry=Retry(attempts=1)).has_step("profile", "v1")
            started = time.monotonic()
            store.put_step("augment", "v2", tables={"t": runs(3)}, manifest={"upstream": "v1"})
            assert time.monotonic() - started >= 0.4  # it did wait for the server
        assert {r.version for r in store.list_versions()} == {"v1", "v2"}
        with down_for(servers[-1], 0.6) as servers:
            started = time.monotonic()
            assert len(store.get_table("augment", "v2", "t")) == 3  # a table read (checked), retried
            assert time.monotonic() - started >= 0.4
    finally:
        for server in servers:
            server.stop()


def test_retries_are_bounded(monkeypatch):
    monkeypatch.setenv("MEMX_S3_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    store = S3Store(bucket="nowhere", retry=Retry(attempts=3, base_s=0.01))
    started = time.monotonic()
    with pytest.raises(EndpointConnectionError):
        store.put_step("s", "v", tables={"t": runs(1)}, manifest={})
    assert time.monotonic() - started < 5


def test_transient_error_classification():
    def client_error(status: int, code: str) -> ClientError:
        return ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")

    assert is_transient(client_error(503, "SlowDown")) and is_transient(client_error(500, "InternalError"))
    assert not is_transient(client_error(404, "NoSuchKey")) and not is_transient(client_error(403, "AccessDenied"))
    assert is_transient(OSError("AWS Error NETWORK_CONNECTION during HeadObject operation: curlCode: 7"))
    assert not is_transient(FileNotFoundError("missing")) and not is_transient(ValueError("x"))


def test_cli_against_s3(store):
    store.put_step("search", "abc", tables={"top": runs(4)}, manifest={"metrics": {"best_ms": 1.0}})
    app = memx_app
    out = CliRunner().invoke(app, ["artifacts", "ls", "--store", store.root_uri, "--json"])
    assert out.exit_code == 0, out.output
    assert [(d["stage"], d["version"], d["tables"]["top"]["rows"]) for d in json.loads(out.output)] == [("search", "abc", 4)]
    out = CliRunner().invoke(app, ["artifacts", "show", "search", "abc", "--store", store.root_uri, "--table", "top"])
    assert out.exit_code == 0 and '"best_ms": 1.0' in out.output and f"{store.root_uri}/search/abc/top.parquet" in out.output
