"""$MEMX_HOME is self-contained (issue #25): a home moved or copied to another path keeps working (MLflow's
absolute artifact paths are rewritten, manifests name the store `sqlite:///$MEMX_HOME/…`), and nothing is
written outside it — no `~/.config/mlflow/telemetry.json` (telemetry off), no MLflow INFO lines."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from memx.domain.home import TELEMETRY_OFF
from memx.pipeline import registry

REPO = Path(__file__).resolve().parents[2]


def test_relocate_rewrites_only_the_old_homes_artifact_paths(tmp_path, monkeypatch, caplog):
    """The fast half (MLflow's tables as plain SQLite; the slow test below uses MLflow itself)."""
    import sqlite3

    home = tmp_path / "new"
    home.mkdir()
    monkeypatch.setenv("MEMX_HOME", str(home))
    old = (tmp_path / "old" / "mlartifacts").as_uri()
    with sqlite3.connect(home / "mlflow.db") as con:
        con.execute("create table experiments (artifact_location text)")
        con.execute("create table runs (artifact_uri text)")
        con.execute("create table model_versions (storage_location text, source text)")
        con.execute("insert into experiments values (?)", (old,))
        con.executemany("insert into runs values (?)", [(f"{old}/r1/artifacts",), ("s3://bucket/elsewhere",)])
        con.execute("insert into model_versions values (?, ?)", (f"{old}/models/m/artifacts", "models:/m-1"))
    uri = registry.tracking_uri()
    registry.relocate(uri)
    new = (home / "mlartifacts").as_uri()
    with sqlite3.connect(home / "mlflow.db") as con:
        assert con.execute("select * from experiments").fetchall() == [(new,)]
        assert con.execute("select * from runs").fetchall() == [(f"{new}/r1/artifacts",), ("s3://bucket/elsewhere",)]
        assert con.execute("select * from model_versions").fetchall() == [(f"{new}/models/m/artifacts", "models:/m-1")]
    assert f"{old} rewritten to {new}" in caplog.text
    assert registry.portable_uri() == "sqlite:///$MEMX_HOME/mlflow.db"
    assert registry.portable_uri("http://u:p@host:5000") == "http://***@host:5000"


@pytest.mark.slow  # MLflow creates its schema (~20 s on 2 cores)
def test_a_moved_home_reads_and_writes_its_own_artifacts(tmp_path, monkeypatch, caplog):
    import mlflow

    old, new = tmp_path / "old", tmp_path / "new"
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MEMX_HOME", str(old))
    registry.setup()
    with mlflow.start_run() as run:
        mlflow.log_text("kept", "note.txt")
    assert registry.portable_uri() == "sqlite:///$MEMX_HOME/mlflow.db"
    shutil.move(old, new)
    monkeypatch.setenv("MEMX_HOME", str(new))
    client = registry.setup()
    assert "MLflow's artifact paths" in caplog.text and str(old) in caplog.text
    assert client.get_experiment_by_name(registry.EXPERIMENT).artifact_location == (new / "mlartifacts").as_uri()
    assert client.get_run(run.info.run_id).info.artifact_uri.startswith((new / "mlartifacts").as_uri())
    assert mlflow.artifacts.load_text(f"runs:/{run.info.run_id}/note.txt") == "kept"
    with mlflow.start_run():
        mlflow.log_text("new", "more.txt")
    assert not old.exists()  # nothing recreated at the old path
    caplog.clear()
    registry.setup()
    assert "MLflow's artifact paths" not in caplog.text  # rewritten once


@pytest.mark.slow  # a fresh interpreter (~10 s): MLflow treats a pytest process as a test run and skips telemetry
def test_a_command_writes_nothing_under_home_and_no_mlflow_info_lines(tmp_path):
    fake_home, memx_home = tmp_path / "user", tmp_path / "memx"
    fake_home.mkdir()
    keep = ("PATH", "LANG", "LC_ALL", "TMPDIR")
    env = {k: v for k, v in os.environ.items() if k in keep and k not in TELEMETRY_OFF}
    env.update(HOME=str(fake_home), MEMX_HOME=str(memx_home), PYTHONPATH=str(REPO))
    res = subprocess.run([sys.executable, "-m", "memx.cli.app", "plan", "--cluster", "xy-2", "--model", "llama-6l",
                          "--search", "small", "--log", "--format", "json"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert list(fake_home.rglob("*")) == [], "written under HOME (e.g. ~/.config/mlflow/telemetry.json)"
    assert "INFO" not in res.stderr and (memx_home / "mlflow.db").is_file(), res.stderr
