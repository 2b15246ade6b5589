"""`memx plan --progress`: the search's progress bar goes to stderr, stdout stays the requested format
(issue #17); without the flag and off a terminal nothing is drawn."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from memx.cli import progress
from memx.cli.app import app

JOB = ["plan", "--cluster", "xy-2", "--model", "llama-6l", "--search", "small", "--format", "json", "--top", "2"]


def test_progress_on_stderr_and_pure_json_on_stdout(monkeypatch):
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)  # the small search ends before the usual 2 s
    res = CliRunner().invoke(app, [*JOB, "--progress"])
    assert res.exit_code == 0, res.stderr
    obj = json.loads(res.stdout)  # nothing but the JSON on stdout
    assert obj["plan"]["cluster"] == "xy-2"
    assert "search" in res.stderr and "ETA" in res.stderr and "\x1b[" in res.stderr  # a drawn bar
    assert res.stdout == json.dumps(obj) + "\n"


def test_no_progress_by_default_off_a_terminal_and_no_mlflow_run(monkeypatch, tmp_path):
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)
    monkeypatch.setenv("MEMX_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    res = CliRunner().invoke(app, JOB)
    assert res.exit_code == 0, res.stderr
    json.loads(res.stdout)
    assert "ETA" not in res.stderr
    # the closed form logs an MLflow run only with --log: no tracking database is created
    assert "MLflow" not in res.stderr and not (tmp_path / "home" / "mlflow.db").exists()


def test_progress_enabled_rules():
    assert progress.progress_enabled(True, json_output=True) is True
    assert progress.progress_enabled(False, json_output=False) is False
    assert progress.progress_enabled(None, json_output=True) is False
