"""The `memx` command line (typer): the root group and where every command is mounted.

Exit codes: 0 ok, 2 bad input, 3 no feasible plan, 4 check failed, 5 nothing usable, 130 interrupted — all set by the
root group's one error handler (`memx.cli.options.MemxGroup`, docs/architecture.md §CLI). Each module
in memx/cli/ exposes plain command functions and typer sub-groups; this module mounts them all (`app`, built
when first asked for). `memx COMMAND …` for one of the plain commands (`memx plan …`) mounts only that command
on the same root group — same parsing, help, messages and exit codes — instead of importing every command
module and building typer's whole tree (≈ 0.05 CPU s of every `memx plan`, issue #26).
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
import threading
from typing import NoReturn

import typer

from memx.cli.options import new_app

HELP = "MemX: memory-aware parallel plans for mixed GPU clusters."
# (name, module, attribute) in --help order: the plain commands, then the sub-groups.
COMMANDS = (("plan", "memx.cli.plan", "plan_cmd"), ("catalog", "memx.cli.catalog", "catalog_cmd"),
            ("train", "memx.cli.learn", "train_cmd"), ("evaluate", "memx.cli.learn", "evaluate_cmd"),
            ("profile", "memx.cli.profile", "profile_cmd"), ("experiments", "memx.cli.experiments", "experiments_cmd"),
            ("ui", "memx.cli.ui", "ui_cmd"), ("inspect", "memx.cli.inspect", "inspect_cmd"),
            ("rank", "memx.cli.inspect", "rank_cmd"))
GROUPS = (("cluster", "memx.cli.catalog", "cluster_app"), ("simulate", "memx.cli.simulate", "simulate_app"),
          ("artifacts", "memx.cli.artifacts", "artifacts_app"), ("models", "memx.cli.learn", "models_app"),
          ("ingest", "memx.cli.profile", "ingest_app"))


def build_app(only: str | None = None) -> typer.Typer:
    """The root group with every command and sub-group mounted, or (`only`) that one plain command."""
    root = new_app(HELP)
    for name, module, attr in COMMANDS:
        if only in (None, name):
            root.command(name)(_load(module, attr))
    for name, module, attr in GROUPS if only is None else ():
        root.add_typer(_load(module, attr), name=name)
    return root


def _load(module: str, attr: str):
    # the import statement's own path (`-X importtime` lists what it imports: tests/unit/test_startup.py)
    return getattr(__import__(module, fromlist=(attr,)), attr)


@functools.cache
def full_app() -> typer.Typer:
    return build_app()


def __getattr__(name: str):  # `from memx.cli.app import app`: the whole tree (PEP 562)
    if name == "app":
        return full_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """The console script `memx` (pyproject [project.scripts]); the process ends by `leave`."""
    first = sys.argv[1] if len(sys.argv) > 1 else None
    try:
        (build_app(first) if first in {name for name, _, _ in COMMANDS} else full_app())()
    except SystemExit as done:  # typer (click's standalone mode) always ends so
        leave(done)
    leave(SystemExit(0))


def leave(done: SystemExit) -> NoReturn:
    """End the process as `raise done` would — the atexit callbacks run, stdout and stderr are flushed, the exit
    status is its code — without the interpreter's teardown after them (every module, object and array freed one
    by one: ≈ 0.15 CPU s of an analytic `memx plan`, issue #26), which nothing can observe once those ran. Only
    when the main thread is the last one and the code is an int or None; else, or when a flush fails, `raise done`:
    Python waits for the other threads and reports as usual."""
    if threading.active_count() > 1 or not (done.code is None or isinstance(done.code, int)):
        raise done
    atexit._run_exitfuncs()  # what finalisation runs first (and then forgets: they run once)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - e.g. a closed pipe: Python's own exit reports it
        raise done from None
    os._exit(done.code or 0)


if __name__ == "__main__":  # pragma: no cover
    main()
