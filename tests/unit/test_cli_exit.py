"""`memx.cli.app.leave`: the process ends as `raise SystemExit(code)` would — atexit callbacks, flushed output,
the exit status — without the interpreter's teardown (issue #26)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import atexit, sys, threading, time
from memx.cli.app import leave
atexit.register(lambda: print("atexit ran"))
sys.stdout.write("unflushed ")
sys.stderr.write("to stderr")
if {thread}:
    threading.Thread(target=lambda: (time.sleep(0.3), print("thread done"))).start()
leave(SystemExit({code}))
"""


def test_leave_runs_atexit_flushes_and_exits_with_the_code():
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(thread=False, code=3)], capture_output=True,
                          text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (3, "unflushed atexit ran\n", "to stderr")


def test_leave_with_another_thread_alive_exits_as_python_does():
    """A thread still running: Python's own exit, which waits for it."""
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(thread=True, code=2)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and done.stdout == "unflushed thread done\natexit ran\n"
