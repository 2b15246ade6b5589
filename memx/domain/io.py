"""Atomic file output: write to a temporary name in the same folder, then rename.

Nothing is ever half-written: a crash leaves either the old file or the new one. Files get the
permissions an ordinary `open()` would give (0666 less the umask, e.g. 0644), or 0777 less the umask
for executables (`executable=True`, e.g. megatron.sh) — not mkstemp's private 0600.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _tmp_beside(path: Path, executable: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, (0o777 if executable else 0o666) & ~_umask())
    os.close(fd)
    return Path(tmp)


def atomic_write_bytes(path: str | Path, data: bytes, *, executable: bool = False) -> Path:
    path = Path(path)
    tmp = _tmp_beside(path, executable)
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def atomic_write_text(path: str | Path, text: str, *, executable: bool = False) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"), executable=executable)


def atomic_write_parquet(df: pd.DataFrame, path: str | Path) -> Path:
    path = Path(path)
    tmp = _tmp_beside(path)
    try:
        df.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
