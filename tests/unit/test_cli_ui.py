"""`memx ui`: the exact `mlflow ui` command on $MEMX_HOME's registry, loopback only; started for real once."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from typer.testing import CliRunner

from memx.cli.app import app
from memx.cli.ui import ui_argv
from memx.domain.home import memx_home

runner = CliRunner()


def test_print_only_names_the_database_under_memx_home(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    res = runner.invoke(app, ["ui", "--print-only", "--port", "5123"])
    assert res.exit_code == 0, res.output
    db = memx_home() / "mlflow.db"
    assert res.stdout.strip() == (f"mlflow ui --backend-store-uri sqlite:///{db} --default-artifact-root "
                                  f"{(memx_home() / 'mlartifacts').as_uri()} --host 127.0.0.1 --port 5123")


def test_a_tracking_server_is_pointed_to_not_started(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999")
    res = runner.invoke(app, ["ui"])
    assert res.exit_code == 0 and "http://127.0.0.1:5999 serves the UI itself" in res.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # MLflow's UI server takes ~60 s to start on 2 busy cores
def test_the_command_serves_the_ui_on_loopback(tmp_path):
    port = _free_port()
    argv = ui_argv(f"sqlite:///{tmp_path / 'mlflow.db'}", port)
    proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline, body = time.monotonic() + 120, b""
        while time.monotonic() < deadline and not body:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).read()
            except OSError:
                time.sleep(1)
        assert b"MLflow" in body or b"mlflow" in body.lower()
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlflow.db"]  # nothing else in the working directory
