"""Local end to end: profile → augment → train (+ Optuna) → register, reusing what is stored.

Everything is keyed by the fingerprint of GPU types, model structure and global batch
(memx.pipeline.registry.fingerprint):
- profiles:   $MEMX_HOME/profiles/<fingerprint>/stage_runs.parquet (re-profiled only when absent);
- predictor:  the registry's ``champion-<fingerprint[:12]>`` version (retrained only when absent);
- cache:      $MEMX_HOME/models/<fingerprint>/v<version>/predictions.parquet.
A change of GPU types, model structure or global batch changes the fingerprint, so none of the three
is found and everything reruns; adding nodes of known GPU types keeps it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from memx.pipeline import registry
from memx.learn.augment import AugmentResult, augment
from memx.learn.cache import CachedPredictor
from memx.domain.io import atomic_write_parquet
from memx.learn.model import (
    VARIANTS,
    LearnedStagePredictor,
    XgbParams,
    fit_predictor,
    held_out_score,
    stage_errors,
    training_rows,
)
from memx.learn.tuning import TuneBudget, tune
from memx.planner.cost import AnalyticStageModel
from memx.domain.specs import Cluster, GpuType, ModelArch, SearchSpace

TREE_VARIANTS = ("xgb", "hybrid", "hybrid-calibrated")  # registered models carry a booster


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    valid_fraction: float = 0.2  # our choice: one in five measured rows held out
    seed: int = 0
    budget: TuneBudget = field(default_factory=TuneBudget)
    r2_threshold: float = 0.95  # paper §3.2
    max_new_per_gap: int = 6


@dataclass(frozen=True, kw_only=True)
class TrainOutcome:
    predictor: LearnedStagePredictor
    version: int
    promoted: bool
    run_id: str
    errors: dict[str, float]  # held-out errors of the registered predictor
    variant_errors: pd.DataFrame  # held-out errors of every variant (and the analytic model)
    augmented: AugmentResult


def profile_path(fp: str) -> Path:
    return registry.memx_home() / "profiles" / fp / "stage_runs.parquet"


def split_held_out(stage_runs: pd.DataFrame, fraction: float, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Random held-out rows among the usable measured rows; everything else (failed rows too) trains."""
    ok = training_rows(stage_runs.reset_index(drop=True).assign(_row=np.arange(len(stage_runs))))
    rng = np.random.default_rng(seed)
    n_valid = int(math.ceil(fraction * len(ok))) if len(ok) >= 10 else 0
    held = np.sort(rng.choice(ok["_row"].to_numpy(), size=n_valid, replace=False)) if n_valid else np.array([], int)
    mask = np.zeros(len(stage_runs), dtype=bool)
    mask[held] = True
    df = stage_runs.reset_index(drop=True)
    return df[~mask].reset_index(drop=True), df[mask].reset_index(drop=True)


def compare_variants(train: pd.DataFrame, valid: pd.DataFrame, gpus: Mapping[str, GpuType], seed: int):
    """Fit every variant with default parameters; held-out errors per variant, the analytic model too."""
    rows, fitted = [], {}
    rows.append({"variant": "analytic", **stage_errors(AnalyticStageModel(gpus=gpus), valid)})
    for v in VARIANTS:
        fitted[v] = fit_predictor(train, gpus, variant=v, seed=seed)
        rows.append({"variant": v, **stage_errors(fitted[v], valid)})
    table = pd.DataFrame(rows)
    table["score"] = [held_out_score(r) for r in table.to_dict("records")]
    return table, fitted


def _log_run_inputs(fp: registry.Fingerprint, aug: AugmentResult, table: pd.DataFrame, data_version: str) -> None:
    import mlflow

    mlflow.set_tags({**fp.tags(), "data_version": data_version})
    mlflow.log_params({"rows_measured": aug.rows_before, "rows_augmented": aug.rows_after,
                       "growth": round(aug.growth, 3)})
    mlflow.log_text(aug.gates.to_csv(index=False), "interpolation_gates.csv")
    mlflow.log_text(table.to_csv(index=False), "variants.csv")
    for r in table.to_dict("records"):
        mlflow.log_metrics({f"val_{r['variant']}_{k}": r[k] for k in ("time_mape", "mem_mape", "score")
                            if not math.isnan(r[k])})


def _champion_score(fp: str, valid: pd.DataFrame) -> float | None:
    """The current champion of `fp` re-scored on this held-out set (None: no champion)."""
    mv = registry.champion(fp)
    if mv is None or valid.empty:
        return None
    return held_out_score(stage_errors(registry.load_version(mv.version), valid))


def train_and_register(stage_runs: pd.DataFrame, gpus: Mapping[str, GpuType], fp: registry.Fingerprint, *,
                       config: TrainConfig = TrainConfig(), tracking_uri: str | None = None) -> TrainOutcome:
    """Split, augment the training part, then `train_on` it."""
    train, valid = split_held_out(stage_runs, config.valid_fraction, config.seed)
    aug = augment(train, r2_threshold=config.r2_threshold, max_new_per_gap=config.max_new_per_gap)
    return train_on(aug, valid, gpus, fp, config=config, tracking_uri=tracking_uri,
                    data_version=registry.frame_version(stage_runs))


def train_on(aug: AugmentResult, valid: pd.DataFrame, gpus: Mapping[str, GpuType], fp: registry.Fingerprint, *,
             config: TrainConfig = TrainConfig(), tracking_uri: str | None = None, data_version: str) -> TrainOutcome:
    """Compare variants on the held-out rows, tune the best tree variant, log, register, and move the
    champion alias only if the new version beats it on the same held-out rows."""
    import mlflow

    registry.setup(tracking_uri)
    if valid.empty:
        valid = training_rows(aug.stage_runs)  # too few rows to hold any out: score on the training rows (stated)
    table, fitted = compare_variants(aug.stage_runs, valid, gpus, config.seed)
    trees = table[table["variant"].isin(TREE_VARIANTS)].sort_values("score")
    best_v = str(trees.iloc[0]["variant"])
    with mlflow.start_run(run_name=f"train-{fp.fingerprint[:12]}") as run:
        _log_run_inputs(fp, aug, table, data_version)
        tuned = tune(aug.stage_runs, valid, gpus, variant=best_v, budget=config.budget, seed=config.seed,
                     start=XgbParams())
        default_score = float(trees.iloc[0]["score"])
        final = tuned.predictor if held_out_score(tuned.errors) <= default_score else fitted[best_v]
        errors = stage_errors(final, valid)
        mlflow.log_params({"variant": best_v, **{f"xgb_{k}": v for k, v in dataclasses.asdict(final.params).items()}})
        mlflow.log_metrics({f"val_{k}": v for k, v in errors.items() if not math.isnan(v)}
                           | {"val_score": held_out_score(errors)})
        info = registry.log_predictor(final, valid.head(64) if len(valid) else aug.stage_runs.head(64))
        old = _champion_score(fp.fingerprint, valid)
        version = registry.register(info, run_id=run.info.run_id, fp=fp, data_version=data_version,
                                    held_out=registry.frame_version(valid), predictor_version=final.version,
                                    variant=best_v, metrics={**errors, "score": held_out_score(errors)})
        promoted = old is None or held_out_score(errors) < old
        if promoted:
            registry.promote(version, fp.fingerprint)
        mlflow.set_tag("promoted", str(promoted))
    return TrainOutcome(predictor=final, version=version, promoted=promoted, run_id=run.info.run_id,
                        errors=errors, variant_errors=table, augmented=aug)


def _default_profiler() -> Callable[..., Any]:
    from memx.profiling import profile

    return profile


def stored_or_profiled(cluster: Cluster, model: ModelArch, space: SearchSpace, fp: str, *, backend: str,
                       conf_root: Path | None, seed: int, profiler: Callable[..., Any] | None,
                       **profile_kwargs) -> tuple[pd.DataFrame, bool]:
    """(stage_runs, reused): the stored profile of this fingerprint, else a new one (stored)."""
    path = profile_path(fp)
    if path.exists():
        return pd.read_parquet(path), True
    run = profiler or _default_profiler()
    result = run(cluster, model, space, backend=backend, out_dir=path.parent, seed=seed, conf_root=conf_root,
                 **profile_kwargs)
    df = result.stage_runs if hasattr(result, "stage_runs") else result
    atomic_write_parquet(df, path)
    return df, False


def cached(predictor: LearnedStagePredictor, fp: str, version: int) -> CachedPredictor:
    return CachedPredictor(predictor, version=predictor.version, path=registry.cache_path(fp, version))


def plan_predictor(cluster: Cluster, model: ModelArch, space: SearchSpace, *, backend: str = "simulated",
                   conf_root: Path | None = None, seed: int = 0, tracking_uri: str | None = None,
                   config: TrainConfig | None = None, profiler: Callable[..., Any] | None = None,
                   **profile_kwargs) -> tuple[CachedPredictor, dict[str, Any]]:
    """The cached champion predictor for this fingerprint, profiling and training only what is missing."""
    fp = registry.fingerprint(cluster, model, space.global_batch)
    registry.setup(tracking_uri)
    info: dict[str, Any] = {"fingerprint": fp.fingerprint, **fp.tags(), "tracking_uri": registry.tracking_uri(tracking_uri)}
    mv = registry.champion(fp.fingerprint)
    if mv is not None:
        pred = registry.load_version(mv.version)
        info.update(reused_profile=True, reused_model=True, model_version=int(mv.version), variant=pred.variant,
                    promoted=False)
    else:
        runs, reused = stored_or_profiled(cluster, model, space, fp.fingerprint, backend=backend, conf_root=conf_root,
                                          seed=seed, profiler=profiler, **profile_kwargs)
        out = train_and_register(runs, {g.name: g for g in cluster.gpu_types}, fp,
                                 config=config or TrainConfig(seed=seed), tracking_uri=tracking_uri)
        pred, mv_version = out.predictor, out.version
        info.update(reused_profile=reused, reused_model=False, model_version=mv_version, variant=pred.variant,
                    promoted=out.promoted, held_out=out.errors, rows_measured=out.augmented.rows_before,
                    rows_augmented=out.augmented.rows_after, growth=out.augmented.growth,
                    profile_runs=int(len(runs)))
    wrapped = cached(pred, fp.fingerprint, info["model_version"])
    info.update(cache_path=str(wrapped.path), cache_entries=len(wrapped), memory_source=pred.memory_source,
                predictor_version=pred.version)
    return wrapped, info
