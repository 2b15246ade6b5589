"""Processes (issue #11): `memx plan --backend simulated` killed mid-run (SIGTERM, kill -9) leaves no
process behind (checked by pid) and no MLflow run RUNNING (SIGTERM: FAILED at once; kill -9: KILLED by
the next run); two first runs at once on one $MEMX_HOME both succeed and train once. Real Prefect
temporary server, real MLflow (SQLite), subprocesses — no mocks. The JSON-only stdout against a real
`mlflow server` is tests/faults/test_security.py::test_credentials_never_stored_or_printed_and_stdout_is_json."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memx.pipeline.lifeline import alive, children, home_lock

PLAN = [sys.executable, "-m", "memx.cli.app", "plan", "--backend", "simulated", "--format", "json",
        "--cluster", "xy-2", "--model", "llama-6l", "--search", "small", "--top", "2"]


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    return {**env, "MEMX_HOME": str(home)}


def _tree(pid: int) -> set[int]:
    out = set()
    for child in children(pid):
        out |= {child} | _tree(child)
    return out


def _runs(home: Path) -> list[tuple[str, str]]:
    db = home / "mlflow.db"
    if not db.exists():
        return []
    try:
        with sqlite3.connect(db, timeout=5) as con:
            return con.execute("select run_uuid, status from runs").fetchall()
    except sqlite3.Error:  # schema not created yet
        return []


def _wait(cond, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
def test_killed_mid_training_leaves_no_process_and_no_running_run(tmp_path, sig):
    home = tmp_path / "home"
    proc = subprocess.Popen(PLAN, env=_env(home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait(lambda: any(s == "RUNNING" for _, s in _runs(home)), 300, "a RUNNING training run")
        helpers = _tree(proc.pid)
        assert helpers, "the Prefect temporary server runs as a child"
        proc.send_signal(sig)
        proc.wait(timeout=60)
        _wait(lambda: not [p for p in helpers if alive(p)], 30, f"helpers {sorted(helpers)} to end")
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    status = dict(_runs(home))
    if sig == signal.SIGTERM:
        assert "RUNNING" not in status.values() and "FAILED" in status.values(), status
        return
    assert "RUNNING" in status.values()  # kill -9: nothing could run in memx
    again = subprocess.run(PLAN, env=_env(home), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert len(json.loads(again.stdout)["top"]) == 2
    after = dict(_runs(home))
    assert all(after[r] == "KILLED" for r, s in status.items() if s == "RUNNING"), after


@pytest.mark.slow
def test_two_first_runs_at_once_both_succeed_and_train_once(tmp_path):
    home = tmp_path / "home"
    procs = [subprocess.Popen(PLAN, env=_env(home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    plans = [json.loads(out) for out, _ in outs]
    assert plans[0]["plan"] == plans[1]["plan"]
    with sqlite3.connect(home / "mlflow.db") as con:
        versions = con.execute("select version from model_versions").fetchall()
    assert versions == [(1,)]  # the second run waited, then reused the first one's model


def test_home_lock_serialises_processes_and_is_reentrant(tmp_path):
    home = tmp_path / "home"
    probe = ("import sys, time; from pathlib import Path; from memx.pipeline.lifeline import home_lock\n"
             "t0 = time.monotonic()\nwith home_lock(Path(sys.argv[1])):\n    print(round(time.monotonic() - t0, 2))")
    with home_lock(home):
        with home_lock(home):  # re-entrant in one process
            other = subprocess.Popen([sys.executable, "-c", probe, str(home)], stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
            time.sleep(1.5)
            assert other.poll() is None  # still waiting for the lock
    waited = float(other.communicate(timeout=30)[0])
    assert other.returncode == 0 and waited >= 1.0
