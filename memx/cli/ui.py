"""`memx ui`: MLflow's web UI on this machine's registry and runs (docs/store.md §MLflow).

    memx ui [--port 5000] [--print-only]

Runs `mlflow ui --backend-store-uri <the tracking URI> --host 127.0.0.1 --port P` in the foreground (the
tracking URI is $MLFLOW_TRACKING_URI, else sqlite:///$MEMX_HOME/mlflow.db; Ctrl-C stops it, exit 130).
A tracking server (http://…) already has a UI: its address is printed instead.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from typing import Annotated

import typer

from memx.domain.errors import InputError

LOOPBACK = "127.0.0.1"  # the UI has no login: never listen beyond this machine


def ui_argv(tracking_uri: str, port: int) -> list[str]:
    """The `mlflow ui` command line for a SQLite tracking URI (loopback only; artifacts beside the database,
    where memx.pipeline.registry puts them, so nothing is created in the working directory)."""
    from memx.pipeline import registry  # pandas, MLflow's URI rules: only when this command runs

    return [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", tracking_uri,
            "--default-artifact-root", registry.artifact_location(tracking_uri), "--host", LOOPBACK, "--port", str(port)]


def ui_cmd(port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Port on 127.0.0.1.")] = 5000,
           print_only: Annotated[bool, typer.Option("--print-only", help="Print the command, do not start it.")] = False) -> None:
    """Browse the registered predictors and the runs in MLflow's UI (on 127.0.0.1)."""
    from memx.pipeline import registry

    uri = registry.tracking_uri()
    if uri.startswith(("http://", "https://")):
        typer.echo(f"the tracking server {uri} serves the UI itself: open it in a browser")
        return
    if not uri.startswith("sqlite:///"):
        raise InputError(f"MLFLOW_TRACKING_URI {uri!r}: `memx ui` serves sqlite:/// databases; start `mlflow ui` "
                         "yourself for other stores")
    argv = ui_argv(uri, port)
    typer.echo(shlex.join(["mlflow", *argv[3:]]))
    if print_only:
        return
    typer.echo(f"open http://{LOOPBACK}:{port} (Ctrl-C stops it)", err=True)
    subprocess.run(argv, check=False)
