"""`memx profile` and `memx ingest megatron` (mounted on the root app by `register`).

    memx profile --cluster C --model M [--search default] [--conf DIR] [--backend simulated|command|torch|records]
                 [--command "prog arg {tp} ..."] [--records PATH] [--jobs N] [--timeout S] [--retries R]
                 [--seed S] [--out DIR] [--progress/--no-progress]
    memx ingest megatron LOGDIR --model M --gpu G [--out FILE] [--conf DIR]

Bad input: one message on stderr naming the file / field / allowed values, exit code 2.
Ctrl-C: what was measured is kept under --out (exit code 130).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Optional

import typer

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.domain.errors import InputError

CONF = typer.Option(None, "--conf", help="catalog root (default: $MEMX_CONF or the shipped conf/)")


def _fail(exc: InputError) -> None:
    typer.echo(f"error: {exc}", err=True)
    raise typer.Exit(code=2)


def default_out(cluster: str, model: str) -> Path:
    home = Path(os.environ.get("MEMX_HOME", Path.home() / ".memx"))
    return home / "profiles" / f"{Path(cluster).stem}-{Path(model).stem}"


def profile_cmd(
    cluster: str = typer.Option(..., "--cluster", help="cluster name in conf/clusters or a YAML path"),
    model: str = typer.Option(..., "--model", help="model name in conf/models or a YAML path"),
    search: str = typer.Option("default", "--search", help="search space name or YAML path"),
    conf: Optional[Path] = CONF,
    backend: str = typer.Option("simulated", "--backend", help="simulated | command | torch | records"),
    command: Optional[str] = typer.Option(None, "--command", help="program and arguments, {placeholders} filled per point"),
    records: Optional[Path] = typer.Option(None, "--records", help="CSV / Parquet / JSONL file or folder (backend records)"),
    jobs: int = typer.Option(1, "--jobs", help="points measured in parallel"),
    timeout: float = typer.Option(600.0, "--timeout", help="seconds per point (backend command)"),
    retries: int = typer.Option(1, "--retries", help="retries of a point that exits non-zero (backend command)"),
    seed: int = typer.Option(0, "--seed"),
    out: Optional[Path] = typer.Option(None, "--out", help="output folder (default $MEMX_HOME/profiles/<cluster>-<model>)"),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="progress bar with ETA on stderr"),
) -> None:
    """Profile every GPU type of a cluster: sweeps → sensitivity → 3-point grid → stage_runs Parquet."""
    from memx.profiling import profile
    from memx.domain.records import format_rejects

    try:
        c, m, s = load_cluster(cluster, conf), load_model(model, conf), load_search(search, conf)
        argv = shlex.split(command) if command else None
        out_dir = out or default_out(cluster, model)
        try:
            result = profile(c, m, s, backend=backend, out_dir=out_dir, seed=seed, jobs=jobs, command=argv,
                             records=records, timeout_s=timeout, retries=retries, conf_root=conf, progress=progress)
        except KeyboardInterrupt:
            typer.echo(f"interrupted: measured points kept in {out_dir}; run again to resume", err=True)
            raise typer.Exit(code=130)
    except (InputError, ValueError) as exc:
        _fail(exc if isinstance(exc, InputError) else InputError(str(exc)))
        return
    if result.rejected:
        typer.echo(format_rejects(result.rejected), err=True)
    typer.echo(result.summary())
    typer.echo(f"stage_runs: {result.path}")
    typer.echo(f"sensitivity: {out_dir / 'sensitivity.md'}")


ingest_app = typer.Typer(help="Import measurements made elsewhere as stage_runs.", no_args_is_help=True,
                         add_completion=False)


@ingest_app.command("megatron")
def ingest_megatron_cmd(
    logdir: Path = typer.Argument(..., help="folder of Megatron-LM logs, one run per file (*.log, *.txt, *.out)"),
    model: str = typer.Option(..., "--model", help="model name or YAML (fields the logs do not say)"),
    gpu: str = typer.Option(..., "--gpu", help="GPU type the logs were measured on"),
    out: Optional[Path] = typer.Option(None, "--out", help="stage_runs Parquet (default LOGDIR/stage_runs.parquet)"),
    conf: Optional[Path] = CONF,
) -> None:
    """Megatron-LM logs → stage_runs rows (point from a `memx-point:` header or Megatron's argument dump)."""
    from memx.domain.io import atomic_write_parquet
    from memx.profiling.backends.imported import ingest_megatron
    from memx.domain.records import format_rejects

    try:
        df, rejects = ingest_megatron(logdir, model=load_model(model, conf), gpu=gpu)
    except InputError as exc:
        _fail(exc)
        return
    if rejects:
        typer.echo(format_rejects(rejects), err=True)
    path = out or logdir / "stage_runs.parquet"
    atomic_write_parquet(df, path)
    counts = df["status"].value_counts().to_dict()
    typer.echo(f"{len(df)} rows ({', '.join(f'{k} {v}' for k, v in counts.items()) or 'none'}), "
               f"{len({r.file for r in rejects})} file(s) rejected → {path}")


def register(app: typer.Typer) -> None:
    """Add `profile` and `ingest megatron` to the root `memx` app."""
    app.command("profile")(profile_cmd)
    app.add_typer(ingest_app, name="ingest")
