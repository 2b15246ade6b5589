"""Optuna tuning of the boosted correction, each trial a nested MLflow run (ECOSYSTEM.md: prefer
``mlflow.start_run(nested=True)`` inside the objective over the deprecated MLflowCallback).

TPE (seeded) over tree depth, learning rate, rounds, child weight, sampling, L2 and the multi-output
strategy. The budget counts trials, so the same inputs and seed give the same predictor on any machine
(issue #12 "Same inputs, same plan"); an optional wall-clock cap may only stop early, with a warning naming
the number of trials reached (then the result depends on machine load). The objective is the held-out score of
memx.learn.model.held_out_score (time MAPE + memory MAPE on rows the trees never saw).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import pandas as pd

from memx.learn.model import LearnedStagePredictor, XgbParams, fit_predictor, held_out_score, stage_errors
from memx.domain.specs import GpuType


@dataclass(frozen=True, kw_only=True)
class TuneBudget:
    """`trials` decides the result; `seconds` (None: no cap) may only stop early, with a warning."""

    trials: int = 8  # our choice: the default scenario trains in well under a minute on 2 cores
    seconds: float | None = None


@dataclass(frozen=True, kw_only=True)
class TuneResult:
    predictor: LearnedStagePredictor
    params: XgbParams
    errors: dict[str, float]
    trials: pd.DataFrame  # number, params, held-out metrics


def suggest(trial) -> XgbParams:
    return XgbParams(
        max_depth=trial.suggest_int("max_depth", 2, 8),
        learning_rate=trial.suggest_float("learning_rate", 0.02, 0.3, log=True),
        n_rounds=trial.suggest_int("n_rounds", 50, 400, step=25),
        min_child_weight=trial.suggest_float("min_child_weight", 1.0, 30.0, log=True),
        subsample=trial.suggest_float("subsample", 0.6, 1.0),
        colsample_bytree=trial.suggest_float("colsample_bytree", 0.6, 1.0),
        reg_lambda=trial.suggest_float("reg_lambda", 1e-3, 10.0, log=True),
        multi_strategy=trial.suggest_categorical("multi_strategy", ["one_output_per_tree", "multi_output_tree"]),
    )


def tune(train: pd.DataFrame, valid: pd.DataFrame, gpus: Mapping[str, GpuType], *, variant: str,
         budget: TuneBudget = TuneBudget(), seed: int = 0, log_mlflow: bool = True,
         start: XgbParams | None = None) -> TuneResult:
    """Tune one variant's trees; with `log_mlflow`, call inside an active MLflow run."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    fitted: dict[int, tuple[LearnedStagePredictor, dict[str, float]]] = {}

    def objective(trial) -> float:
        params = suggest(trial)
        pred = fit_predictor(train, gpus, variant=variant, params=params, seed=seed)
        err = stage_errors(pred, valid)
        score = held_out_score(err)
        fitted[trial.number] = (pred, err)
        for k, v in err.items():
            trial.set_user_attr(k, v)
        if log_mlflow:
            _log_trial(trial.number, variant, params, err, score)
        return score

    sampler = optuna.samplers.TPESampler(seed=seed)
    study = optuna.create_study(direction="minimize", sampler=sampler)
    if start is not None:  # the defaults are a known-good first point
        study.enqueue_trial({k: v for k, v in asdict(start).items()})
    study.optimize(objective, n_trials=budget.trials, callbacks=[_wall_clock_cap(budget)])
    if len(study.trials) < budget.trials:
        warnings.warn(f"tuning stopped by the {budget.seconds:g} s wall-clock cap after {len(study.trials)} of "
                      f"{budget.trials} trials: the result now depends on machine load (drop the cap for a "
                      "deterministic result)", RuntimeWarning, stacklevel=2)
    best = study.best_trial.number
    pred, err = fitted[best]
    trials = study.trials_dataframe(attrs=("number", "value", "params", "user_attrs"))
    return TuneResult(predictor=pred, params=pred.params, errors=err, trials=trials)


def _wall_clock_cap(budget: TuneBudget):
    """An Optuna callback that stops the study once `budget.seconds` have passed (never without a cap)."""
    t0 = time.monotonic()

    def cap(study, trial) -> None:
        if budget.seconds is not None and time.monotonic() - t0 > budget.seconds:
            study.stop()

    return cap


def _log_trial(number: int, variant: str, params: XgbParams, err: Mapping[str, float], score: float) -> None:
    import math

    import mlflow

    with mlflow.start_run(nested=True, run_name=f"trial-{number}"):
        mlflow.log_params({"variant": variant, **asdict(params)})
        mlflow.log_metrics({f"val_{k}": v for k, v in err.items() if not math.isnan(v)} | {"val_score": score})
