"""`memx profile` and `memx ingest megatron` (mounted by memx.cli.app).

    memx profile --cluster C --model M [--search default] [--conf DIR] [--backend simulated|command|torch|records]
                 [--command "prog arg {tp} ..."] [--records PATH] [--jobs N] [--timeout S] [--retries R]
                 [--seed S] [--out DIR] [--progress/--no-progress]
    memx ingest megatron LOGDIR --model M --gpu G [--out FILE] [--conf DIR]

Bad input: InputError, one message on stderr naming the file / field / allowed values, exit code 2.
Ctrl-C: what was measured is kept under --out (the root group exits with code 130).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from memx.cli.options import (DEFAULT_SEARCH, ClusterOpt, CommandOpt, ConfOpt, JobsOpt, ModelOpt, RecordsOpt,
    SearchOpt, SeedOpt, load_specs, split_command, sub_app)
from memx.domain.catalog import known_names, load_gpu, load_model
from memx.domain.home import home_path
from memx.domain.io import atomic_write_parquet
from memx.profiling import profile
from memx.profiling.backends.imported import ingest_megatron
from memx.domain.records import format_rejects


def default_out(cluster: str, model: str) -> Path:
    """`$MEMX_HOME/profiles/<cluster>-<model>` (docs/architecture.md §Local state)."""
    return home_path("profiles", f"{Path(cluster).stem}-{Path(model).stem}")


def profile_cmd(
    cluster: ClusterOpt,
    model: ModelOpt,
    search: SearchOpt = DEFAULT_SEARCH,
    conf: ConfOpt = None,
    backend: Annotated[str, typer.Option("--backend", help="simulated | command | torch | records")] = "simulated",
    command: CommandOpt = None,
    records: RecordsOpt = None,
    jobs: JobsOpt = 1,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds per point (backend command)")] = 600.0,
    retries: Annotated[int, typer.Option("--retries", help="retries of a point that exits non-zero (backend command)")] = 1,
    seed: SeedOpt = 0,
    out: Annotated[Optional[Path], typer.Option("--out", help="output folder (default $MEMX_HOME/profiles/<cluster>-<model>)")] = None,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="progress bar with ETA on stderr")] = True,
) -> None:
    """Profile every GPU type of a cluster: sweeps → sensitivity → 3-point grid → stage_runs Parquet."""
    c, m, s = load_specs(cluster, model, search, conf)
    argv = split_command(command)
    out_dir = out or default_out(cluster, model)
    try:
        result = profile(c, m, s, backend=backend, out_dir=out_dir, seed=seed, jobs=jobs, command=argv,
                         records=records, timeout_s=timeout, retries=retries, conf_root=conf, progress=progress)
    except KeyboardInterrupt:  # the profiler has saved what it measured; the root group exits 130
        typer.echo(f"interrupted: measured points kept in {out_dir}; run again to resume", err=True)
        raise
    if result.rejected:
        typer.echo(format_rejects(result.rejected), err=True)
    typer.echo(result.summary())
    typer.echo(f"stage_runs: {result.path}")
    typer.echo(f"sensitivity: {out_dir / 'sensitivity.md'}")


def _known_memory_mib(gpu: str, conf: Path | None) -> float | None:
    """The catalog's memory of `gpu` (peaks above it are implausible rows), None for a GPU not in the catalog."""
    return load_gpu(gpu, conf).memory_mib if gpu in known_names("gpus", conf) else None


ingest_app = sub_app("Import measurements made elsewhere as stage_runs.")


@ingest_app.command("megatron")
def ingest_megatron_cmd(
    logdir: Annotated[Path, typer.Argument(help="folder of Megatron-LM logs, one run per file (*.log, *.txt, *.out)")],
    model: Annotated[str, typer.Option("--model", help="model name or YAML (fields the logs do not say)")],
    gpu: Annotated[str, typer.Option("--gpu", help="GPU type the logs were measured on")],
    out: Annotated[Optional[Path], typer.Option("--out", help="stage_runs Parquet (default LOGDIR/stage_runs.parquet)")] = None,
    conf: ConfOpt = None,
) -> None:
    """Megatron-LM logs → stage_runs rows (point from a `memx-point:` header or Megatron's argument dump)."""
    df, rejects = ingest_megatron(logdir, model=load_model(model, conf), gpu=gpu, gpu_memory_mib=_known_memory_mib(gpu, conf))
    if rejects:
        typer.echo(format_rejects(rejects), err=True)
    path = out or logdir / "stage_runs.parquet"
    atomic_write_parquet(df, path)
    counts = df["status"].value_counts().to_dict()
    typer.echo(f"{len(df)} rows ({', '.join(f'{k} {v}' for k, v in counts.items()) or 'none'}), "
               f"{len({r.file for r in rejects})} file(s) rejected → {path}")
