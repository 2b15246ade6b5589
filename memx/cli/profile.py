"""`memx profile` and `memx ingest ...` (mounted by memx.cli.app).

    memx profile --cluster C --model M [--search default] [--conf DIR] [--backend simulated|command|torch|records]
                 [--command "prog arg {tp} ..."] [--records PATH] [--jobs N] [--timeout S] [--retries R]
                 [--seed S] [--store URI] [--out DIR] [--progress/--no-progress] [--moe-layers points|all|none]
    memx ingest megatron LOGDIR --model M --gpu G [--out FILE] [--conf DIR]
    memx ingest sailor|metis|aceso|galvatron PATH --model M [--gpu G] [--out FILE] [--conf DIR]

`memx profile` stores one profile version per GPU type in the artifact store (default
$MEMX_HOME/artifacts) through memx.pipeline.local.profile_step, where `memx train` finds them;
`--out DIR` also exports the combined stage_runs and the sensitivity table there.
`memx ingest <format>` imports other planners' per-layer profiles (memx.profiling.importers,
docs/importers.md) to $MEMX_HOME/imports/<format>-<model>.parquet unless --out says where.
Bad input: InputError, one message on stderr naming the file / field / allowed values, exit code 2.
Ctrl-C: GPU types already profiled stay stored (the root group exits with code 130).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
import typer.core

from memx.cli.options import (DEFAULT_SEARCH, ClusterOpt, CommandOpt, ConfOpt, JobsOpt, ModelOpt, RecordsOpt,
    SearchOpt, SeedOpt, StoreOpt, check_out_dir, load_specs, split_command)
from memx.domain.home import home_path
from memx.domain.errors import InputError
from memx.domain.io import atomic_write_parquet, atomic_write_text

if TYPE_CHECKING:
    from memx.pipeline.store import ArtifactStore

# The profiler, the importers, the store and pandas are imported inside the commands (the profiling
# package loads pandas): `memx --help` and `memx plan` stay light.


def profile_options(backend: str, command: str | None, records: Path | None, *, jobs: int = 1,
                    timeout_s: float | None = None, retries: int | None = None,
                    progress: bool | None = None, moe_layers: str = "points") -> dict:
    """What the profiling backend needs beyond the job (`profile_step(options=...)`); InputError when a
    backend's input is missing. `memx profile` and `memx plan --backend ...` share it. `moe_layers` (what a
    mixture-of-experts model's profile measures, memx.profiling.experts.MOE_LAYERS) is an option only when not the
    default "points", so the versions of profiles stored before the flag existed are unchanged."""
    from memx.profiling.backends import BACKENDS
    from memx.profiling.experts import MOE_LAYERS

    if backend not in BACKENDS:
        raise InputError(f"--backend {backend!r}; allowed: {', '.join(BACKENDS)}")
    if moe_layers not in MOE_LAYERS:
        raise InputError(f"--moe-layers {moe_layers!r}; allowed: {', '.join(MOE_LAYERS)}")
    if backend == "command" and not command:
        raise InputError("--backend command needs --command 'PROGRAM ARGS {tp} {layers} ...'")
    if backend == "records" and records is None:
        raise InputError("--backend records needs --records PATH (CSV, Parquet or JSONL)")
    if records is not None and not Path(records).exists():  # before any service starts (Prefect: ~40 s)
        raise InputError(f"--records {records}: no such file or folder")
    options: dict = {}
    if command:
        options.update(command=split_command(command), jobs=jobs)
    if records is not None:
        options["records"] = str(Path(records).resolve())
    if backend == "command":
        options.update({k: v for k, v in (("timeout_s", timeout_s), ("retries", retries)) if v is not None})
    if progress is not None:
        options["progress"] = progress
    if moe_layers != "points":
        options["moe_layers"] = moe_layers
    return options


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
    store: StoreOpt = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Also export the combined stage_runs.parquet and sensitivity.md here.")] = None,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="progress bar with ETA on stderr")] = True,
    moe_layers: Annotated[str, typer.Option(
        "--moe-layers", help="a mixture-of-experts model: points (the dense equivalent's design + MoE points at every "
                             "ep and tp; the default, docs/results.md §15) | all (every point a MoE stage) | none "
                             "(the dense equivalent only)")] = "points",
) -> None:
    """Profile every GPU type of a cluster (sweeps → sensitivity → 3-point grid) and store one profile
    version per GPU type in the artifact store, where `memx train` finds it."""
    from memx.domain.records import format_rejects
    from memx.pipeline.local import profile_step
    from memx.pipeline.store import store_from_uri
    from memx.profiling.backends.imported import read_records

    c, m, s = load_specs(cluster, model, search, conf)
    options = profile_options(backend, command, records, jobs=jobs, timeout_s=timeout, retries=retries, progress=progress,
                              moe_layers=moe_layers)
    if not m.is_moe:  # what a dense model's profile measures does not depend on it: the same stored version
        options.pop("moe_layers", None)
    if out is not None:
        check_out_dir(out, "--out")
    if backend == "records":
        _, rejects = read_records(Path(records), gpu_memory_mib={g.name: g.memory_mib for g in c.gpu_types})
        if rejects:
            typer.echo(format_rejects(rejects), err=True)
    st = store_from_uri(store)
    try:
        versions = profile_step(c, m, s, backend=backend, store=st, seed=seed, conf_root=conf, options=options,
                                log=lambda line: typer.echo(line, err=True))
    except KeyboardInterrupt:  # the root group exits 130
        typer.echo("interrupted: GPU types already profiled stay stored; run again to measure the rest", err=True)
        raise
    for gpu, version in versions.items():
        doc = st.manifest("profile", version)
        typer.echo(f"{gpu}: profile {version} rows={doc.get('rows')} runs={doc.get('runs')} "
                   f"full_grid={doc.get('full_grid')} failed={doc.get('failed')}")
    typer.echo(f"stored in {st.root_uri}; next: memx train --cluster {cluster} --model {model}"
               + (f" --search {search}" if search != DEFAULT_SEARCH else "") + (f" --conf {conf}" if conf else "")
               + (f" --store {store}" if store else ""))
    if out is not None:
        _export(st, versions, out)


def _export(st: ArtifactStore, versions: dict[str, str], out: Path) -> None:
    """`--out DIR`: the stored profiles' stage_runs in one Parquet file, and their sensitivity table."""
    import pandas as pd

    from memx.profiling.sensitivity import sensitivity_markdown

    frames = []
    for v in versions.values():  # a profile version is one GPU type's (records imports hold every type's rows)
        df, gpu = st.get_table("profile", v, "stage_runs"), st.manifest("profile", v)["gpu"]
        frames.append(df[df["gpu"] == gpu])
    runs = pd.concat(frames, ignore_index=True)
    sens = pd.concat([st.get_table("profile", v, "sensitivity") for v in versions.values()], ignore_index=True)
    atomic_write_parquet(runs, out / "stage_runs.parquet")
    atomic_write_text(out / "sensitivity.md", sensitivity_markdown(sens))
    typer.echo(f"exported {len(runs)} stage_runs to {out / 'stage_runs.parquet'} and {out / 'sensitivity.md'}")
def _known_memory_mib(gpu: str, conf: Path | None) -> float | None:
    """The catalog's memory of `gpu` (peaks above it are implausible rows), None for a GPU not in the catalog."""
    from memx.domain.catalog import known_names, load_gpu

    return load_gpu(gpu, conf).memory_mib if gpu in known_names("gpus", conf) else None


class IngestGroup(typer.core.TyperGroup):
    """`memx ingest`: one command per importer format (memx.profiling.importers.FORMATS), added the first
    time the group lists or looks up its commands, so that `memx --help` does not load the importers."""

    def _add_formats(self) -> None:
        if getattr(self, "_formats_added", False):
            return
        self._formats_added = True
        from memx.profiling.importers import FORMATS

        for fmt, spec in FORMATS.items():
            self.add_command(_ingest_command(fmt, spec.about), fmt)

    def list_commands(self, ctx):  # noqa: D401 - click API
        self._add_formats()
        return super().list_commands(ctx)

    def get_command(self, ctx, cmd_name):  # noqa: D401 - click API
        self._add_formats()
        return super().get_command(ctx, cmd_name)


ingest_app = typer.Typer(cls=IngestGroup, add_completion=False, no_args_is_help=True,
                         help="Import measurements made elsewhere as stage_runs.")


@ingest_app.command("megatron")
def ingest_megatron_cmd(
    logdir: Annotated[Path, typer.Argument(help="folder of Megatron-LM logs, one run per file (*.log, *.txt, *.out)")],
    model: Annotated[str, typer.Option("--model", help="model name or YAML (fields the logs do not say)")],
    gpu: Annotated[str, typer.Option("--gpu", help="GPU type the logs were measured on")],
    out: Annotated[Optional[Path], typer.Option("--out", help="stage_runs Parquet (default LOGDIR/stage_runs.parquet)")] = None,
    conf: ConfOpt = None,
) -> None:
    """Megatron-LM logs → stage_runs rows (point from a `memx-point:` header or Megatron's argument dump)."""
    from memx.domain.catalog import load_model
    from memx.domain.records import format_rejects
    from memx.profiling.backends.imported import ingest_megatron

    df, rejects = ingest_megatron(logdir, model=load_model(model, conf), gpu=gpu, gpu_memory_mib=_known_memory_mib(gpu, conf))
    if rejects:
        typer.echo(format_rejects(rejects), err=True)
    path = out or logdir / "stage_runs.parquet"
    atomic_write_parquet(df, path)
    counts = df["status"].value_counts().to_dict()
    typer.echo(f"{len(df)} rows ({', '.join(f'{k} {v}' for k, v in counts.items()) or 'none'}), "
               f"{len({r.file for r in rejects})} file(s) rejected → {path}")


def default_import_path(fmt: str, model: str) -> Path:
    """$MEMX_HOME/imports/<fmt>-<model>.parquet; `model` a catalog name ("gpt-neo-2.7b": its dot stays) or a YAML."""
    name = Path(model).name
    stem = Path(name).stem if Path(name).suffix.lower() in (".yaml", ".yml") else name
    return home_path("imports", f"{fmt}-{stem}.parquet")


def ingest_profiles(fmt: str, path: Path, model: str, gpu: str | None, out: Path | None, conf: Path | None) -> Path:
    """Another planner's profile files → one stage_runs Parquet (atomic); prints the summary and the path.
    Default output $MEMX_HOME/imports/<fmt>-<model>.parquet (source folders may be read-only)."""
    from memx.domain.catalog import load_model
    from memx.domain.records import require_rows
    from memx.profiling.importers import import_profiles

    result = import_profiles(fmt, path, model=load_model(model, conf), gpu=gpu)
    require_rows(result.frame, result.rejects, what=f"{fmt} import of {path}")  # NothingUsable, exit 5
    dest = out or default_import_path(fmt, model)
    atomic_write_parquet(result.frame, dest)
    typer.echo(result.summary())
    typer.echo(f"→ {dest}")
    return dest


ImportPathArg = Annotated[Path, typer.Argument(help="a profile file, or a folder searched recursively")]
ImportModelOpt = Annotated[str, typer.Option("--model", help="model name or YAML the files profiled (layer count checked)")]
ImportGpuOpt = Annotated[Optional[str], typer.Option(
    "--gpu", help="MemX GPU name; overrides the GPU the files name (required when they name none)")]
ImportOutOpt = Annotated[Optional[Path], typer.Option(
    "--out", help="stage_runs Parquet (default $MEMX_HOME/imports/FORMAT-MODEL.parquet)")]


def _ingest_command(fmt: str, about: str):
    """The click command of `memx ingest <fmt>` (IngestGroup adds one per importer format)."""

    def cmd(path: ImportPathArg, model: ImportModelOpt, gpu: ImportGpuOpt = None, out: ImportOutOpt = None,
            conf: ConfOpt = None) -> None:
        ingest_profiles(fmt, path, model, gpu, out, conf)

    from rich.markup import escape  # typer renders help as Rich markup: "[mbs][tp]" would vanish

    cmd.__name__ = f"ingest_{fmt}_cmd"
    one = typer.Typer(add_completion=False)
    one.command(fmt, help=f"{escape(about)} → stage_runs rows (docs/importers.md).")(cmd)
    return typer.main.get_command(one)
