"""Training and the champion rule (docs/architecture.md §Model registry): hold out measured rows,
augment the rest, compare variants, tune the best tree variant, register it, and move the champion
alias of the fingerprint only when the new version beats the champion on the same held-out rows.

The champion of a fingerprint (GPU types, model structure, global batch) is the one predictor that
plans — for the runner, the flows and the CLI alike (`champion_predictor`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from memx.domain.errors import InputError
from memx.domain.specs import GpuType
from memx.learn.augment import AugmentResult, augment
from memx.learn.cache import CachedPredictor
from memx.learn.model import (
    VARIANTS,
    LearnedStagePredictor,
    XgbParams,
    conformalize,
    fit_predictor,
    held_out_score,
    stage_errors,
    training_rows,
)
from memx.learn.tuning import TuneBudget, tune
from memx.pipeline import lifeline, registry
from memx.pipeline.versioning import frame_version
from memx.planner.cost import AnalyticStageModel

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
    hashes: dict[str, str] = field(default_factory=dict)  # registry.HASH_TAGS tag → sha256 of the stored files


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


def split_and_augment(stage_runs: pd.DataFrame, config: TrainConfig) -> tuple[AugmentResult, pd.DataFrame]:
    """(augmented training rows, held-out rows): hold out measured rows first, then interpolate inside
    the training rows only (R² gate, paper §3.2)."""
    train, valid = split_held_out(stage_runs, config.valid_fraction, config.seed)
    return augment(train, r2_threshold=config.r2_threshold, max_new_per_gap=config.max_new_per_gap), valid


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
    import mlflow  # heavy: imported where a run is logged

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
    try:
        champion = registry.load_version(mv.version)
    except registry.UnusableModel as exc:  # files gone or tampered: absent, the new version is promoted
        registry.log.warning("memx: champion of %s: %s; treated as absent", fp[:12], exc)
        return None
    return held_out_score(stage_errors(champion, valid))


def train_and_register(stage_runs: pd.DataFrame, gpus: Mapping[str, GpuType], fp: registry.Fingerprint, *,
                       config: TrainConfig = TrainConfig(), tracking_uri: str | None = None) -> TrainOutcome:
    """Split, augment the training part, then `train_on` it (a stage_runs frame outside the store)."""
    aug, valid = split_and_augment(stage_runs, config)
    return train_on(aug, valid, gpus, fp, config=config, tracking_uri=tracking_uri,
                    data_version=frame_version(stage_runs))


def _final_predictor(aug: AugmentResult, valid: pd.DataFrame, gpus: Mapping[str, GpuType], config: TrainConfig,
                     table: pd.DataFrame, fitted: dict) -> tuple[str, LearnedStagePredictor]:
    """The best tree variant, tuned by Optuna; the default fit when tuning did not beat it."""
    trees = table[table["variant"].isin(TREE_VARIANTS)].sort_values("score")
    best_v = str(trees.iloc[0]["variant"])
    tuned = tune(aug.stage_runs, valid, gpus, variant=best_v, budget=config.budget, seed=config.seed, start=XgbParams())
    default_score = float(trees.iloc[0]["score"])
    return best_v, tuned.predictor if held_out_score(tuned.errors) <= default_score else fitted[best_v]


def train_on(aug: AugmentResult, valid: pd.DataFrame, gpus: Mapping[str, GpuType], fp: registry.Fingerprint, *,
             config: TrainConfig = TrainConfig(), tracking_uri: str | None = None, data_version: str) -> TrainOutcome:
    """Compare variants on the held-out rows, tune the best tree variant, log, register, and move the
    champion alias only if the new version beats it on the same held-out rows."""
    import mlflow  # heavy: imported where a run is logged

    client = registry.setup(tracking_uri)
    lifeline.mark_stale_runs(client, mlflow.get_experiment_by_name(registry.EXPERIMENT).experiment_id)
    band_source = "held-out residuals"
    if valid.empty:
        valid = training_rows(aug.stage_runs)  # too few rows to hold any out: score on the training rows (stated)
        band_source = "training rows (optimistic)"
    table, fitted = compare_variants(aug.stage_runs, valid, gpus, config.seed)
    # tagged with this process, host and home: a run left RUNNING by kill -9 is marked KILLED later
    with mlflow.start_run(run_name=f"train-{fp.fingerprint[:12]}", tags=lifeline.run_tags()) as run:
        _log_run_inputs(fp, aug, table, data_version)
        best_v, final = _final_predictor(aug, valid, gpus, config, table, fitted)
        final = conformalize(final, valid, source=band_source)  # interval bands (issue #12; memx.learn.intervals)
        errors = stage_errors(final, valid)
        mlflow.log_params({"variant": best_v, **{f"xgb_{k}": v for k, v in dataclasses.asdict(final.params).items()}})
        mlflow.log_metrics({f"val_{k}": v for k, v in errors.items() if not math.isnan(v)}
                           | {"val_score": held_out_score(errors)})
        logged = registry.log_predictor(final, valid.head(64) if len(valid) else aug.stage_runs.head(64))
        old = _champion_score(fp.fingerprint, valid)
        version = registry.register(logged, run_id=run.info.run_id, fp=fp, data_version=data_version,
                                    held_out=frame_version(valid), predictor_version=final.version,
                                    variant=best_v, metrics={**errors, "score": held_out_score(errors)})
        promoted = old is None or held_out_score(errors) < old
        if promoted:
            registry.promote(version, fp.fingerprint)
        mlflow.set_tag("promoted", str(promoted))
    return TrainOutcome(predictor=final, version=version, promoted=promoted, run_id=run.info.run_id,
                        errors=errors, variant_errors=table, augmented=aug, hashes=logged.hashes)


# --- the champion: the one predictor that plans ----------------------------------------------------

def cached(predictor: LearnedStagePredictor, fp: str, version: int) -> CachedPredictor:
    """The predictor behind its persistent prediction cache ($MEMX_HOME/models/<fp>/v<version>/)."""
    return CachedPredictor(predictor, version=predictor.version, path=registry.cache_path(fp, version))


def champion_ref(fp: str, tracking_uri: str | None = None) -> dict[str, Any] | None:
    """The champion of a fingerprint as plain data (what a search version depends on), or None (also when
    no tracking store exists yet: reading never creates one)."""
    if not registry.store_exists(tracking_uri):
        return None
    registry.setup(tracking_uri)
    mv = registry.champion(fp)
    if mv is None:
        return None
    return {"fingerprint": fp, "model_version": int(mv.version), "predictor_version": mv.tags.get("predictor_version", ""),
            "variant": mv.tags.get("variant", ""), "run_id": mv.run_id, "tracking_uri": registry.portable_uri(tracking_uri),
            **({"calibration_sha256": c} if (c := mv.tags.get(registry.CALIBRATION_TAG)) else {})}


def champion_predictor(fp: str, *, tracking_uri: str | None = None) -> tuple[CachedPredictor, dict[str, Any]]:
    """(the champion of `fp` in its prediction cache, its champion_ref); InputError when there is none."""
    ref = champion_ref(fp, tracking_uri)
    if ref is None:
        raise InputError(f"no registered predictor for fingerprint {fp} in {registry.public_tracking_uri(tracking_uri)}; "
                         "run `memx profile` then `memx train` first")
    return cached(registry.load_calibrated(ref["model_version"])[0], fp, ref["model_version"]), ref
