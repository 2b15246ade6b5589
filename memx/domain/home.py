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


# Usage telemetry off in this process and every process it starts (they inherit the environment):
# MLflow 3.2+ (`MLFLOW_DISABLE_TELEMETRY`, and the `DO_NOT_TRACK` convention it also reads; otherwise it
# writes ~/.config/mlflow/telemetry.json and sends usage data — mlflow.org/docs/latest/community/usage-tracking),
# Prefect's SDK (`DO_NOT_TRACK`) and its server (`PREFECT_SERVER_ANALYTICS_ENABLED`).
TELEMETRY_OFF = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}


def telemetry_off() -> None:
    """Set TELEMETRY_OFF in the environment (a value the user set explicitly is kept)."""
    for key, value in TELEMETRY_OFF.items():
        os.environ.setdefault(key, value)
