"""The memory part of a plan calibration (memx.learn.calibration, issue #16): per GPU type an affine map
peak' = k_g·peak + b_g of the predicted peak, fitted on the measured per-GPU peaks of whole plans (soft-L1
relative errors, ridge toward k = 1, b = 0; Huber 1964 / Triggs et al. 2000 §6, as the time part)."""

from __future__ import annotations

import numpy as np
from scipy.optimize import least_squares

from memx.domain.errors import InputError
from memx.planner.metrics import PlanMetrics, per_gpu_peaks

LOSS_SCALE = 0.1  # soft-L1 f_scale (both parts of a calibration): relative errors above 10 % count linearly


def gpu_peaks(est: list[PlanMetrics], peaks: list[np.ndarray]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(GPU type, predicted peak, measured peak) of every GPU of every plan."""
    types, pred, meas = [], [], []
    for e, y in zip(est, peaks):
        stage_of_gpu = per_gpu_peaks(e.plan, range(e.plan.pp))
        if len(y) != len(stage_of_gpu):
            raise InputError(f"config_runs: plan with {len(stage_of_gpu)} GPUs has {len(y)} peaks")
        for s, v in zip(stage_of_gpu, y):
            types.append(e.plan.stages[int(s)].gpu)
            pred.append(e.stage_peak_mib[int(s)])
            meas.append(float(v))
    return types, np.asarray(pred, float), np.asarray(meas, float)


def fit_memory(est: list[PlanMetrics], peaks: list[np.ndarray], ridge: float) -> dict:
    """Per GPU type: (k_g, b_g) minimising soft-L1 relative errors of k·p + b over that type's GPUs."""
    types, pred, meas = gpu_peaks(est, peaks)
    types_a = np.asarray(types, dtype=object)
    scale, offset = {}, {}
    for g in sorted(set(types)):
        sel = types_a == g
        p, y = pred[sel], meas[sel]
        ok = (y > 0) & np.isfinite(y) & np.isfinite(p)
        if not ok.any():
            continue
        p, y = p[ok], y[ok]
        ref = float(np.median(y))

        def residuals(theta: np.ndarray, p=p, y=y, ref=ref) -> np.ndarray:
            return np.concatenate([(np.exp(theta[0]) * p + theta[1] * ref - y) / y, np.sqrt(ridge) * theta])

        th = least_squares(residuals, np.zeros(2), bounds=([-3.0, -1.0], [3.0, 1.0]), loss="soft_l1",
                           f_scale=LOSS_SCALE).x
        scale[g], offset[g] = float(np.exp(th[0])), float(th[1] * ref)
    return {"mem_scale": scale, "mem_offset_mib": offset} if scale else {}


def mem_errors(fit: dict, est: list[PlanMetrics], peaks: list[np.ndarray]) -> np.ndarray:
    """|k·p + b − y| / y of every measured GPU under a memory fit ({}: the identity)."""
    types, pred, meas = gpu_peaks(est, peaks)
    k = np.asarray([fit.get("mem_scale", {}).get(g, 1.0) for g in types])
    b = np.asarray([fit.get("mem_offset_mib", {}).get(g, 0.0) for g in types])
    ok = (meas > 0) & np.isfinite(meas) & np.isfinite(pred)
    return np.abs(k * pred + b - meas)[ok] / meas[ok]
