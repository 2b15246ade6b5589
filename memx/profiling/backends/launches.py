"""Launched commands live no longer than their point, nor than memx (docs/architecture.md §Command backend).

Each launch starts in its own session, so it leads its own process group, and everything it starts
(torchrun, its workers, a stray `sleep &`) shares that group unless it leaves on purpose. The group
is killed with SIGKILL:
- when the point ends (a launcher's leftovers never outlive its point) or times out;
- on SIGTERM of memx (`guard()`, main thread), on Ctrl-C and on any exception while waiting;
- at interpreter exit (atexit);
- when memx dies by any means, kill -9 included: a watchdog process, started with the first launch,
  holds the read end of a pipe from memx; the kernel closes the pipe when memx dies, and the watchdog
  then kills every group still registered. (Not covered: a launch in the instant between its start
  and its registration, and processes that leave the group with setsid.)
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import threading
from typing import IO, Iterator

# The watchdog: reads "+PGID" / "-PGID" lines; at end of input (memx closed the pipe or died) it kills
# the groups still registered. Started in its own session, so Ctrl-C at the terminal does not stop it.
WATCHDOG = r"""
import os, signal, sys
groups = set()
for line in sys.stdin:
    if line[:1] in "+-" and line[1:].strip().isdigit():
        (groups.add if line[0] == "+" else groups.discard)(int(line[1:]))
for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
"""
DRAIN_S = 5.0  # after a kill, how long to collect what the group printed before giving up on its pipes


class LaunchRefused(RuntimeError):
    """memx is stopping (Ctrl-C, SIGTERM, an error while profiling): no new launch, no retry."""


class Launches:
    """The process groups of running launches (thread-safe), and the watchdog that outlives memx."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # re-entered by the SIGTERM handler
        self._groups: set[int] = set()
        self._watchdog: subprocess.Popen | None = None
        self._hooked = False
        self._refusing = False

    def _tell(self, line: str) -> None:
        pipe: IO[str] | None = self._watchdog.stdin if self._watchdog is not None else None
        if pipe is None:
            return
        try:
            pipe.write(line + "\n")
            pipe.flush()
        except (OSError, ValueError, RuntimeError):  # watchdog gone, or a signal handler re-entered the write
            pass

    def _start_watchdog(self) -> None:
        if self._watchdog is None or self._watchdog.poll() is not None:
            self._watchdog = subprocess.Popen([sys.executable, "-c", WATCHDOG], stdin=subprocess.PIPE, text=True,
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                              start_new_session=True)
        if not self._hooked:
            atexit.register(self.close)
            os.register_at_fork(after_in_child=self._forget)
            self._hooked = True

    def start(self, args: list[str], **popen: object) -> subprocess.Popen:
        """Popen(args) in a new session (its own process group), registered until `finish`/`kill`."""
        with self._lock:
            if self._refusing:
                raise LaunchRefused("memx is stopping: no new launch")
            self._start_watchdog()
            proc = subprocess.Popen(args, start_new_session=True, **popen)  # type: ignore[call-overload]
            self._groups.add(proc.pid)
            self._tell(f"+{proc.pid}")
        return proc

    def kill(self, proc: subprocess.Popen) -> None:
        """SIGKILL to the launch's whole group (the launcher and whatever it started), then forget it."""
        _kill_group(proc.pid)
        with self._lock:
            self._groups.discard(proc.pid)
            self._tell(f"-{proc.pid}")

    def kill_all(self) -> None:
        with self._lock:
            groups, self._groups = set(self._groups), set()
        for pgid in groups:
            _kill_group(pgid)
            self._tell(f"-{pgid}")

    def refuse(self) -> None:
        """Stop: kill every launch and refuse new ones (worker threads must not retry) until `allow`."""
        with self._lock:
            self._refusing = True
        self.kill_all()

    def allow(self) -> None:
        with self._lock:
            self._refusing = False

    def running(self) -> set[int]:
        with self._lock:
            return set(self._groups)

    def close(self) -> None:
        """Kill what is left, then let the watchdog end (its input closes)."""
        self.kill_all()
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None and watchdog.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                watchdog.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                watchdog.wait(timeout=DRAIN_S)

    def _forget(self) -> None:
        """In a forked child: the parent's launches and watchdog are not ours."""
        self._lock = threading.RLock()  # re-entered by the SIGTERM handler
        self._groups = set()
        if self._watchdog is not None and self._watchdog.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                self._watchdog.stdin.close()
        self._watchdog = None


LAUNCHES = Launches()


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def communicate(proc: subprocess.Popen, stdin: str, timeout_s: float) -> tuple[int | None, str, str]:
    """Feed `stdin`, wait for the launch to end (at most `timeout_s`); kill its group when it has ended,
    timed out, or the wait was interrupted. (exit code, or None on timeout; stdout; stderr)."""
    try:
        out, err = proc.communicate(stdin, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        LAUNCHES.kill(proc)
        out, err = _drain(proc)
        return None, out, err
    except BaseException:
        LAUNCHES.kill(proc)
        raise
    LAUNCHES.kill(proc)  # leftovers of a finished launcher (a background child) die with their point
    return proc.returncode, out, err


def _drain(proc: subprocess.Popen) -> tuple[str, str]:
    """What a killed launch printed; a process that left the group may still hold the pipes: give up on them."""
    try:
        return proc.communicate(timeout=DRAIN_S)
    except subprocess.TimeoutExpired:
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            with contextlib.suppress(OSError, ValueError):
                if pipe is not None:
                    pipe.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=DRAIN_S)
        return "", ""


@contextlib.contextmanager
def guard() -> Iterator[None]:
    """While profiling: SIGTERM kills every launch group first, then ends memx as SIGTERM would; on
    leaving (normally, Ctrl-C or an error) no launch is left running, and after Ctrl-C or SIGTERM
    none starts until the next guard (`LaunchRefused`: no retry). Signals only in the main thread."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None

    def on_sigterm(signum: int, frame: object) -> None:
        LAUNCHES.refuse()
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            os.kill(os.getpid(), signal.SIGTERM)  # the default action: end with SIGTERM's status

    LAUNCHES.allow()
    if main:
        signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    except (KeyboardInterrupt, SystemExit):
        LAUNCHES.refuse()  # until the next guard: worker threads finishing a point start nothing new
        raise
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        LAUNCHES.kill_all()
