"""`memx train`, `memx evaluate`, `memx models list|compare` (mounted by memx.cli.app).

    memx train --cluster C --model M [--search S] [--conf DIR] [--stage-runs FILE] [--trials N] [--seconds S]
    memx evaluate --cluster C --model M --measured FILE [--format table|json] [--search S] [--conf DIR]
                  [--predictor registered|analytic]
    memx models list
    memx models compare [VERSION ...]

Bad input (unknown name, missing file or column, no registered predictor for the fingerprint):
InputError, which the root group prints as one message naming the file / field / allowed values, exit 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import pandas as pd
import typer

from memx.cli.options import DEFAULT_SEARCH, ClusterOpt, ConfOpt, ModelOpt, SearchOpt, SeedOpt, WeightsOpt, load_specs, sub_app
from memx.domain.errors import InputError
from memx.domain.specs import Cluster, ModelArch, SearchSpace
from memx.learn.tuning import TuneBudget
from memx.pipeline import registry
from memx.pipeline.local import TrainConfig, cached, profile_path, train_and_register
from memx.planner.cost import AnalyticStageModel
from memx.planner.signatures import SIGNATURE_COLUMNS
from memx.report.evaluate import evaluate, format_table, read_config_runs, to_json

FORMATS = ("table", "json")
PREDICTORS = ("registered", "analytic")


def train_cmd(cluster: ClusterOpt,
              model: ModelOpt,
              search: SearchOpt = DEFAULT_SEARCH,
              conf: ConfOpt = None,
              stage_runs: Annotated[Optional[Path], typer.Option("--stage-runs", help="stage_runs Parquet (default: the stored profile of this fingerprint).")] = None,
              trials: Annotated[int, typer.Option(min=1, help="Optuna trials.")] = 8,
              seconds: Annotated[Optional[float], typer.Option(min=1.0, help="Optional wall-clock cap on tuning (s); stops early with a warning. Without it the result depends only on inputs and seed.")] = None,
              seed: SeedOpt = 0) -> None:
    """Train the stage predictor on stored stage_runs and register it (champion only if it is better)."""
    cl, mo, sp = load_specs(cluster, model, search, conf)
    fp = registry.fingerprint(cl, mo, sp.global_batch)
    path = stage_runs or profile_path(fp.fingerprint)
    if not path.is_file():
        raise InputError(f"{path}: no stage_runs for cluster {cl.name}, model {mo.name}, global batch "
                         f"{sp.global_batch}; run `memx profile` first or pass --stage-runs FILE")
    out = train_and_register(_read_stage_runs(path), {g.name: g for g in cl.gpu_types}, fp,
                             config=TrainConfig(seed=seed, budget=TuneBudget(trials=trials, seconds=seconds)))
    typer.echo(out.variant_errors.to_string(index=False))
    typer.echo(f"registered {registry.MODEL_NAME} version {out.version} ({out.predictor.variant}, "
               f"memory {out.predictor.memory_source}); champion {'moved' if out.promoted else 'kept'}; "
               f"held-out time_mape={out.errors['time_mape']:.4f} mem_mape={out.errors['mem_mape']:.4f}; "
               f"rows {out.augmented.rows_before} -> {out.augmented.rows_after} after interpolation")


def _read_stage_runs(path: Path) -> pd.DataFrame:
    try:
        df = pd.read_parquet(path)
    except Exception as exc:
        raise InputError(f"{path}: not a readable Parquet file ({exc.__class__.__name__})") from exc
    missing = [c for c in (*SIGNATURE_COLUMNS, "time_ms") if c not in df.columns]
    if missing:
        raise InputError(f"{path}: missing stage_runs column(s) {', '.join(missing)} "
                         "(docs/architecture.md §Measurement records)")
    return df


def _registered(cl: Cluster, mo: ModelArch, sp: SearchSpace):
    """The champion predictor registered for this cluster's GPU types, model and global batch."""
    registry.setup()
    fp = registry.fingerprint(cl, mo, sp.global_batch)
    mv = registry.champion(fp.fingerprint)
    if mv is None:
        raise InputError(f"no registered predictor for cluster {cl.name} GPU types ({fp.gpu_types}), model "
                         f"{mo.name}, global batch {sp.global_batch} (fingerprint {fp.fingerprint}); run "
                         "`memx train` first or use --predictor analytic")
    return cached(registry.load_version(mv.version), fp.fingerprint, int(mv.version))


def _allowed(option: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise InputError(f"{option} {value!r}; allowed: {', '.join(allowed)}")
    return value


def evaluate_cmd(cluster: ClusterOpt,
                 model: ModelOpt,
                 measured: Annotated[Path, typer.Option(help="config_runs Parquet or JSONL.")],
                 fmt: Annotated[str, typer.Option("--format", help="table | json")] = "table",
                 search: SearchOpt = DEFAULT_SEARCH,
                 conf: ConfOpt = None,
                 predictor: Annotated[str, typer.Option(help="registered | analytic")] = "registered",
                 weights: WeightsOpt = None) -> None:
    """Predicted vs measured for every plan in a config_runs file, with baselines."""
    _allowed("--format", fmt, FORMATS)
    _allowed("--predictor", predictor, PREDICTORS)
    cl, mo, sp = load_specs(cluster, model, search, conf)
    df = read_config_runs(measured)
    if predictor == "analytic":
        pred = AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types})
    else:
        pred = _registered(cl, mo, sp)
    result = evaluate(cl, mo, df, pred, weights or sp.weights, reserve_gib=sp.reserve_gib)
    typer.echo(to_json(result) if fmt == "json" else format_table(result))


models_app = sub_app("Registered stage-predictor versions.")


@models_app.command("list")
def models_list() -> None:
    """Every registered version with aliases, fingerprint tags and held-out metrics."""
    registry.setup()
    df = registry.list_versions()
    typer.echo("no registered versions" if df.empty else df.to_string(index=False))


@models_app.command("compare")
def models_compare(versions: Annotated[Optional[list[int]], typer.Argument(help="Versions (default: all).")] = None) -> None:
    """Versions side by side (one column per version), metrics and tags as rows."""
    registry.setup()
    df = registry.list_versions()
    if versions:
        unknown = sorted(set(versions) - set(df["version"]))
        if unknown:
            raise InputError(f"version(s) {unknown} not registered; registered: {sorted(df['version'])}")
        df = df[df["version"].isin(versions)]
    if df.empty:
        typer.echo("no registered versions")
        return
    typer.echo(df.set_index("version").T.to_string())
