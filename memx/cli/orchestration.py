"""The command line's door to the Prefect flows (docs/architecture.md §Local state, §CLI).

Prefect reads its settings (PREFECT_HOME, …) once, when it is first imported, so `prefect_env()` runs
before anything imports `prefect` or `flows`; that is why `run_pipeline` imports the flow lazily. The same
holds for matplotlib (MPLCONFIGDIR, `matplotlib_env()`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from memx.domain.home import memx_home, telemetry_off
from memx.domain.io import atomic_write_bytes, db_template, seed_from_template
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
    # MemX's flows use no Prefect blocks: a new server need not register Prefect's block types (~3 CPU s on a
    # fresh $MEMX_HOME/prefect, docs/benchmarks.md §First make plan)
    os.environ.setdefault("PREFECT_API_BLOCKS_REGISTER_ON_START", "false")


def prefect_template() -> Path:
    """Where `make install` keeps an empty Prefect database already migrated by this environment's Prefect
    (`build_prefect_template`); named by Prefect's version, so another version never reads it."""
    return db_template("prefect")


def build_prefect_template() -> Path:
    """Migrate an empty Prefect database once per environment (`make install`): a first run copies it into its
    fresh $MEMX_HOME/prefect instead of running Prefect's ~100 Alembic migrations while its temporary server
    starts (~9 s of a first `make plan`, docs/benchmarks.md §First make plan). Written to a temporary name, then
    renamed."""
    path = prefect_template()
    if path.is_file():
        return path
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PREFECT_HOME": tmp, "PREFECT_LOGGING_LEVEL": "WARNING"}
        env.pop("PREFECT_API_DATABASE_CONNECTION_URL", None)
        subprocess.run([sys.executable, "-m", "prefect", "server", "database", "upgrade", "-y"], env=env, check=True,
                       stdout=subprocess.DEVNULL, timeout=600)
        atomic_write_bytes(path, (Path(tmp) / "prefect.db").read_bytes())
    return path


def _seed_prefect_db() -> None:
    """A fresh MemX Prefect home gets a copy of the migrated template (`build_prefect_template`), when there is one
    for this Prefect and the database is MemX's own (not a PREFECT_HOME or database URL the user set). Called under
    the $MEMX_HOME lock, before the server starts, so no running server's database is ever replaced."""
    home = memx_home() / "prefect"
    db = home / "prefect.db"
    if os.environ.get("PREFECT_HOME") == str(home) and "PREFECT_API_DATABASE_CONNECTION_URL" not in os.environ:
        seed_from_template(db, prefect_template())  # never over an existing database


def matplotlib_env() -> None:
    """matplotlib keeps its config and font cache under $MEMX_HOME, not ~/.config and ~/.cache (set before
    matplotlib is imported)."""
    os.environ.setdefault("MPLCONFIGDIR", str(memx_home() / "matplotlib"))


def run_pipeline(**params: Any) -> dict[str, Any]:
    """`flows.pipeline.pipeline_flow(**params)`: profile → augment → train → search, each stage a
    versioned artifact reused when its inputs are unchanged (docs/architecture.md §Artifact store)."""
    prefect_env()
    # the $MEMX_HOME lock before Prefect's temporary server starts on $MEMX_HOME/prefect; SIGTERM exits cleanly
    with lifeline.guarded():
        _seed_prefect_db()
        starting = _start_temporary_server()
        from flows.pipeline import pipeline_flow  # Prefect reads its settings at import: after prefect_env()

        import mlflow  # noqa: F401  (the pipeline's tracking: imported while the server starts)

        if starting is not None:
            starting.join()
        return pipeline_flow(**params)


def _start_temporary_server() -> threading.Thread | None:
    """Without PREFECT_API_URL the first flow call starts Prefect's temporary server (a subprocess, ~10 CPU s)
    and waits for it. Started here in a thread instead, the server boots on a second core while this process
    imports the flows and MLflow (~6 CPU s); the flow call then finds the same server (Prefect keeps one per
    process). The server module is imported here, not in the thread: both imports hold the GIL. A start that
    fails here is left to the flow call, which starts it again and reports Prefect's own error."""
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED

    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        return None
    from prefect.server.api.server import SubprocessASGIServer  # the client imports it anyway (get_client)

    def start() -> None:
        try:
            SubprocessASGIServer().start()
        except Exception:  # noqa: BLE001 — the flow call retries and raises Prefect's own message
            pass

    thread = threading.Thread(target=start, name="memx-prefect-server", daemon=True)
    thread.start()
    return thread
