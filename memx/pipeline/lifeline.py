"""Process hygiene of a pipeline run (issue #11; docs/reliability.md §Processes).

- `home_lock()`: one pipeline run at a time per $MEMX_HOME (``fcntl.flock`` on ``$MEMX_HOME/.lock``,
  re-entrant within a process): a second run waits, then reuses what the first stored (content-hash
  versions), instead of creating the MLflow schema twice or training twice.
- `adopt_children()`: the helper servers this process started (Prefect's temporary API server) are
  registered with a watchdog process that holds the read end of a pipe from memx; when memx dies by
  any means, kill -9 included, the kernel closes the pipe and the watchdog ends them (SIGTERM, then
  SIGKILL). At a normal exit they are stopped by their owners (Prefect's atexit) and deregistered.
- `sigterm_exits()`: SIGTERM raises SystemExit in the main thread, so context managers and atexit run:
  the MLflow run ends FAILED, the temporary server stops.
- `mark_stale_runs()`: MLflow runs this host's memx left RUNNING in this $MEMX_HOME (its process is
  gone: kill -9) are marked KILLED by the next run.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from memx.domain.hashing import stable_hash
from memx.domain.home import memx_home

# The watchdog: reads "+PID" / "-PID" lines; at end of input (memx closed the pipe or died) it sends
# SIGTERM to the pids still registered, then SIGKILL to those still there 5 s later. Own session, so
# Ctrl-C at the terminal does not stop it before memx.
WATCHDOG = r"""
import os, signal, sys, time
pids = set()
for line in sys.stdin:
    if line[:1] in "+-" and line[1:].strip().isdigit():
        (pids.add if line[0] == "+" else pids.discard)(int(line[1:]))
def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False
for sig in (signal.SIGTERM, signal.SIGKILL):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
"""

_lock = threading.RLock()
_held: dict[Path, tuple[IO[bytes], int, bool]] = {}  # lock path → (open file, depth, home created by it)
_watchdog: subprocess.Popen | None = None
_adopted: set[int] = set()


@contextlib.contextmanager
def home_lock(home: Path | None = None) -> Iterator[Path]:
    """Hold the exclusive lock of $MEMX_HOME (waits for another process that holds it). The `.lock` file
    goes when the last holder leaves (and the home too when this lock created it and nothing else was
    written): a rejected input leaves nothing behind."""
    path = (home or memx_home()) / ".lock"
    with _lock:
        if path in _held:
            f, depth, created = _held[path]
            _held[path] = (f, depth + 1, created)
        else:
            created = not path.parent.exists()
            _held[path] = (_acquire(path), 1, created)
    try:
        yield path
    finally:
        with _lock:
            f, depth, created = _held[path]
            if depth > 1:
                _held[path] = (f, depth - 1, created)
            else:
                del _held[path]
                path.unlink(missing_ok=True)  # while held: a waiter re-checks the inode (_acquire)
                fcntl.flock(f, fcntl.LOCK_UN)
                f.close()
                if created:
                    with contextlib.suppress(OSError):
                        path.parent.rmdir()  # only when empty


def _acquire(path: Path):
    """flock on `path`, retried when the holder removed the file meanwhile (the lock we got is then on
    an unlinked inode; the next holder creates a new file)."""
    while True:
        path.parent.mkdir(parents=True, exist_ok=True)  # a holder that created the home removes it when empty
        f = open(path, "ab")  # noqa: SIM115 - held across the caller's yield
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            if os.fstat(f.fileno()).st_ino == os.stat(path).st_ino:
                return f
        except FileNotFoundError:
            pass
        f.close()


def _tell(line: str) -> None:
    pipe = _watchdog.stdin if _watchdog is not None else None
    if pipe is None:
        return
    try:
        pipe.write(line + "\n")
        pipe.flush()
    except (OSError, ValueError, RuntimeError):  # watchdog gone, or re-entered from a signal handler
        pass


def _release() -> None:
    """At a normal exit: the helpers were stopped by their owners; let the watchdog end quietly."""
    global _watchdog
    with _lock:
        for pid in _adopted:
            _tell(f"-{pid}")
        _adopted.clear()
        if _watchdog is not None and _watchdog.stdin is not None:
            with contextlib.suppress(OSError):
                _watchdog.stdin.close()
            _watchdog = None


def children(pid: int | None = None) -> list[int]:
    """The live direct children of `pid` (default: this process), from /proc."""
    pid = os.getpid() if pid is None else pid
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:  # field 4: ppid (after "comm)")
                out.append(int(entry.name))
    return sorted(out)


def adopt(pids: list[int]) -> None:
    """Register processes that must not outlive memx with the watchdog (started on first use)."""
    global _watchdog
    with _lock:
        if _watchdog is None or _watchdog.poll() is not None:
            _watchdog = subprocess.Popen([sys.executable, "-c", WATCHDOG], stdin=subprocess.PIPE, text=True,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            atexit.register(_release)
        for pid in pids:
            if pid != _watchdog.pid and pid not in _adopted:
                _adopted.add(pid)
                _tell(f"+{pid}")


def adopt_children() -> list[int]:
    """Every current child of this process (e.g. Prefect's temporary API server) is adopted; returns them.
    Call once the helpers are up (inside a flow: the server is running)."""
    found = [p for p in children() if _watchdog is None or p != _watchdog.pid]
    adopt(found)
    return found


def _exit_on_sigterm(signum, frame):  # noqa: ARG001 - signal handler signature
    raise SystemExit(128 + signum)


def sigterm_exits() -> None:
    """SIGTERM → SystemExit(143) in the main thread (context managers, atexit run); elsewhere a no-op."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)


@contextlib.contextmanager
def guarded() -> Iterator[None]:
    """A pipeline run: the $MEMX_HOME lock held, SIGTERM turned into a clean exit."""
    sigterm_exits()
    with home_lock():
        yield


def run_tags() -> dict[str, str]:
    """Tags of an MLflow run that say which memx process on which host and home it belongs to."""
    return {"memx.home": stable_hash(str(memx_home().resolve())), "memx.host": socket.gethostname(),
            "memx.pid": str(os.getpid())}


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (dead, waiting for its parent to reap it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def mark_stale_runs(client, experiment_id: str) -> list[str]:
    """RUNNING runs of this host and $MEMX_HOME whose process is gone → KILLED; returns their ids."""
    mine = run_tags()
    stale = []
    for run in client.search_runs([experiment_id], filter_string="attributes.status = 'RUNNING' and "
                                  f"tags.`memx.home` = '{mine['memx.home']}' and tags.`memx.host` = '{mine['memx.host']}'"):
        pid = run.data.tags.get("memx.pid", "")
        if pid.isdigit() and int(pid) != os.getpid() and not alive(int(pid)):
            nested = client.search_runs([experiment_id], filter_string="attributes.status = 'RUNNING' and "
                                        f"tags.`mlflow.parentRunId` = '{run.info.run_id}'")
            for r in [*nested, run]:  # the tuning trials (nested runs) too
                client.set_terminated(r.info.run_id, status="KILLED")
                stale.append(r.info.run_id)
    return stale
