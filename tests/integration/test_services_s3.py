"""support.services' moto S3 server: loopback only, real HTTP, restart on the same port."""

from __future__ import annotations

import boto3
import pytest

from support.services import FAKE_AWS_ENV, free_port, listening_hosts, s3_server, start_mlflow, start_s3


@pytest.fixture(autouse=True)
def fake_aws(monkeypatch):
    for key, value in FAKE_AWS_ENV.items():
        monkeypatch.setenv(key, value)


def test_s3_server_on_loopback_with_buckets():
    with s3_server(buckets=("one", "two")) as s3:
        assert s3.host == "127.0.0.1" and s3.endpoint == f"http://127.0.0.1:{s3.port}"
        assert listening_hosts(s3.port) == {"127.0.0.1"}  # the socket really is bound to loopback only
        client = boto3.client("s3", endpoint_url=s3.endpoint)
        assert {"one", "two"} <= {b["Name"] for b in client.list_buckets()["Buckets"]}
        assert s3.env()["MLFLOW_S3_ENDPOINT_URL"] == s3.endpoint == s3.env()["MEMX_S3_ENDPOINT_URL"]


def test_restart_on_same_port():
    first = start_s3(buckets=("again",))
    first.stop()
    second = start_s3(port=first.port, buckets=("again",))  # an existing bucket is fine
    try:
        assert second.endpoint == first.endpoint
        boto3.client("s3", endpoint_url=second.endpoint).put_object(Bucket="again", Key="k", Body=b"v")
    finally:
        second.stop()


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "example.com"])
def test_refuses_non_loopback(host, tmp_path):
    with pytest.raises(ValueError, match="loopback"):
        start_s3(host=host)
    with pytest.raises(ValueError, match="loopback"):
        start_mlflow(workdir=tmp_path, host=host, port=free_port())
    with pytest.raises(ValueError, match="loopback"):
        free_port(host)
