"""Local state: the one place that reads `MEMX_HOME` (docs/architecture.md §Local state).

Everything MemX writes on this machine — artifacts, the MLflow database, Prefect's state, prediction
caches, user catalog overrides — lives under this folder; nothing under the user's home directory,
nothing in the working directory outside it.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_HOME = ".memx"


def memx_home() -> Path:
    """`$MEMX_HOME`, else `.memx/` in the working directory (absolute)."""
    return Path(os.environ.get("MEMX_HOME") or DEFAULT_HOME).absolute()


def home_path(*parts: str) -> Path:
    """A path under `memx_home()`; the caller creates it when it writes."""
    return memx_home().joinpath(*parts)
