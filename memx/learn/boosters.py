"""XGBoost boosters of the learned stage predictor (memx.learn.model): training one, loading a stored one, and the
feature matrix as a booster trained on an earlier feature set wants it."""

from __future__ import annotations

import base64

import numpy as np

from memx.learn.features import FEATURE_NAMES, MOE_FEATURES


def columns_for(booster, X: np.ndarray) -> np.ndarray:
    """X as `booster` was trained: boosters from before the MoE features (issue #27) take the matrix without
    them, those from before the sequence_parallel feature (issue #14) without it too."""
    have, n = booster.num_features(), X.shape[1]
    if have == n:
        return X
    if have in (n - len(MOE_FEATURES), n - len(MOE_FEATURES) - 1):
        X = X[:, :n - len(MOE_FEATURES)]
    if have == X.shape[1] - 1:
        X = np.delete(X, FEATURE_NAMES.index("sequence_parallel"), axis=1)
    return np.ascontiguousarray(X)


def booster_from_b64(b64: str | None):
    if not b64:
        return None
    import xgboost as xgb  # heavy: only when a memory head was stored

    b = xgb.Booster()
    b.load_model(bytearray(base64.b64decode(b64)))
    return b


def train(xgb, params, seed: int, X: np.ndarray, Y: np.ndarray):
    return xgb.train(params.booster_params(seed, Y.shape[1]), xgb.DMatrix(X, label=Y), num_boost_round=params.n_rounds)
