"""`memx profile`, `memx train`, `memx plan --predictor registered` in sequence as a user runs them
(separate processes, no extra flags) with one MEMX_HOME, HOME an empty folder and the working directory
another: the plan names the champion `memx train` registered and nothing is written outside MEMX_HOME."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
JOB = ["--cluster", "xy-2", "--model", "llama-6l", "--search", "small"]


def _files(root: Path) -> list[str]:
    return sorted(str(Path(d, f).relative_to(root)) for d, dirs, files in os.walk(root) for f in files + dirs)


def _memx(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memx.cli.app", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def _fresh_user(tmp_path: Path) -> tuple[Path, Path, Path, dict]:
    """MEMX_HOME, an empty HOME and an empty working directory, with no MemX/MLflow/Prefect/XDG variables
    inherited: what a user's shell gives a first run."""
    home, user, cwd = tmp_path / "memx", tmp_path / "user", tmp_path / "cwd"
    user.mkdir()
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("MLFLOW_TRACKING_URI", "MEMX_STORE", "MEMX_CONF", "XDG_CACHE_HOME", "XDG_CONFIG_HOME",
                        "XDG_DATA_HOME", "MPLCONFIGDIR", "PREFECT_HOME")}
    env.update(MEMX_HOME=str(home), HOME=str(user), PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1")
    return home, user, cwd, env


# ~27 s (three processes, a training run): `make test-all`. The default set keeps the registered predictor
# through the pipeline (test_flows_pipeline, test_workflow) and "nothing outside MEMX_HOME" through
# test_plan_analytic_logs_on_request_with_its_report below.
@pytest.mark.slow
def test_profile_train_plan_registered_in_sequence(tmp_path):
    home, user, cwd, env = _fresh_user(tmp_path)

    prof = _memx(["profile", *JOB, "--no-progress"], env, cwd)
    assert prof.returncode == 0, prof.stderr
    assert prof.stdout.count("profile ") == 2 and "rows=" in prof.stdout  # one version per GPU type of xy-2

    train = _memx(["train", *JOB, "--trials", "2", "--seconds", "5"], env, cwd)
    assert train.returncode == 0, train.stderr
    assert "registered memx-stage-predictor version 1" in train.stdout and "promoted to champion" in train.stdout

    plan = _memx(["plan", *JOB, "--predictor", "registered", "--format", "json"], env, cwd)
    assert plan.returncode == 0, plan.stderr
    obj = json.loads(plan.stdout)  # stdout carries only the JSON
    assert obj["predictor"].startswith("registered ") and obj["predictor"].endswith(" v1")
    assert obj["plan"]["cluster"] == "xy-2" and obj["plan"]["stages"]
    assert "logged MLflow run" in plan.stderr  # on by default for the registered predictor
    runs = plan_runs(home / "mlflow.db")
    assert len(runs) == 1 and runs["params.predictor"][0] == obj["predictor"]
    assert runs["params.cluster"][0] == "xy-2" and runs["params.model"][0] == "llama-6l"
    assert runs["metrics.phi"][0] == pytest.approx(obj["predicted"]["phi"])
    assert runs["metrics.iteration_time_ms"][0] == pytest.approx(obj["predicted"]["iteration_time_ms"])
    assert runs["metrics.min_margin"][0] == pytest.approx(obj["predicted"]["min_margin"])

    assert _files(user) == [], "written under HOME"
    assert _files(cwd) == [], "written in the working directory"
    written = _files(home)
    assert "mlflow.db" in written and any(f.startswith("artifacts/profile/") for f in written)


def plan_runs(db: Path):
    """The runs of experiment memx-plans in the SQLite tracking store `db` (read with MLflow itself)."""
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{db}")
    try:
        return mlflow.search_runs(experiment_names=["memx-plans"])
    finally:
        mlflow.set_tracking_uri(None)
        os.environ.pop("MLFLOW_TRACKING_URI", None)


def test_plan_analytic_logs_on_request_with_its_report(tmp_path):
    home, user, cwd, env = _fresh_user(tmp_path)
    out = tmp_path / "out"
    res = _memx(["plan", *JOB, "--format", "json", "--top", "2", "--log", "--out", str(out)], env, cwd)
    assert res.returncode == 0, res.stderr
    assert _files(user) == [], "written under HOME"
    assert _files(cwd) == [], "written in the working directory"
    obj = json.loads(res.stdout)  # MLflow's "View run" lines stay off stdout
    runs = plan_runs(tmp_path / "memx" / "mlflow.db")
    assert len(runs) == 1 and runs["params.predictor"][0] == "analytic"
    assert runs["metrics.max_mem_mib"][0] == pytest.approx(obj["predicted"]["max_mem_mib"])
    assert runs["metrics.search_s"][0] == pytest.approx(obj["search_s"])
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'memx' / 'mlflow.db'}")
    try:
        names = {a.path for a in mlflow.MlflowClient().list_artifacts(runs["run_id"][0])}
    finally:
        mlflow.set_tracking_uri(None)
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    assert {"plan.json", "plan.md", "report.html", "memory.png"} <= names


def test_plan_registered_without_training_says_what_to_run(tmp_path):
    env = {**os.environ, "MEMX_HOME": str(tmp_path / "memx"), "PYTHONPATH": str(REPO)}
    env.pop("MLFLOW_TRACKING_URI", None)
    res = _memx(["plan", *JOB, "--predictor", "registered"], env, tmp_path)
    assert res.returncode == 2 and "memx profile" in res.stderr and "memx train" in res.stderr
    assert "Traceback" not in res.stderr
