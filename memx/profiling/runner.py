"""Run points through a backend: progress bar with ETA, resume, checkpoints, Ctrl-C.

- Resume: rows already in `existing` (or in the Parquet at `out_path`) with status ok/oom are not
  measured again (key = hash of the signature columns); failed ones are retried and replaced.
- Checkpoints: the table is written atomically every `checkpoint_s` seconds and at the end.
- Ctrl-C (KeyboardInterrupt): what was measured is written atomically, then the interrupt is re-raised.
"""

from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import pandas as pd

from memx.domain.io import atomic_write_parquet
from memx.domain.records import DONE_STATUSES, empty_stage_runs, failed_row, signature_key, stage_runs_frame
from memx.profiling.backends import Backend

CHECKPOINT_S = 10.0  # our choice: at most 10 s of measurements lost to a hard kill


def load_existing(path: Path | None) -> pd.DataFrame:
    if path is None or not path.is_file():
        return empty_stage_runs()
    return stage_runs_frame(pd.read_parquet(path))


def pending_points(points: Sequence[Mapping[str, Any]], existing: pd.DataFrame) -> list[Mapping[str, Any]]:
    """Points not yet measured (ok/oom) in `existing`, first occurrence of each signature only."""
    done = {signature_key(r) for r in existing[existing["status"].isin(DONE_STATUSES)].to_dict("records")}
    out, seen = [], set(done)
    for p in points:
        k = signature_key(p)
        if k not in seen:
            seen.add(k)
            out.append(p)
    return out


def _safe_measure(backend: Backend, point: Mapping[str, Any]) -> dict[str, Any]:
    try:
        return backend.measure(point)
    except Exception as exc:  # a backend bug must not lose the run: the point is failed, with why
        return failed_row(point, status="failed", reason=f"{type(exc).__name__}: {exc}", backend=backend.name)


def _results(backend: Backend, points: Sequence[Mapping[str, Any]], jobs: int) -> Iterator[dict[str, Any]]:
    if jobs <= 1:
        for p in points:
            yield _safe_measure(backend, p)
        return
    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        queue = iter(points)
        running: set[Future] = set()
        for p in queue:  # keep at most 2·jobs submitted so Ctrl-C does not wait for a long queue
            running.add(pool.submit(_safe_measure, backend, p))
            if len(running) >= 2 * jobs:
                break
        while running:
            finished, running = wait(running, return_when=FIRST_COMPLETED)
            for f in finished:
                nxt = next(queue, None)
                if nxt is not None:
                    running.add(pool.submit(_safe_measure, backend, nxt))
                yield f.result()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


class _Progress:
    """A rich progress bar with ETA on stderr, or nothing."""

    def __init__(self, enabled: bool, total: int, label: str):
        self.bar = None
        if enabled and total:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn, TimeRemainingColumn

            self.bar = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), "ETA", TimeRemainingColumn(), console=Console(stderr=True))
            self.task = self.bar.add_task(label, total=total)

    def __enter__(self) -> Callable[[], None]:
        if self.bar is not None:
            self.bar.start()
        return self.advance

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.advance(self.task)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()


def merge(existing: pd.DataFrame, rows: list[dict[str, Any]]) -> pd.DataFrame:
    """existing rows, minus failed rows of signatures measured again, plus the new rows."""
    if not rows:
        return existing
    new_keys = {signature_key(r) for r in rows}
    keep = [r for r in existing.to_dict("records") if r["status"] in DONE_STATUSES or signature_key(r) not in new_keys]
    return stage_runs_frame(keep + rows)


def run_points(points: Sequence[Mapping[str, Any]], backend: Backend, *, existing: pd.DataFrame | None = None,
               out_path: Path | None = None, jobs: int = 1, progress: bool = False, label: str = "profiling",
               checkpoint_s: float = CHECKPOINT_S) -> pd.DataFrame:
    """Measure the points not yet in `existing`; return existing + new rows (stage_runs)."""
    existing = load_existing(out_path) if existing is None else existing
    todo = pending_points(points, existing)
    rows: list[dict[str, Any]] = []
    last = time.monotonic()
    try:
        with _Progress(progress, len(todo), label) as advance:
            for row in _results(backend, todo, jobs):
                rows.append(row)
                advance()
                if out_path is not None and time.monotonic() - last > checkpoint_s:
                    atomic_write_parquet(merge(existing, rows), out_path)
                    last = time.monotonic()
    except KeyboardInterrupt:
        if out_path is not None:
            atomic_write_parquet(merge(existing, rows), out_path)
        raise
    result = merge(existing, rows)
    if out_path is not None:
        atomic_write_parquet(result, out_path)
    return result
