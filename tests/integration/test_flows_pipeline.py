"""The Prefect pipeline for real: versioned stages, reuse, crash + resume, S3 + MLflow server."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from support.services import FAKE_AWS_ENV, mlflow_server, s3_server
from memx.pipeline.store import store_from_uri

SMALL = dict(cluster="three-vendor-20", model="llama-6l", search="small")


@pytest.fixture
def local_store(tmp_path):
    return str(tmp_path / "artifacts")


def _versions(store_uri):
    st = store_from_uri(store_uri)
    return {(r.step, r.version): r.created_at for r in st.list_versions()}


def test_pipeline_runs_then_reuses_every_stage(prefect_api, local_store, tmp_path):
    from flows.pipeline import pipeline_flow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    job = {**SMALL, "cluster": "xy-2"}  # two GPU types: every stage, two profiles
    first = pipeline_flow(**job, store=local_store, tracking_uri=uri)
    stored = _versions(local_store)
    assert {s for s, _ in stored} == {"profile", "augment", "train", "search"}
    assert len([1 for s, _ in stored if s == "profile"]) == 2  # one profile per GPU type
    assert sum(st["layers"] for st in first["plan"]["stages"]) == 6
    again = pipeline_flow(**job, store=local_store, tracking_uri=uri)
    assert _versions(local_store) == stored  # nothing new written: every stage reused
    assert again["plan"] == first["plan"] and again["version"] == first["version"]


# ~20 s (two pipeline runs): `make test-all`; that growth changes no profile or training fingerprint stays in
# the default set via tests/unit/test_fingerprint.py.
@pytest.mark.slow
def test_a_new_node_of_a_known_gpu_type_re_plans_only(prefect_api, local_store, tmp_path):
    from flows.pipeline import pipeline_flow
    from memx.domain.catalog import default_conf_root
    import shutil, yaml

    conf = tmp_path / "conf"
    shutil.copytree(default_conf_root(), conf)
    data = yaml.safe_load((conf / "clusters" / "three-vendor-20.yaml").read_text())
    data["nodes"].append({"gpu": "a100-80g", "count": 4})
    (conf / "clusters" / "three-vendor-20.yaml").write_text(yaml.safe_dump(data))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = pipeline_flow(**SMALL, store=local_store, tracking_uri=uri)
    grown = pipeline_flow(**SMALL, conf=str(conf), store=local_store, tracking_uri=uri)
    assert grown["profiles"] == first["profiles"] and grown["train"] == first["train"]
    assert grown["version"] != first["version"]


@pytest.mark.slow  # ~24 s; the default set runs the pipeline in test_pipeline_runs_then_reuses_every_stage (issue #17: `make test` under 3 min)
def test_crash_mid_pipeline_leaves_no_partial_stage_and_resumes(prefect_api, local_store, tmp_path, monkeypatch):
    from flows.pipeline import pipeline_flow
    from support.services import free_port

    # The tracking server is down when the train stage starts: training crashes.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "3")
    from mlflow.exceptions import MlflowException

    port = free_port()
    with pytest.raises(MlflowException, match=rf"API request to http://127.0.0.1:{port}/api/2.0/mlflow/.* failed"):
        pipeline_flow(**SMALL, store=local_store, tracking_uri=f"http://127.0.0.1:{port}")
    after_crash = _versions(local_store)
    assert {s for s, _ in after_crash} == {"profile", "augment"}  # complete stages only, no train/search
    good_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    res = pipeline_flow(**SMALL, store=local_store, tracking_uri=good_uri)
    resumed = _versions(local_store)
    for key, created in after_crash.items():  # profile and augment were reused, not redone
        assert resumed[key] == created
    assert {s for s, _ in resumed} == {"profile", "augment", "train", "search"}
    _check_trained(store_from_uri(local_store), res, good_uri)


def _check_trained(st, res, tracking_uri):
    """The stored train step registered version 1, promoted, with the hashes the registry holds, and
    the plan served is the one the search step stored: a valid plan of all six layers."""
    from mlflow import MlflowClient

    from memx.pipeline import registry

    train = st.manifest("train", res["train"])
    assert (train["model_version"], train["promoted"]) == (1, True)
    mv = MlflowClient(tracking_uri=tracking_uri).get_model_version(registry.MODEL_NAME, "1")
    assert mv.tags["predictor_version"] == train["predictor_version"] and mv.tags["fingerprint"] == train["fingerprint"]
    assert {k: mv.tags[k] for k in registry.HASH_TAGS.values()} == train["sha256"]
    stored = json.loads(st.get_file("search", res["version"], "plan.json"))
    assert res["plan"] == stored["plan"] and res["plan"]["model"] == "llama-6l"
    assert sum(stage["layers"] for stage in res["plan"]["stages"]) == 6
    assert res["predicted"]["iteration_time_ms"] == stored["predicted"]["iteration_time_ms"] > 0


@pytest.mark.slow  # ~39 s; S3 and the MLflow server stay in the default set via test_store_s3 and test_services_mlflow (issue #17: `make test` under 3 min)
def test_pipeline_on_s3_and_mlflow_server_survives_s3_restart(prefect_api, tmp_path, monkeypatch):
    from flows.augment import augment_flow
    from flows.profile import profile_flow
    from flows.search import search_flow
    from flows.train import train_flow

    for k, v in FAKE_AWS_ENV.items():
        monkeypatch.setenv(k, v)
    bucket, prefix = "memx", f"p-{uuid.uuid4().hex[:8]}"
    store = f"s3://{bucket}/{prefix}"
    with s3_server(buckets=(bucket,)) as s3:
        port = int(s3.endpoint.rsplit(":", 1)[1])
        monkeypatch.setenv("MEMX_S3_ENDPOINT_URL", s3.endpoint)
        monkeypatch.setenv("MLFLOW_S3_ENDPOINT_URL", s3.endpoint)
        with mlflow_server(workdir=tmp_path / "mlflow", s3=s3, artifacts_destination=f"s3://{bucket}/mlflow",
                           env=FAKE_AWS_ENV) as ml:
            profiles = profile_flow(**SMALL, store=store)
            s3.stop()  # the S3 server goes away between stages …
            with s3_server(port=port, buckets=(bucket,)):  # … and comes back on the same address
                aug = augment_flow(sorted(profiles.values()), store=store)
                trained = train_flow(aug, **SMALL, store=store, tracking_uri=ml.url)
                res = search_flow(trained, **SMALL, store=store, tracking_uri=ml.url)
                st = store_from_uri(store)
                assert {r.step for r in st.list_versions()} == {"profile", "augment", "train", "search"}
                assert st.manifest("train", trained)["tracking_uri"] == ml.url
                _check_trained(st, {**res, "train": trained}, ml.url)


@pytest.mark.slow  # ~43 s: two pipeline runs (issue #17: `make test` under 3 min)
def test_nightly_reprofiles_only_stale_gpu_types(prefect_api, local_store, tmp_path):
    from flows.pipeline import pipeline_flow
    from flows.reprofile import reprofile_stale_flow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = pipeline_flow(**SMALL, store=local_store, tracking_uri=uri)
    fresh = reprofile_stale_flow(**SMALL, store=local_store, max_age_days=1.0)  # nothing is a day old
    assert fresh["profiles"] == first["profiles"]
    stale = reprofile_stale_flow(**SMALL, store=local_store, max_age_days=0.0)  # everything is stale
    assert set(stale["profiles"]) == set(first["profiles"])
    assert all(stale["profiles"][g] != first["profiles"][g] for g in first["profiles"])  # new versions
    profiles = [r for r in store_from_uri(local_store).list_versions("profile")]
    assert len(profiles) == 6  # the old ones stay; lookups take the newest


@pytest.mark.slow  # 8 s; the command backend stays in the default set via tests/integration/test_profiling_cli.py and test_profiling_command.py (make test under 3 min)
def test_memx_plan_with_the_command_backend(prefect_api, tmp_path, monkeypatch):
    """`memx plan --backend command`: a real launcher per profile point (a small script standing in
    for Megatron-LM), then augment, train and search through the pipeline."""
    import json
    import sys

    from typer.testing import CliRunner

    from memx.cli.app import app

    script = Path(__file__).resolve().parents[1] / "fixtures" / "profiling" / "json_ok.py"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    res = CliRunner().invoke(app, ["plan", "--cluster", "xy-2", "--model", "llama-6l", "--search", "small",
                                   "--backend", "command", "--command", f"{sys.executable} {script} {{tp}}",
                                   "--jobs", "2", "--store", str(tmp_path / "artifacts"), "--format", "json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["plan"]["cluster"] == "xy-2" and set(out["artifacts"]) == {"profiles", "augment", "train", "search"}
    runs = store_from_uri(str(tmp_path / "artifacts")).get_table("profile", next(iter(out["artifacts"]["profiles"].values())),
                                                                 "stage_runs")
    assert (runs["backend"] == "command").all() and (runs["status"] == "ok").any()
    import mlflow  # the plan is an MLflow run in memx-plans, logged by default in pipeline mode (issue #17)

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    logged = mlflow.search_runs(experiment_names=["memx-plans"])
    assert len(logged) == 1 and logged["params.predictor"][0] == out["predictor"]
    assert logged["metrics.phi"][0] == pytest.approx(out["predicted"]["phi"])
    missing = CliRunner().invoke(app, ["plan", "--model", "llama-6l", "--search", "small", "--backend", "command"])
    assert missing.exit_code == 2 and "--command" in missing.stderr
