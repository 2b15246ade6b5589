"""A real `mlflow server` (SQLite backend, artifacts proxied to the moto S3 bucket) started by
support.services on 127.0.0.1: log a run with a metric and an artifact, read both back, and find the
artifact in the bucket."""

from __future__ import annotations

import boto3
import pytest

from support.services import FAKE_AWS_ENV, listening_hosts, local_services


@pytest.fixture
def services(tmp_path, monkeypatch):
    for key, value in FAKE_AWS_ENV.items():
        monkeypatch.setenv(key, value)
    with local_services(workdir=tmp_path / "mlflow", bucket="mlflow-test") as svc:
        yield svc
    assert not svc.mlflow.running  # stopped cleanly: the server and its uvicorn worker are gone


def test_mlflow_server_logs_artifacts_to_s3(services, tmp_path):
    assert services.mlflow.url.startswith("http://127.0.0.1:")
    assert listening_hosts(int(services.mlflow.url.rsplit(":", 1)[1])) == {"127.0.0.1"}  # bound to loopback only
    assert listening_hosts(services.s3.port) == {"127.0.0.1"}
    from mlflow import MlflowClient  # imported here: collecting the suite stays cheap

    client = MlflowClient(tracking_uri=services.mlflow.url)
    experiment = client.create_experiment("memx-services-test")
    run = client.create_run(experiment)
    client.log_metric(run.info.run_id, "val_mape", 0.12)
    report = tmp_path / "report.md"
    report.write_text("# plan\nok\n")
    client.log_artifact(run.info.run_id, str(report), artifact_path="reports")
    client.set_terminated(run.info.run_id)

    again = client.get_run(run.info.run_id)
    assert again.data.metrics["val_mape"] == pytest.approx(0.12)
    got = client.download_artifacts(run.info.run_id, "reports/report.md", str(tmp_path / "down"))
    assert open(got).read() == "# plan\nok\n"

    s3 = boto3.client("s3", endpoint_url=services.s3.endpoint)
    stored = [o["Key"] for o in s3.list_objects_v2(Bucket="mlflow-test", Prefix="mlflow/").get("Contents", ())]
    assert any(k.endswith(f"{run.info.run_id}/artifacts/reports/report.md") for k in stored), stored
    env = services.env()
    assert env["MLFLOW_TRACKING_URI"] == services.mlflow.url and env["MEMX_STORE"] == "s3://mlflow-test/artifacts"
