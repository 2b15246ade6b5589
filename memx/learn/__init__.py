"""Learned stage predictor (calibrated analytic prior × dual-output XGBoost correction), its features
and Optuna tuning. Heavy libraries (xgboost, optuna, mlflow) are imported inside functions."""

from memx.learn.model import (
    VARIANTS,
    Calibration,
    LearnedStagePredictor,
    XgbParams,
    fit_predictor,
    held_out_score,
    stage_errors,
)

__all__ = ["VARIANTS", "Calibration", "LearnedStagePredictor", "XgbParams", "fit_predictor", "held_out_score",
           "stage_errors"]
