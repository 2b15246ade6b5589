"""The closed form's predicted stage tables, kept under `$MEMX_HOME/cache/tables/` between processes (issue #26).

`memx.planner.predictions.predict_tables` is a pure function of its inputs and of the code: the stage contexts
(each context's layer cap), the cluster, the model, the sequence length, the recompute levels, the reserve and,
for the closed form (`memx.planner.cost.AnalyticStageModel`, exactly that type), the predictor's fields with its
runtime profiles resolved (`profiles()`; the ring's profiles too when a context has cp > 1). A file is named by
`stable_hash` of all of them and of `code_version()` — the sources of memx/planner and memx/domain, numpy's and
Python's versions and the CPU features numpy dispatches on (its SIMD loops may round differently) — so a file is
read only by a process that would compute the very same tables: another input, another MemX, numpy, Python or
CPU gives another name. A file that cannot be read or is not a mapping of the expected form is ignored and the
tables predicted again. Learned predictors are never cached here (their rows have their own cache,
memx.learn.cache, and a model version is not a function of the code).

The cache is on only inside `use(folder)` (the CLI's analytic `memx plan`: `memx.cli.plan`); library calls,
tests and the other commands predict as before. Entries are written when the block ends without an exception,
each to a temporary name and then renamed (memx.domain.io.atomic_write_bytes); the newest files (by modification
time: a hit touches its file) are kept up to KEEP_BYTES in all — a table call is 0.1–13 MB, a `--search replicas`
plan's calls about 30 MB.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import pickle
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import numpy as np

from memx.domain.errors import InputError
from memx.domain.hashing import stable_hash
from memx.domain.io import atomic_write_bytes

KEEP_BYTES = 1 << 28  # the table files a home keeps (the newest, at least one)
FORMAT = 1  # the layout of a file's mapping (`memx.planner.predictions._packed`)


@dataclasses.dataclass
class TableCache:
    folder: Path
    pending: dict[Path, bytes] = dataclasses.field(default_factory=dict)

    def path(self, key: str) -> Path:
        return self.folder / f"{key}.pickle"

    def get(self, key: str) -> dict[str, Any] | None:
        """The mapping stored under key, or None (missing, unreadable, not a mapping of this FORMAT)."""
        path = self.path(key)
        try:
            data = pickle.loads(path.read_bytes())  # noqa: S301 - MemX's own local state (module docstring)
        except Exception:  # noqa: BLE001 - missing or unreadable: predict again
            return None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return None
        try:
            os.utime(path)  # the newest are kept (`flush`)
        except OSError:
            pass
        return data

    def put(self, key: str, data: dict[str, Any]) -> None:
        self.pending[self.path(key)] = pickle.dumps({**data, "format": FORMAT}, protocol=pickle.HIGHEST_PROTOCOL)

    def flush(self) -> None:
        """Write the pending entries, then drop the oldest files past KEEP_BYTES; a folder that cannot be written is
        skipped (the cache only saves time)."""
        while self.pending:
            path, blob = self.pending.popitem()
            try:
                atomic_write_bytes(path, blob)
            except (OSError, InputError):
                return
        try:
            files = sorted(((p.stat(), p) for p in self.folder.glob("*.pickle")), key=lambda f: f[0].st_mtime, reverse=True)
            sizes = np.cumsum([st.st_size for st, _ in files])
            for (_, old), total in zip(files[1:], sizes[1:]):
                if total > KEEP_BYTES:
                    old.unlink(missing_ok=True)
        except OSError:
            pass


_ACTIVE: ContextVar[TableCache | None] = ContextVar("memx_table_cache", default=None)


@contextmanager
def use(folder: Path) -> Iterator[TableCache]:
    """Within the block, `predict_tables` reads and keeps the closed form's tables in `folder`; written at its end
    when it raised nothing."""
    cache = TableCache(folder=Path(folder))
    token = _ACTIVE.set(cache)
    try:
        yield cache
    finally:
        _ACTIVE.reset(token)
    cache.flush()


def active() -> TableCache | None:
    return _ACTIVE.get()


@functools.cache
def code_version() -> str:
    """A hash of what the tables depend on beyond their inputs: memx/planner/**/*.py and memx/domain/*.py (their
    contents), numpy's version and the CPU features it dispatches on, Python's version."""
    from numpy._core._multiarray_umath import __cpu_features__  # the SIMD loops numpy chose on this CPU

    features = ",".join(sorted(k for k, on in __cpu_features__.items() if on))
    h = hashlib.sha256(f"{sys.version_info[:3]} numpy {np.__version__} {features}".encode())
    root = Path(__file__).resolve().parents[1]
    for path in sorted([*(root / "planner").rglob("*.py"), *(root / "domain").glob("*.py")]):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def key(kind: str, contexts: dict, *parts: Any) -> str:
    """The file name of a table call: `kind`, the code version, the contexts (their field values in order, with
    their caps) and `parts` (specs and scalars, by their canonical JSON: memx.domain.hashing)."""
    ctx = list(contexts)
    names = [f.name for f in dataclasses.fields(ctx[0])] if ctx else []
    rows = [[getattr(c, f) for f in names] + [contexts[c]] for c in ctx]
    return stable_hash(kind, code_version(), names, rows, *parts, chars=32)
