"""Progress on stderr for long CLI steps (issue #17): a rich bar with ETA that appears only once a step
has run for `delay_s` seconds, so quick runs print nothing. stdout never carries it."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterator

SHOW_AFTER_S = 2.0


def progress_enabled(flag: bool | None, *, json_output: bool) -> bool:
    """`--progress/--no-progress` when given; otherwise on when stderr is a terminal and stdout is not JSON."""
    if flag is not None:
        return flag
    return sys.stderr.isatty() and not json_output


@contextmanager
def delayed_progress(enabled: bool, label: str, *, delay_s: float | None = None,
                     force_terminal: bool | None = None) -> Iterator[Callable[[int, int], None]]:
    """A `cb(done, total)` for memx.planner.search.search(on_progress=...) and the like, called from the
    main thread: the bar starts at the first call after `delay_s` and is removed when the block ends."""
    if not enabled:
        yield lambda done, total: None
        return
    from rich.console import Console  # rich only where a bar may show (not for `--format json`)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn, TimeRemainingColumn

    t0, delay_s = time.monotonic(), SHOW_AFTER_S if delay_s is None else delay_s
    # force_terminal: a bar (not just its final line) also where stderr is a pipe, as `--progress` asks for
    console = Console(stderr=True, force_terminal=force_terminal if force_terminal is not None else True)
    bar = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), "ETA", TimeRemainingColumn(), console=console, transient=True)
    state: dict = {}

    def update(done: int, total: int) -> None:
        if "task" not in state:
            if time.monotonic() - t0 < delay_s:
                return
            bar.start()
            state["task"] = bar.add_task(label, total=total)
        bar.update(state["task"], completed=done, total=total)
        bar.refresh()

    try:
        yield update
    finally:
        if "task" in state:
            bar.stop()
