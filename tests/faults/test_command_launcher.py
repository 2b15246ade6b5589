"""Faults of the command backend's launches: a launcher whose child holds its output, leftovers of a
finished launcher, and `memx profile` killed by SIGTERM or SIGKILL: no launch process may remain.

Processes are checked by pid (`os.kill(pid, 0)`, a zombie counts as gone). The profiler runs in a
subprocess driven through the library (`python -c`), so these tests do not depend on the CLI.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from memx.domain.catalog import load_model
from memx.pipeline.lifeline import alive
from memx.profiling.backends.command import CommandBackend
from memx.profiling.backends.launches import LAUNCHES
from memx.profiling.design import point

PY = sys.executable
REPO = Path(__file__).resolve().parents[2]

# A launcher that starts a grandchild sleeping 60 s which inherits its stdout/stderr, records both
# pids in PIDDIR/<launcher pid>.json, then (argv[2]) exits at once, exits after detaching the
# grandchild's output, or sleeps too.
LAUNCHER = textwrap.dedent("""
    import json, os, subprocess, sys, time
    piddir, mode = sys.argv[1], sys.argv[2]
    out = subprocess.DEVNULL if mode == "detached" else None
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdout=out, stderr=out)
    tmp = os.path.join(piddir, f".{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump({"launcher": os.getpid(), "grandchild": child.pid}, f)
    os.replace(tmp, os.path.join(piddir, f"{os.getpid()}.json"))
    print('{"time_ms": 1.0, "peak_mem_mib": 10.0}', flush=True)
    if mode == "sleep":
        time.sleep(60)
""")

# The profiler as `memx profile --backend command` runs it, through the library.
DRIVER = textwrap.dedent("""
    import faulthandler, signal, sys
    faulthandler.dump_traceback_later(20)  # still running 20 s on: every thread's stack to stderr (the test shows it)
    # Ctrl-C as a terminal delivers it: an ignored SIGINT stays ignored across exec, and the test process may have
    # inherited one (in a full `make test` run an earlier test's library left SIGINT ignored in the xdist worker)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from memx.domain.catalog import load_cluster, load_model, load_search
    from memx.profiling import profile
    c, m, s = load_cluster("xy-2"), load_model("llama-6l"), load_search("small")
    profile(c, m, s, backend="command", command=sys.argv[2:], jobs=2, timeout_s=120, out_dir=sys.argv[1],
            progress=False)
""")


def wait_gone(pids: list[int], within_s: float = 10.0) -> list[int]:
    """The pids still alive after `within_s` seconds."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def recorded(piddir: Path) -> list[dict[str, int]]:
    return [json.loads(f.read_text()) for f in sorted(piddir.glob("*.json"))]


def wait_recorded(piddir: Path, n: int, within_s: float = 60.0) -> list[dict[str, int]]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and len(recorded(piddir)) < n:
        time.sleep(0.05)
    return recorded(piddir)


@pytest.fixture()
def launcher(tmp_path) -> tuple[Path, Path]:
    script, piddir = tmp_path / "launcher.py", tmp_path / "pids"
    script.write_text(LAUNCHER)
    piddir.mkdir()
    return script, piddir


@pytest.fixture(scope="module")
def pt(conf_root):
    model = load_model("llama-6l", conf_root)
    return model, point("a100-80g", model, tp=1, layers=2, micro_batch=1, seq_len=2048, source="test")


def test_grandchild_holding_stdout_cannot_outlive_the_timeout(launcher, pt):
    script, piddir = launcher
    model, p = pt
    be = CommandBackend(argv=(PY, str(script), str(piddir), "exit"), model_name=model.name, timeout_s=1, retries=3)
    t0 = time.monotonic()
    row = be.measure(p)
    assert time.monotonic() - t0 < 5, "the timeout was ignored"
    assert row["status"] == "failed" and row["reason"].startswith("timeout after 1 s")
    (pids,) = recorded(piddir)
    assert wait_gone([pids["launcher"], pids["grandchild"]], within_s=3) == []
    assert LAUNCHES.running() == set()


def test_leftovers_of_a_finished_launcher_die_with_their_point(launcher, pt):
    script, piddir = launcher
    model, p = pt
    be = CommandBackend(argv=(PY, str(script), str(piddir), "detached"), model_name=model.name, timeout_s=30)
    row = be.measure(p)
    assert row["status"] == "ok" and row["time_ms"] == 1.0
    (pids,) = recorded(piddir)
    assert wait_gone([pids["grandchild"]], within_s=3) == []


def _driver(launcher: tuple[Path, Path], out: Path) -> tuple[subprocess.Popen, list[dict[str, int]]]:
    script, piddir = launcher
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([PY, "-c", DRIVER, str(out), PY, str(script), str(piddir), "sleep"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    pids = wait_recorded(piddir, 2)  # jobs=2: two launches running, each with its grandchild
    assert len(pids) >= 2, proc.stderr.read() if proc.poll() is not None else "launches did not start"
    return proc, pids


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL, signal.SIGINT], ids=["term", "kill", "int"])
def test_killed_profiler_leaves_no_launch_behind(launcher, tmp_path, sig):
    proc, pids = _driver(launcher, tmp_path / "out")
    proc.send_signal(sig)
    try:
        proc.wait(timeout=20)
        ended = True
    except subprocess.TimeoutExpired:
        ended = False
    finally:
        proc.kill()
        stderr = proc.communicate()[1]
    assert ended, f"after {sig.name} the profiler did not end in 20 s; its stacks:\n{stderr}"
    left = wait_gone([p for d in recorded(launcher[1]) for p in d.values()], within_s=10)
    assert left == [], f"after {sig.name}: still running {left}"
    if sig != signal.SIGKILL:
        assert proc.returncode != 0
