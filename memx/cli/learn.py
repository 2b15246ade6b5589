"""`memx train`, `memx evaluate`, `memx models list|compare` (mounted by memx.cli.app).

    memx train --cluster C --model M [--search S] [--conf DIR] [--stage-runs FILE] [--measured FILE]
               [--trials N] [--seconds S] [--seed S] [--store URI]
    memx evaluate --cluster C --model M --measured FILE [--format table|json] [--search S] [--conf DIR]
                  [--predictor registered|analytic]
    memx models list
    memx models compare [VERSION ...]

Bad input (unknown name, missing file or column, no registered predictor for the fingerprint):
InputError, which the root group prints as one message naming the file / field / allowed values, exit 2.
"""

from __future__ import annotations

import math

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from memx.cli.options import (DEFAULT_SEARCH, ClusterOpt, ConfOpt, ModelOpt, SearchOpt, SeedOpt, StoreOpt, WeightsOpt,
    load_specs, sub_app)
from memx.domain.errors import InputError

if TYPE_CHECKING:
    import pandas as pd

# pandas, MLflow, XGBoost and the pipeline are imported inside the commands: `memx --help` stays light.

FORMATS = ("table", "json")
PREDICTORS = ("registered", "analytic")


def train_cmd(cluster: ClusterOpt,
              model: ModelOpt,
              search: SearchOpt = DEFAULT_SEARCH,
              conf: ConfOpt = None,
              stage_runs: Annotated[Optional[Path], typer.Option("--stage-runs", help="stage_runs Parquet (default: the profiles `memx profile` stored for this cluster, model and search space).")] = None,
              measured: Annotated[Optional[Path], typer.Option("--measured", help="config_runs (Parquet, JSONL or CSV) of measured plans: fit a plan calibration of the trained version on them (kept only where its leave-one-out error beats the uncalibrated error); `memx plan --predictor registered` applies it.")] = None,
              residual: Annotated[bool, typer.Option("--residual/--no-residual", help="With --measured: also learn a plan residual (boosted trees on the calibrated time's error; from 40 timed plans on, kept only where its held-out error beats the calibrated one by 10 %). --no-residual: the parametric calibration alone.")] = True,
              trials: Annotated[int, typer.Option(min=1, help="Optuna trials.")] = 8,
              seconds: Annotated[Optional[float], typer.Option(min=1.0, help="Optional wall-clock cap on tuning (s); stops early with a warning. Without it the result depends only on inputs and seed.")] = None,
              seed: SeedOpt = 0,
              store: StoreOpt = None) -> None:
    """Train the stage predictor on the stored profiles (or --stage-runs) and register it (champion only if better)."""
    from memx.pipeline import registry
    from memx.pipeline.local import train_config, train_step
    from memx.pipeline.training import train_and_register
    from memx.report.evaluate import read_config_runs

    cl, mo, sp = load_specs(cluster, model, search, conf)
    runs = read_config_runs(measured) if measured is not None else None  # bad input exits 2 before training
    if stage_runs is not None:
        if not stage_runs.is_file():
            raise InputError(f"--stage-runs {stage_runs}: no such file")
        fp = registry.fingerprint(cl, mo, sp.global_batch)
        out = train_and_register(_read_stage_runs(stage_runs), {g.name: g for g in cl.gpu_types}, fp,
                                 config=train_config(seed, trials, seconds))
        typer.echo(out.variant_errors.to_string(index=False))
        _trained_line(int(out.version), out.promoted, out.predictor.variant, out.errors,
                      f"memory {out.predictor.memory_source}; "
                      f"rows {out.augmented.rows_before} -> {out.augmented.rows_after} after interpolation")
        _calibrate(int(out.version), cl, mo, runs, residual, fp.fingerprint)
        return
    res = train_step(cl, mo, sp, store=store, seed=seed, trials=trials, seconds=seconds,
                     log=lambda line: typer.echo(line, err=True))
    doc = res.train.manifest
    aug = res.augment.manifest
    _trained_line(res.model_version, res.promoted, doc.get("variant", ""), doc.get("held_out", {}),
                  f"rows {aug.get('rows_before')} -> {aug.get('rows_after')} after interpolation"
                  + ("; reused the stored training" if res.train.reused else ""))
    typer.echo(f"champion of fingerprint {res.fingerprint}: version {res.champion.get('model_version')}")
    _calibrate(res.model_version, cl, mo, runs, residual, res.fingerprint)


def _calibrate(version: int, cl, mo, runs: pd.DataFrame | None, residual: bool, fp: str) -> None:
    if runs is None:
        return
    from memx.pipeline.local import calibrate_registered, promote_if_calibrated_better

    cal = calibrate_registered(version, cl, mo, runs, residual=residual)
    typer.echo(f"plan calibration of version {version}: {cal.summary()}")
    decided = promote_if_calibrated_better(version, cal, fp, cl, mo, runs, residual=residual)
    if decided:
        typer.echo(decided)


def _trained_line(version: int, promoted: bool, variant: str, errors: dict, extra: str) -> None:
    from memx.pipeline import registry

    held = " ".join(f"{k}={float(v):.4f}" if math.isfinite(float(v)) else f"{k}=n/a (no labels)"
                    for k, v in errors.items() if k in ("time_mape", "mem_mape"))
    typer.echo(f"registered {registry.MODEL_NAME} version {version} ({variant}); "
               f"{'promoted to champion' if promoted else 'not promoted (the champion is better)'}; "
               f"held-out {held}; {extra}")


def _read_stage_runs(path: Path) -> pd.DataFrame:
    import pandas as pd

    from memx.domain.records import OPTION_DEFAULTS, with_record_defaults
    from memx.planner.signatures import SIGNATURE_COLUMNS

    try:
        df = pd.read_parquet(path)
    except Exception as exc:
        raise InputError(f"{path}: not a readable Parquet file ({exc.__class__.__name__})") from exc
    missing = [c for c in (*SIGNATURE_COLUMNS, "time_ms") if c not in df.columns and c not in OPTION_DEFAULTS]
    if missing:
        raise InputError(f"{path}: missing stage_runs column(s) {', '.join(missing)} "
                         "(docs/architecture.md §Measurement records)")
    return with_record_defaults(df)  # a table from before an option column (tied_embeddings: issue #23) loads


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
    from memx.report.evaluate import evaluate, format_table, read_config_runs, to_json

    _allowed("--format", fmt, FORMATS)
    _allowed("--predictor", predictor, PREDICTORS)
    cl, mo, sp = load_specs(cluster, model, search, conf)
    df = read_config_runs(measured)
    if predictor == "analytic":
        from memx.planner.cost import AnalyticStageModel

        pred = AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types})
    else:
        from memx.pipeline.local import registered_predictor

        pred = registered_predictor(cl, mo, sp)
    result = evaluate(cl, mo, df, pred, weights or sp.weights, reserve_gib=sp.reserve_gib,
                      pipeline_assembly=sp.pipeline_assembly)
    typer.echo(to_json(result) if fmt == "json" else format_table(result))


models_app = sub_app("Registered stage-predictor versions.")


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
