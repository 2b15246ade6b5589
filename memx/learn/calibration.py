"""Calibrate a stage predictor and the 1F1B assembly from whole-plan measurements (issue #16).

`config_runs` (docs/architecture.md §Measurement records) hold what users most often have: a handful
of plans, each measured once — an iteration time (null on OOM) and one peak per GPU. A `PlanCalibration`
fitted on them corrects, on top of any stage predictor (closed form or learned):

- per GPU type g, a multiplier a_g on every stage time of that type;
- one multiplier c on the assembly's communication and step terms (Σ 2·p2p + max_s (T_dp + optimizer),
  paper §3.1.2; docs/architecture.md §1F1B assembly);
- a per-iteration overhead o (ms; launch, data loading, logging — what no stage measurement sees; the
  fit leaves its sign free, so it also absorbs a constant over-estimate of the base model);
- per GPU type, an affine map of the predicted peak, peak' = k_g·peak + b_g (MiB).

The calibrated iteration time of a plan with m micro batches and stage times t_s is
    T' = (m − 1)·max_s(a_{g_s}·t_s) + Σ_s a_{g_s}·t_s + c·(T − S) + o,
where T is the uncalibrated estimate and S = (m − 1)·max_s t_s + Σ_s t_s its stage part, so T − S is
exactly the assembly's p2p + T_dp + optimizer terms (memx.planner.schedule.iteration_time_ms).

Fit: robust least squares (scipy `least_squares`, soft-L1 loss on relative errors, Huber 1964 /
Triggs et al. 2000 §6) with a ridge prior toward identity (log a_g = log c = 0, o = 0; k_g = 1, b_g = 0):
with a handful of plans the prior dominates, so a few plans cannot overfit; with none the calibration
is the identity. OOM rows carry no time and no peak and are not used.

Where it applies: `calibrated_estimates` applies all of it exactly to given plans (memx evaluate /
memx plan --check). `PlanCalibration.wrap(predictor)` gives a StagePredictor that applies the
per-type stage multipliers and memory maps — the part the search sees; c and o need two fields in
memx.planner.schedule.Pipeline (not done here, see docs/predictor.md §Calibration from measured plans).
A constant o does not change which plan is fastest.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from memx.domain.errors import InputError
from memx.domain.plan import Plan, plan_from_dict, plan_from_json
from memx.domain.specs import Cluster, ModelArch
from memx.planner.estimate import estimate_plans
from memx.planner.metrics import PlanMetrics, per_gpu_peaks
from memx.planner.schedule import iteration_time_ms
from memx.planner.signatures import StagePredictor

TIME_RIDGE = 0.3  # prior weight: a unit of log-multiplier costs like a 30 % error on one plan (soft-L1 scale)
MEM_RIDGE = 0.3
LOSS_SCALE = 0.1  # soft-L1 f_scale: relative errors above 10 % count linearly, not quadratically
MEM_COLUMNS = ("peak_mem_mib", "peak_mem_mib_low", "peak_mem_mib_high")


@dataclass(frozen=True, kw_only=True)
class PlanCalibration:
    """Corrections fitted on measured plans; the default is the identity."""

    time_scale: Mapping[str, float] = field(default_factory=dict)  # a_g per GPU type (missing: 1)
    comm_scale: float = 1.0  # c on p2p + DP step + optimizer step
    overhead_ms: float = 0.0  # o per iteration
    mem_scale: Mapping[str, float] = field(default_factory=dict)  # k_g per GPU type (missing: 1)
    mem_offset_mib: Mapping[str, float] = field(default_factory=dict)  # b_g per GPU type (missing: 0)
    plans_timed: int = 0  # measured plans with an iteration time the fit used
    plans_with_peaks: int = 0

    @property
    def is_identity(self) -> bool:
        return self.plans_timed == 0 and self.plans_with_peaks == 0

    def wrap(self, predictor: StagePredictor) -> StagePredictor:
        return CalibratedStagePredictor(base=predictor, calibration=self)

    def to_dict(self) -> dict:
        return {"time_scale": dict(self.time_scale), "comm_scale": self.comm_scale, "overhead_ms": self.overhead_ms,
                "mem_scale": dict(self.mem_scale), "mem_offset_mib": dict(self.mem_offset_mib),
                "plans_timed": self.plans_timed, "plans_with_peaks": self.plans_with_peaks}


@dataclass(frozen=True, kw_only=True)
class CalibratedStagePredictor:
    """A StagePredictor: the base's stage times × a_g and peaks k_g·peak + b_g, per row's GPU type."""

    base: StagePredictor
    calibration: PlanCalibration

    @property
    def name(self) -> str:
        return f"{self.base.name}+calibrated"

    def predict(self, sigs: pd.DataFrame) -> pd.DataFrame:
        out = self.base.predict(sigs).copy()
        cal, gpu = self.calibration, sigs["gpu"].astype(str)
        a = gpu.map(lambda g: cal.time_scale.get(g, 1.0)).to_numpy(float)
        k = gpu.map(lambda g: cal.mem_scale.get(g, 1.0)).to_numpy(float)
        b = gpu.map(lambda g: cal.mem_offset_mib.get(g, 0.0)).to_numpy(float)
        for col in ("time_ms", "time_ms_low", "time_ms_high"):
            if col in out:
                out[col] = out[col].to_numpy(float) * a
        for col in MEM_COLUMNS:
            if col in out:
                out[col] = out[col].to_numpy(float) * k + b
        return out


def _stage_part(stage_ms: Sequence[float], micro_batches: int) -> float:
    """S = (m − 1)·max_s t_s + Σ_s t_s: the assembly without p2p and tail (memx.planner.schedule)."""
    t = np.asarray(stage_ms, dtype=np.float64)[:, None]
    return float(iteration_time_ms(t, micro_batches, 0.0, np.zeros_like(t))[0])


def calibrated_estimates(plans: list[Plan], cluster: Cluster, model: ModelArch, predictor: StagePredictor,
                         calibration: PlanCalibration, *, reserve_gib: float = 1.0) -> list[PlanMetrics]:
    """estimate_plans through the calibrated predictor, with c and o applied to each iteration time."""
    est = estimate_plans(plans, cluster, model, calibration.wrap(predictor), reserve_gib=reserve_gib)
    out = []
    for e in est:
        s = _stage_part(e.stage_time_ms, e.plan.micro_batches)
        t = s + calibration.comm_scale * (e.iteration_time_ms - s) + calibration.overhead_ms
        out.append(replace(e, iteration_time_ms=float(t)))
    return out


def fit_plan_calibration(plans: list[Plan], iteration_time_ms_measured: Sequence[float | None],
                    peak_mem_mib_measured: Sequence[Sequence[float] | None], cluster: Cluster, model: ModelArch,
                    predictor: StagePredictor, *, time_ridge: float = TIME_RIDGE,
                    mem_ridge: float = MEM_RIDGE) -> PlanCalibration:
    """Fit a PlanCalibration on measured plans (None entries: OOM / not measured, skipped)."""
    if not (len(plans) == len(iteration_time_ms_measured) == len(peak_mem_mib_measured)):
        raise InputError("fit_plan_calibration: plans, iteration times and peaks must have one entry per plan")
    if not plans:
        return PlanCalibration()
    est = estimate_plans(plans, cluster, model, predictor, reserve_gib=0.0)
    timed = [i for i, y in enumerate(iteration_time_ms_measured) if _finite_positive(y)]
    with_peaks = [i for i, y in enumerate(peak_mem_mib_measured) if y is not None and len(y) > 0]
    time_fit = _fit_time([est[i] for i in timed], np.asarray([iteration_time_ms_measured[i] for i in timed], float),
                         time_ridge)
    mem_scale, mem_offset = _fit_memory([est[i] for i in with_peaks],
                                        [np.asarray(peak_mem_mib_measured[i], float) for i in with_peaks], mem_ridge)
    return PlanCalibration(**time_fit, mem_scale=mem_scale, mem_offset_mib=mem_offset,
                           plans_timed=len(timed), plans_with_peaks=len(with_peaks))


def fit_from_config_runs(runs: pd.DataFrame, cluster: Cluster, model: ModelArch, predictor: StagePredictor,
                         **kw) -> PlanCalibration:
    """fit_plan_calibration on a config_runs frame (docs/architecture.md §Measurement records)."""
    missing = [c for c in ("plan", "iteration_time_ms", "peak_mem_mib", "oom") if c not in runs.columns]
    if missing:
        raise InputError(f"config_runs: missing column(s) {', '.join(missing)}")
    plans = [plan_from_dict(p, source=f"config_runs row {i}: field 'plan'") if isinstance(p, dict)
             else plan_from_json(str(p), source=f"config_runs row {i}: field 'plan'")
             for i, p in enumerate(runs["plan"])]
    oom = runs["oom"].astype(bool).to_numpy()
    times = [None if o or not _finite_positive(t) else float(t) for o, t in zip(oom, runs["iteration_time_ms"])]
    peaks = [None if o or p is None or (isinstance(p, float) and np.isnan(p)) else _peaks(p)
             for o, p in zip(oom, runs["peak_mem_mib"])]
    return fit_plan_calibration(plans, times, peaks, cluster, model, predictor, **kw)


def _peaks(p) -> list[float]:
    return [float(x) for x in (json.loads(p) if isinstance(p, str) else p)]


def _finite_positive(y) -> bool:
    return y is not None and bool(np.isfinite(y)) and float(y) > 0.0


def _fit_time(est: list[PlanMetrics], y: np.ndarray, ridge: float) -> dict:
    """θ = (log a_g per type seen, log c, o / median y); residuals: soft-L1 relative errors + ridge."""
    if not est:
        return {}
    types = sorted({st.gpu for e in est for st in e.plan.stages})
    idx = {g: j for j, g in enumerate(types)}
    scale = float(np.median(y))
    stage_type = [np.asarray([idx[st.gpu] for st in e.plan.stages]) for e in est]
    stage_ms = [np.asarray(e.stage_time_ms, float) for e in est]
    m = np.asarray([e.plan.micro_batches for e in est], float)
    comm = np.asarray([e.iteration_time_ms - _stage_part(e.stage_time_ms, e.plan.micro_batches) for e in est])
    k = len(types)

    def predict(theta: np.ndarray) -> np.ndarray:
        a = np.exp(theta[:k])
        t_scaled = [t * a[ty] for t, ty in zip(stage_ms, stage_type)]
        s = np.asarray([(mi - 1) * t.max() + t.sum() for t, mi in zip(t_scaled, m)])
        return s + np.exp(theta[k]) * comm + theta[k + 1] * scale

    def residuals(theta: np.ndarray) -> np.ndarray:
        return np.concatenate([(predict(theta) - y) / y, np.sqrt(ridge) * theta])

    sol = least_squares(residuals, np.zeros(k + 2), loss="soft_l1", f_scale=LOSS_SCALE, x_scale="jac")
    th = sol.x
    return {"time_scale": {g: float(np.exp(th[j])) for g, j in idx.items()}, "comm_scale": float(np.exp(th[k])),
            "overhead_ms": float(th[k + 1] * scale)}


def _fit_memory(est: list[PlanMetrics], peaks: list[np.ndarray], ridge: float) -> tuple[dict, dict]:
    """Per GPU type: (k_g, b_g) minimising soft-L1 relative errors of k·p + b over that type's GPUs."""
    pred: dict[str, list[float]] = {}
    meas: dict[str, list[float]] = {}
    for e, y in zip(est, peaks):
        stage_of_gpu = per_gpu_peaks(e.plan, range(e.plan.pp))
        if len(y) != len(stage_of_gpu):
            raise InputError(f"config_runs: plan with {len(stage_of_gpu)} GPUs has {len(y)} peaks")
        for s, v in zip(stage_of_gpu, y):
            g = e.plan.stages[int(s)].gpu
            pred.setdefault(g, []).append(e.stage_peak_mib[int(s)])
            meas.setdefault(g, []).append(float(v))
    scale, offset = {}, {}
    for g in sorted(pred):
        p, y = np.asarray(pred[g]), np.asarray(meas[g])
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
    return scale, offset
