"""`memx train`, `memx evaluate`, `memx models list|compare` (mounted by memx.cli.app via `register(app)`).

    memx train --cluster C --model M [--search S] [--conf DIR] [--stage-runs FILE] [--trials N] [--seconds S]
    memx evaluate --cluster C --model M --measured FILE [--format table|json] [--search S] [--conf DIR]
                  [--predictor registered|analytic]
    memx models list
    memx models compare [VERSION ...]

Bad input (unknown name, missing file or column, no registered predictor for the fingerprint): one
message on stderr naming the file / field / allowed values, exit code 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import pandas as pd
import typer

from memx.domain.errors import InputError, MemxError

ConfOpt = Annotated[Optional[Path], typer.Option("--conf", help="Catalog root (default: the packaged conf/).")]
FORMATS = ("table", "json")
PREDICTORS = ("registered", "analytic")


def _fail(exc: MemxError) -> None:
    typer.echo(f"error: {exc}", err=True)
    raise typer.Exit(exc.exit_code)


def _load(cluster: str, model: str, search: str, conf: Path | None):
    from memx.domain.catalog import load_cluster, load_model, load_search

    return load_cluster(cluster, conf), load_model(model, conf), load_search(search, conf)


def train_cmd(cluster: Annotated[str, typer.Option(help="Cluster name or YAML path.")],
              model: Annotated[str, typer.Option(help="Model name or YAML path.")],
              search: Annotated[str, typer.Option(help="Search space name or YAML path.")] = "default",
              conf: ConfOpt = None,
              stage_runs: Annotated[Optional[Path], typer.Option("--stage-runs", help="stage_runs Parquet (default: the stored profile of this fingerprint).")] = None,
              trials: Annotated[int, typer.Option(min=1, help="Optuna trials.")] = 8,
              seconds: Annotated[float, typer.Option(min=1.0, help="Optuna time budget (s).")] = 20.0,
              seed: Annotated[int, typer.Option(help="Split, tuning and boosting seed.")] = 0) -> None:
    """Train the stage predictor on stored stage_runs and register it (champion only if it is better)."""
    from memx.pipeline import registry
    from memx.learn.tuning import TuneBudget
    from memx.pipeline.local import TrainConfig, profile_path, train_and_register

    try:
        cl, mo, sp = _load(cluster, model, search, conf)
        fp = registry.fingerprint(cl, mo, sp.global_batch)
        path = stage_runs or profile_path(fp.fingerprint)
        if not path.is_file():
            raise InputError(f"{path}: no stage_runs for cluster {cl.name}, model {mo.name}, global batch "
                             f"{sp.global_batch}; run `memx profile` first or pass --stage-runs FILE")
        df = _read_stage_runs(path)
        out = train_and_register(df, {g.name: g for g in cl.gpu_types}, fp,
                                 config=TrainConfig(seed=seed, budget=TuneBudget(trials=trials, seconds=seconds)))
    except MemxError as exc:
        _fail(exc)
        return
    typer.echo(out.variant_errors.to_string(index=False))
    typer.echo(f"registered {registry.MODEL_NAME} version {out.version} ({out.predictor.variant}, "
               f"memory {out.predictor.memory_source}); champion {'moved' if out.promoted else 'kept'}; "
               f"held-out time_mape={out.errors['time_mape']:.4f} mem_mape={out.errors['mem_mape']:.4f}; "
               f"rows {out.augmented.rows_before} -> {out.augmented.rows_after} after interpolation")


def _read_stage_runs(path: Path) -> pd.DataFrame:
    from memx.planner.signatures import SIGNATURE_COLUMNS

    try:
        df = pd.read_parquet(path)
    except Exception as exc:
        raise InputError(f"{path}: not a readable Parquet file ({exc.__class__.__name__})") from exc
    missing = [c for c in (*SIGNATURE_COLUMNS, "time_ms") if c not in df.columns]
    if missing:
        raise InputError(f"{path}: missing stage_runs column(s) {', '.join(missing)} (DESIGN.md §3)")
    return df


def _registered(cl, mo, sp):
    from memx.pipeline import registry
    from memx.pipeline.local import cached

    registry.setup()
    fp = registry.fingerprint(cl, mo, sp.global_batch)
    mv = registry.champion(fp.fingerprint)
    if mv is None:
        raise InputError(f"no registered predictor for cluster {cl.name} GPU types ({fp.gpu_types}), model "
                         f"{mo.name}, global batch {sp.global_batch} (fingerprint {fp.fingerprint}); run "
                         "`memx train` first or use --predictor analytic")
    return cached(registry.load_version(mv.version), fp.fingerprint, int(mv.version))


def evaluate_cmd(cluster: Annotated[str, typer.Option(help="Cluster name or YAML path.")],
                 model: Annotated[str, typer.Option(help="Model name or YAML path.")],
                 measured: Annotated[Path, typer.Option(help="config_runs Parquet or JSONL.")],
                 fmt: Annotated[str, typer.Option("--format", help="table | json")] = "table",
                 search: Annotated[str, typer.Option(help="Search space name or YAML path.")] = "default",
                 conf: ConfOpt = None,
                 predictor: Annotated[str, typer.Option(help="registered | analytic")] = "registered",
                 weights: Annotated[Optional[str], typer.Option(help="auto | default | safety | throughput | 'wT,wM,wV'")] = None) -> None:
    """Predicted vs measured for every plan in a config_runs file, with baselines."""
    from memx.report.evaluate import evaluate, format_table, read_config_runs, to_json

    try:
        if fmt not in FORMATS:
            raise InputError(f"--format {fmt!r}; allowed: {', '.join(FORMATS)}")
        if predictor not in PREDICTORS:
            raise InputError(f"--predictor {predictor!r}; allowed: {', '.join(PREDICTORS)}")
        cl, mo, sp = _load(cluster, model, search, conf)
        df = read_config_runs(measured)
        if predictor == "analytic":
            from memx.planner.cost import AnalyticStageModel

            pred = AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types})
        else:
            pred = _registered(cl, mo, sp)
        result = evaluate(cl, mo, df, pred, weights or sp.weights, reserve_gib=sp.reserve_gib)
    except MemxError as exc:
        _fail(exc)
        return
    typer.echo(to_json(result) if fmt == "json" else format_table(result))


models_app = typer.Typer(help="Registered stage-predictor versions.", no_args_is_help=True, add_completion=False)


@models_app.command("list")
def models_list() -> None:
    """Every registered version with aliases, fingerprint tags and held-out metrics."""
    from memx.pipeline import registry

    registry.setup()
    df = registry.list_versions()
    typer.echo("no registered versions" if df.empty else df.to_string(index=False))


@models_app.command("compare")
def models_compare(versions: Annotated[Optional[list[int]], typer.Argument(help="Versions (default: all).")] = None) -> None:
    """Versions side by side (one column per version), metrics and tags as rows."""
    from memx.pipeline import registry

    try:
        registry.setup()
        df = registry.list_versions()
        if versions:
            unknown = sorted(set(versions) - set(df["version"]))
            if unknown:
                raise InputError(f"version(s) {unknown} not registered; registered: {sorted(df['version'])}")
            df = df[df["version"].isin(versions)]
    except MemxError as exc:
        _fail(exc)
        return
    if df.empty:
        typer.echo("no registered versions")
        return
    typer.echo(df.set_index("version").T.to_string())


def register(app: typer.Typer) -> None:
    """Add `train`, `evaluate` and the `models` group to the memx app."""
    app.command("train")(train_cmd)
    app.command("evaluate")(evaluate_cmd)
    app.add_typer(models_app, name="models")
