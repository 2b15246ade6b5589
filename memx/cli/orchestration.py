"""The command line's door to the Prefect flows (docs/architecture.md §Local state, §CLI).

Prefect reads its settings (PREFECT_HOME, …) once, when it is first imported, so `prefect_env()` runs
before anything imports `prefect` or `flows`; that is why `run_pipeline` imports the flow lazily. The same
holds for matplotlib (MPLCONFIGDIR, `matplotlib_env()`).
"""

from __future__ import annotations

import os
from typing import Any

from memx.domain.home import memx_home, telemetry_off
from memx.pipeline import lifeline


def prefect_env() -> None:
    """Prefect without a server keeps its state under $MEMX_HOME (set before prefect is imported)."""
    home = memx_home() / "prefect"
    os.environ.setdefault("PREFECT_HOME", str(home))
    os.makedirs(os.environ["PREFECT_HOME"], exist_ok=True)  # its SQLite DB needs the folder
    os.environ.setdefault("PREFECT_LOCAL_STORAGE_PATH", str(home / "storage"))
    telemetry_off()  # PREFECT_SERVER_ANALYTICS_ENABLED, DO_NOT_TRACK (memx.domain.home.TELEMETRY_OFF)
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    # The temporary server needs ~15 s on 2 busy cores; Prefect waits 20 s by default.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


def matplotlib_env() -> None:
    """matplotlib keeps its config and font cache under $MEMX_HOME, not ~/.config and ~/.cache (set before
    matplotlib is imported)."""
    os.environ.setdefault("MPLCONFIGDIR", str(memx_home() / "matplotlib"))


def run_pipeline(**params: Any) -> dict[str, Any]:
    """`flows.pipeline.pipeline_flow(**params)`: profile → augment → train → search, each stage a
    versioned artifact reused when its inputs are unchanged (docs/architecture.md §Artifact store)."""
    prefect_env()
    from flows.pipeline import pipeline_flow  # Prefect reads its settings at import: after prefect_env()

    # the $MEMX_HOME lock before Prefect's temporary server starts on $MEMX_HOME/prefect; SIGTERM exits cleanly
    with lifeline.guarded():
        return pipeline_flow(**params)
