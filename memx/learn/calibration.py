"""Calibrate a stage predictor and the 1F1B assembly from whole-plan measurements (issue #16).

`config_runs` (docs/architecture.md §Measurement records) hold what users most often have: a handful
of plans, each measured once — an iteration time (null on OOM) and one peak per GPU. A `PlanCalibration`
fitted on them corrects, on top of any stage predictor (closed form or learned):

- per GPU type g, a multiplier a_g on every stage time of that type; optionally (`per_tp`) also one per
  tensor-parallel degree, b_tp (the stage's tp all-reduces, Shoeybi et al. 2019 §3, and per-rank GEMM sizes
  change with tp, so a profile environment can be off by degree; vTrain: tp 1 stages too fast, tp 2 slow);
- one multiplier c on the assembly's communication and step terms (Σ 2·p2p + max_s (T_dp + optimizer),
  paper §3.1.2; docs/architecture.md §1F1B assembly);
- a per-iteration overhead o (ms; launch, data loading, logging — what no stage measurement sees; the
  fit leaves its sign free, so it also absorbs a constant over-estimate of the base model);
- a cost d ≥ 0 (ms) of every blocking p2p transfer on the 1F1B critical path, 2 (pp − 1) + 2 (m − 1) of
  them (memx.planner.schedule.blocking_transfers; Narayanan et al. 2021 §2.2.1): with blocking send/recv
  every micro batch's activation and gradient hops cost the bottleneck stage time, which the paper's
  Σ 2·p2p (counted once per iteration) does not charge — so the error of the paper's assembly grows with
  pp and m where a framework's send/recv carries a fixed set-up cost (Megatron-DeepSpeed on vTrain's A100s);
- a cost e ≥ 0 (ms) per layer and micro batch on every stage (`per_layer`, on by default): host dispatch, launches and
  small-message latencies a layer pays whatever its size, which the closed form undercounts on small layers
  (memx.learn.time_fit; docs/results.md §The closed form on vTrain single-node);
- per GPU type, an affine map of the predicted peak, peak' = k_g·peak + b_g (MiB; memx.learn.peak_calibration);
- from 40 timed plans on, a plan residual T'' = T'·exp(r(x)) (memx.learn.residual: boosted trees on what the
  parametric terms leave, at plan level; `residual=False` leaves it out).

The calibrated iteration time of a plan with m micro batches and stage times t_s is
    T' = (m − 1)·max_s(t'_s) + Σ_s t'_s + c·(T − S) + o + d·blocking_transfers(pp, m),  t'_s = a_{g_s}·b_{tp_s}·t_s + e·L_s,
where T is the uncalibrated estimate and S = (m − 1)·max_s t_s + Σ_s t_s its stage part, so T − S is
exactly the assembly's p2p + T_dp + optimizer terms (memx.planner.schedule.iteration_time_ms). With
`pipeline_assembly: cycle-mean` max_s is the maximum cycle mean with c·2·p2p_s in the loops (schedule.
steady_period_ms): d stays a set-up cost per transfer, the cycle mean adds the loop's bytes / bandwidth time.

Fit: robust least squares (scipy `least_squares`, soft-L1 loss on relative errors, Huber 1964 /
Triggs et al. 2000 §6) with a ridge prior toward identity (log a_g = log c = 0, o = d = e = 0; k_g = 1, b_g = 0):
with a handful of plans the prior dominates, so a few plans cannot overfit; with none the calibration
is the identity. OOM rows carry no time and no peak and are not used.

Where it applies: `PlanCalibration.wrap(predictor)` is a StagePredictor that applies the per-type
stage multipliers and memory maps and carries c, o and d (`assembly`) into memx.planner.schedule.Pipeline,
so the search, `estimate_plans` and `calibrated_estimates` score plans through one assembly.

Guard (`guard=True`, the default): the time part and the memory part are each kept only when their
leave-one-plan-out error (10-fold beyond 30 plans) beats the uncalibrated error on the measured plans;
otherwise that part stays the identity and `Guard` records both figures. On an already accurate
predictor the fit mostly chases measurement noise, which cross-validation exposes.
"""

from __future__ import annotations

import binascii
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from memx.domain.errors import InputError, NothingUsable
from memx.domain.groups import any_plan_from_dict, simplest
from memx.domain.hashing import stable_hash
from memx.domain.plan import Plan, json_document
from memx.domain.specs import DEFAULT_PIPELINE_ASSEMBLY, MAX_GPU_MEMORY_MIB, PIPELINE_ASSEMBLIES, Cluster, ModelArch, PipelineAssembly
from memx.learn.experts import predict_columns
from memx.learn.guard import Guard
from memx.learn.peak_calibration import fit_memory, mem_errors
from memx.learn.residual import PlanResidual, fit_residual, residual_from_dict
from memx.planner.estimate import estimate_plans
from memx.planner.metrics import PlanMetrics
from memx.learn.time_fit import TIME_KEYS, fit_time, time_errors, time_parts
from memx.planner.schedule import AssemblyCalibration, assembly_of
from memx.planner.signatures import StagePredictor

TIME_RIDGE = 0.3  # prior weight: a unit of log-multiplier costs like a 30 % error on one plan (soft-L1 scale)
MEM_RIDGE = 0.3
MEM_COLUMNS = ("peak_mem_mib", "peak_mem_mib_low", "peak_mem_mib_high")


PER_LAYER_DEFAULT = True  # fit e (a cost per layer and micro batch): chosen by docs/results.md §The closed form on vTrain single-node
MIN_GUARD_PLANS = 3  # fewer measured plans: nothing to cross-validate on, the part stays the identity
MAX_LOO = 30  # up to this many plans leave-one-out, beyond it 10-fold
FOLDS = 10


@dataclass(frozen=True, kw_only=True)
class PlanCalibration:
    """Corrections fitted on measured plans; the default is the identity."""

    time_scale: Mapping[str, float] = field(default_factory=dict)  # a_g per GPU type (missing: 1)
    tp_time_scale: Mapping[int, float] = field(default_factory=dict)  # b_tp per tensor-parallel degree (missing: 1)
    comm_scale: float = 1.0  # c on p2p + DP step + optimizer step
    overhead_ms: float = 0.0  # o per iteration
    p2p_per_transfer_ms: float = 0.0  # d per blocking p2p transfer on the 1F1B critical path
    layer_overhead_ms: float = 0.0  # e per layer and micro batch on every stage (memx.learn.time_fit)
    mem_scale: Mapping[str, float] = field(default_factory=dict)  # k_g per GPU type (missing: 1)
    mem_offset_mib: Mapping[str, float] = field(default_factory=dict)  # b_g per GPU type (missing: 0)
    plans_timed: int = 0  # measured plans with an iteration time the fit used
    plans_with_peaks: int = 0
    time_guard: Guard | None = None  # None: fitted without the guard (or nothing to fit)
    mem_guard: Guard | None = None
    residual: PlanResidual | None = None  # kept plan residual on T' (memx.learn.residual), None: none kept
    residual_guard: Guard | None = None  # the residual's cross-validation (base: T'), None: none was fitted
    pipeline_assembly: PipelineAssembly = DEFAULT_PIPELINE_ASSEMBLY  # the fit's 1F1B assembly (SearchSpace field)

    @property
    def is_identity(self) -> bool:
        """Whether it changes no prediction (nothing fitted, or every part kept at the identity)."""
        return (all(v == 1.0 for v in self.time_scale.values()) and all(v == 1.0 for v in self.tp_time_scale.values())
                and self.comm_scale == 1.0 and self.overhead_ms == 0.0
                and self.p2p_per_transfer_ms == 0.0 and self.layer_overhead_ms == 0.0 and self.residual is None
                and all(v == 1.0 for v in self.mem_scale.values()) and all(v == 0.0 for v in self.mem_offset_mib.values()))

    @property
    def assembly(self) -> AssemblyCalibration:
        return AssemblyCalibration(comm_scale=self.comm_scale, overhead_ms=self.overhead_ms,
                                   p2p_per_transfer_ms=self.p2p_per_transfer_ms, pipeline_assembly=self.pipeline_assembly)

    def wrap(self, predictor: StagePredictor) -> StagePredictor:
        """The predictor the search and estimate_plans use: per-type stage time and memory maps, and c
        and o through `assembly` (memx.planner.schedule.assembly_of); the base itself when identity."""
        return predictor if self.is_identity else CalibratedStagePredictor(base=predictor, plan_calibration=self)

    def time_error(self) -> float | None:
        """Held-out iteration-time MAPE on the measured plans of what this calibration applies (the residual's
        cross-validation when a residual is kept, the time part's when it is kept, else the uncalibrated
        error); None without timed plans. Two versions calibrated on the same plans compare by it."""
        if self.residual is not None and self.residual_guard is not None:
            return self.residual_guard.cv_mape
        g = self.time_guard
        return None if g is None else (g.cv_mape if g.accepted else g.base_mape)

    def headline(self) -> str:
        """A few words for the plan output's predictor name."""
        n = max(self.plans_timed, self.plans_with_peaks, self.residual.plans if self.residual else 0)
        if n:
            return f"calibrated on {n} measured plans"
        g = self.time_guard or self.mem_guard
        return ("not calibrated: no measured plan" if g is None else
                "calibration rejected: it did not beat the uncalibrated held-out error")

    def summary(self) -> str:
        """One line for plan output and `memx train --measured`."""
        parts = []
        for what, g, n in (("time", self.time_guard, self.plans_timed), ("memory", self.mem_guard, self.plans_with_peaks)):
            if g is None:
                parts.append(f"{what}: calibrated on {n} measured plans" if n else f"{what}: not calibrated")
            elif g.folds == 0:
                parts.append(f"{what}: kept uncalibrated (fewer than {MIN_GUARD_PLANS} measured plans)")
            else:
                verdict = f"calibrated on {n} measured plans" if g.accepted else "kept uncalibrated"
                parts.append(f"{what}: {verdict} (held-out error {100 * g.cv_mape:.1f} % vs uncalibrated "
                             f"{100 * g.base_mape:.1f} %, {g.folds} folds)")
        if (g := self.residual_guard) is not None:
            r = self.residual
            parts.append(f"plan residual {'kept' if r else 'not kept'} (held-out error {100 * g.cv_mape:.1f} % vs "
                         f"{100 * g.base_mape:.1f} % calibrated, {g.folds} folds"
                         + (f", depth {r.max_depth}, {r.rounds} rounds, {r.plans} plans)" if r else ")"))
        return "; ".join(parts)

    def to_dict(self) -> dict:
        return {"time_scale": dict(self.time_scale), "tp_time_scale": {str(t): v for t, v in self.tp_time_scale.items()},
                "comm_scale": self.comm_scale, "overhead_ms": self.overhead_ms,
                "p2p_per_transfer_ms": self.p2p_per_transfer_ms, "layer_overhead_ms": self.layer_overhead_ms,
                "mem_scale": dict(self.mem_scale), "mem_offset_mib": dict(self.mem_offset_mib),
                "plans_timed": self.plans_timed, "plans_with_peaks": self.plans_with_peaks,
                "time_guard": self.time_guard.to_dict() if self.time_guard else None,
                "mem_guard": self.mem_guard.to_dict() if self.mem_guard else None,
                "residual": self.residual.to_dict() if self.residual else None,
                "residual_guard": self.residual_guard.to_dict() if self.residual_guard else None,
                "pipeline_assembly": self.pipeline_assembly}


def calibration_from_dict(d: Mapping, *, source: str = "calibration.json") -> PlanCalibration:
    """The inverse of PlanCalibration.to_dict; InputError naming the field on anything else."""
    try:
        guards = {k: None if d.get(k) is None else Guard(base_mape=float(d[k]["base_mape"]),
                                                           cv_mape=float(d[k]["cv_mape"]), folds=int(d[k]["folds"]))
                  for k in ("time_guard", "mem_guard", "residual_guard")}
        return PlanCalibration(
            time_scale={str(g): float(v) for g, v in d["time_scale"].items()},
            tp_time_scale={int(t): float(v) for t, v in d.get("tp_time_scale", {}).items()}, comm_scale=float(d["comm_scale"]),
            overhead_ms=float(d["overhead_ms"]), p2p_per_transfer_ms=float(d.get("p2p_per_transfer_ms", 0.0)),
            layer_overhead_ms=float(d.get("layer_overhead_ms", 0.0)),
            mem_scale={str(g): float(v) for g, v in d["mem_scale"].items()},
            mem_offset_mib={str(g): float(v) for g, v in d["mem_offset_mib"].items()},
            plans_timed=int(d["plans_timed"]), plans_with_peaks=int(d["plans_with_peaks"]),
            residual=None if d.get("residual") is None else residual_from_dict(d["residual"]),
            pipeline_assembly=assembly_of(None, d.get("pipeline_assembly", "paper")).pipeline_assembly, **guards)
    except (KeyError, TypeError, ValueError, AttributeError, binascii.Error) as exc:
        raise InputError(f"{source}: not a plan calibration ({type(exc).__name__}: {exc}); fields: "
                         "time_scale, tp_time_scale (optional), comm_scale, overhead_ms, p2p_per_transfer_ms (optional), layer_overhead_ms (optional), mem_scale, mem_offset_mib, plans_timed, "
                         "plans_with_peaks, time_guard, mem_guard, residual, residual_guard (optional), pipeline_assembly (optional: "
                         f"{', '.join(PIPELINE_ASSEMBLIES)}; absent: paper, as older files were fitted)") from None


@dataclass(frozen=True, kw_only=True)
class CalibratedStagePredictor:
    """A StagePredictor: the base's stage times × a_g and peaks k_g·peak + b_g, per row's GPU type;
    `assembly` carries c and o to the search's and estimate_plans' Pipeline. Other attributes
    (memory_source, variant, ...) are the base's."""

    base: StagePredictor
    plan_calibration: PlanCalibration

    @property
    def name(self) -> str:
        return f"{self.base.name}+calibrated"

    @property
    def version(self) -> str:  # a prediction cache keyed by version never mixes calibrated and raw rows
        return f"{getattr(self.base, 'version', self.base.name)}+cal-{stable_hash(self.plan_calibration.to_dict())[:12]}"

    @property
    def assembly(self) -> AssemblyCalibration:
        return self.plan_calibration.assembly

    def correct_plans(self, metrics: list[PlanMetrics]) -> list[PlanMetrics]:
        """Plan-level scores with the plan residual (memx.planner.metrics.corrected_plans); unchanged without one."""
        r = self.plan_calibration.residual
        return list(metrics) if r is None else r.correct(metrics)

    def __getattr__(self, attr):  # only for attributes not defined here: those of the base
        if attr.startswith("__") or attr in ("base", "plan_calibration"):
            raise AttributeError(attr)
        return getattr(self.base, attr)

    def predict_columns(self, cols) -> pd.DataFrame:
        """`predict` on the search's numpy columns, a MoE stage's expert columns kept (memx.learn.experts)."""
        return predict_columns(self, cols)

    def predict(self, sigs: pd.DataFrame) -> pd.DataFrame:
        out = self.base.predict(sigs).copy()
        cal, gpu = self.plan_calibration, sigs["gpu"].astype(str)
        a = gpu.map(lambda g: cal.time_scale.get(g, 1.0)).to_numpy(float)
        a = a * sigs["tp"].astype(int).map(lambda t: cal.tp_time_scale.get(t, 1.0)).to_numpy(float)
        k = gpu.map(lambda g: cal.mem_scale.get(g, 1.0)).to_numpy(float)
        b = gpu.map(lambda g: cal.mem_offset_mib.get(g, 0.0)).to_numpy(float)
        e = cal.layer_overhead_ms * sigs["layers"].to_numpy(float)  # e·L_s (memx.learn.time_fit)
        for col in ("time_ms", "time_ms_low", "time_ms_high"):
            if col in out:
                out[col] = out[col].to_numpy(float) * a + e
        for col in MEM_COLUMNS:
            if col in out:
                out[col] = out[col].to_numpy(float) * k + b
        return out


def calibrated_estimates(plans: list[Plan], cluster: Cluster, model: ModelArch, predictor: StagePredictor,
                         calibration: PlanCalibration, *, reserve_gib: float = 1.0) -> list[PlanMetrics]:
    """estimate_plans through the calibrated predictor: the one assembly the search uses (its fit's 1F1B one)."""
    return estimate_plans(plans, cluster, model, calibration.wrap(predictor), reserve_gib=reserve_gib,
                          pipeline_assembly=calibration.pipeline_assembly)


def fit_plan_calibration(plans: list[Plan], iteration_time_ms_measured: Sequence[float | None],
                    peak_mem_mib_measured: Sequence[Sequence[float] | None], cluster: Cluster, model: ModelArch,
                    predictor: StagePredictor, *, pipeline_assembly: str | None = None, **kw) -> PlanCalibration:
    """Fit a PlanCalibration on measured plans (None entries: OOM / not measured, skipped); keywords as
    fit_from_estimates (time_ridge, mem_ridge, guard, per_tp, per_transfer, per_layer). pipeline_assembly: the estimates' and
    so the fit's 1F1B assembly (SearchSpace.pipeline_assembly); None: the predictor's."""
    if not (len(plans) == len(iteration_time_ms_measured) == len(peak_mem_mib_measured)):
        raise InputError("fit_plan_calibration: plans, iteration times and peaks must have one entry per plan")
    if not plans:
        return PlanCalibration()
    rule = assembly_of(predictor, pipeline_assembly).pipeline_assembly
    est = estimate_plans(plans, cluster, model, predictor, reserve_gib=0.0, pipeline_assembly=rule)
    return fit_from_estimates(est, iteration_time_ms_measured, peak_mem_mib_measured, pipeline_assembly=rule, **kw)


def fit_from_estimates(est: list[PlanMetrics], iteration_time_ms_measured: Sequence[float | None],
                       peak_mem_mib_measured: Sequence[Sequence[float] | None] | None = None, *,
                       time_ridge: float = TIME_RIDGE, mem_ridge: float = MEM_RIDGE, guard: bool = True,
                       per_tp: bool = False, per_transfer: bool = True, per_layer: bool = PER_LAYER_DEFAULT,
                       residual: bool = True,
                       groups: Sequence[str] | None = None,
                       pipeline_assembly: str = DEFAULT_PIPELINE_ASSEMBLY) -> PlanCalibration:
    """A PlanCalibration from the uncalibrated estimates of the measured plans (`estimate_plans` with the base
    predictor, reserve 0); the plans may come from several models, each estimated by its own predictor, as
    long as they share GPU types (bench/vtrain_calibration.py: one A100 calibration from seven models).
    With `guard`, the time part and the memory part are each kept only when their cross-validated error
    beats the uncalibrated error (Guard); without, the fit is taken as it is. `per_tp`: also fit a stage-time
    multiplier b_tp per tensor-parallel degree (the tp all-reduces inside every stage, Shoeybi et al. 2019 §3,
    and the per-rank GEMM sizes change with tp, so the profile environment can be off by degree).
    `per_transfer=False` keeps d at 0 (the assembly's p2p as the paper counts it, only scaled by c).
    `residual`: then fit a plan residual on T' (memx.learn.residual; from MIN_RESIDUAL_PLANS timed plans on,
    with the guard kept only when its held-out error beats T' by 10 %), cross-validated by `groups` (one label
    per estimate, e.g. the model) when given. Each plan is assembled as its estimate was (PlanMetrics.loop_p2p_ms);
    `pipeline_assembly` names that assembly on the result."""
    peak_mem_mib_measured = [None] * len(est) if peak_mem_mib_measured is None else peak_mem_mib_measured
    if not (len(est) == len(iteration_time_ms_measured) == len(peak_mem_mib_measured)):
        raise InputError("fit_from_estimates: estimates, iteration times and peaks must have one entry per plan")
    timed = [i for i, y in enumerate(iteration_time_ms_measured) if _finite_positive(y)]
    with_peaks = [i for i, y in enumerate(peak_mem_mib_measured) if y is not None and len(y) > 0]
    t_est, t_y = [est[i] for i in timed], np.asarray([iteration_time_ms_measured[i] for i in timed], float)
    m_est, m_y = [est[i] for i in with_peaks], [np.asarray(peak_mem_mib_measured[i], float) for i in with_peaks]
    time_fit = fit_time(t_est, t_y, time_ridge, per_tp, per_transfer, per_layer)
    mem_fit = fit_memory(m_est, m_y, mem_ridge)
    n_t, n_m, t_guard, m_guard = len(timed), len(with_peaks), None, None
    if guard:
        # a part with no measurement has nothing to guard (its summary then says "not calibrated")
        t_guard = _guard(t_est, t_y, lambda e, y: fit_time(e, y, time_ridge, per_tp, per_transfer, per_layer), time_errors) if n_t else None
        m_guard = _guard(m_est, m_y, lambda e, y: fit_memory(e, y, mem_ridge), mem_errors) if n_m else None
        if t_guard is not None and not t_guard.accepted:
            time_fit, n_t = {}, 0
        if m_guard is not None and not m_guard.accepted:
            mem_fit, n_m = {}, 0
    kept, r_guard = None, None
    if residual and timed:
        stages, T = time_parts(time_fit, t_est)
        fitted = fit_residual([e.plan for e in t_est], stages, T, t_y,
                              groups=None if groups is None else [str(groups[i]) for i in timed])
        if fitted is not None:
            r, r_guard = fitted
            kept = r if r_guard.accepted or not guard else None
    return PlanCalibration(**time_fit, **mem_fit, plans_timed=n_t, plans_with_peaks=n_m, time_guard=t_guard,
                           mem_guard=m_guard, residual=kept, residual_guard=r_guard, pipeline_assembly=pipeline_assembly)


def fit_from_config_runs(runs: pd.DataFrame, cluster: Cluster, model: ModelArch, predictor: StagePredictor,
                         **kw) -> PlanCalibration:
    """fit_plan_calibration on a config_runs frame (docs/architecture.md §Measurement records). Rows with
    schema-2 plans (replica groups) are not used: the calibrated terms are one pipeline's 1F1B assembly, and a
    grouped plan's time also holds the cross-group exchange (memx.planner.replicas), which nothing here fits.
    NothingUsable (exit 5) when no schema-1 row is left."""
    require_config_runs(runs)
    parsed = [simplest(any_plan_from_dict(p if isinstance(p, dict) else json_document(str(p), f"config_runs row {i}: field 'plan'"),
                                          source=f"config_runs row {i}: field 'plan'"))  # one group = schema 1
              for i, p in enumerate(runs["plan"])]
    keep = np.asarray([isinstance(p, Plan) for p in parsed], dtype=bool)
    if not keep.any():
        raise NothingUsable("config_runs for the plan calibration (it fits one pipeline's assembly)",
                            {"schema-2 plan (replica groups)": len(parsed)})
    plans, runs = [p for p, k in zip(parsed, keep) if k], runs.loc[keep]
    oom = runs["oom"].astype(bool).to_numpy()
    times = [None if o or not _finite_positive(t) else float(t) for o, t in zip(oom, runs["iteration_time_ms"])]
    peaks = [None if o else peak_list(p, f"config_runs row {i}") for i, (o, p) in enumerate(zip(oom, runs["peak_mem_mib"]))]
    return fit_plan_calibration(plans, times, peaks, cluster, model, predictor, **kw)


CONFIG_RUNS_COLUMNS = ("plan", "iteration_time_ms", "peak_mem_mib", "oom")


def require_config_runs(runs: pd.DataFrame, source: str = "config_runs",
                        required: tuple[str, ...] = CONFIG_RUNS_COLUMNS) -> pd.DataFrame:
    """`runs` when it has the `required` config_runs columns (by default what a calibration reads); else
    InputError naming the missing ones."""
    missing = [c for c in required if c not in runs.columns]
    if missing:
        raise InputError(f"{source}: missing column(s) {', '.join(missing)}; config_runs needs {', '.join(required)} "
                         "(docs/architecture.md §Measurement records)")
    return runs


def peak_list(v, where: str) -> list[float] | None:
    """A config_runs `peak_mem_mib` cell as a list of numbers (MiB per GPU), None when empty (an OOM row):
    a list, or a JSON string as a CSV cell holds it; InputError naming `where` and the field on anything else."""
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return None
    try:
        peaks = [float(x) for x in (json.loads(v) if isinstance(v, str) else list(v))]
    except (ValueError, TypeError, RecursionError) as exc:
        raise InputError(f"{where} field 'peak_mem_mib' is not a list of numbers (MiB per GPU, e.g. [5579.2, "
                         f"7020.1]): {str(v)[:60]!r} ({exc.__class__.__name__})") from None
    bad = [x for x in peaks if not (0.0 < x <= MAX_GPU_MEMORY_MIB)]  # NaN fails both comparisons
    if not peaks:
        raise InputError(f"{where} field 'peak_mem_mib' is an empty list; one peak (MiB) per GPU of the plan")
    if bad:
        raise InputError(f"{where} field 'peak_mem_mib' holds {bad[0]!r}; each GPU's peak must be a finite number "
                         f"of MiB in (0, {MAX_GPU_MEMORY_MIB:,.0f}]")
    return peaks


def _finite_positive(y) -> bool:
    return y is not None and bool(np.isfinite(y)) and float(y) > 0.0


def calibrated_times(est: list[PlanMetrics], calibration: PlanCalibration) -> np.ndarray:
    """The calibrated iteration times of plans from their uncalibrated estimates (equal to estimate_plans
    through `calibration.wrap(predictor)`, the plan residual included; for plans of several models, each
    estimated by its own predictor)."""
    stages, T = time_parts({k: getattr(calibration, k) for k in TIME_KEYS}, est)
    if calibration.residual is None:
        return T
    return T * calibration.residual.factors([e.plan for e in est], stages, T)


def _guard(est: list[PlanMetrics], y, fit, errors) -> Guard:
    """Cross-validation by plan (leave-one-out up to MAX_LOO plans, else FOLDS-fold, folds by position
    after a fixed shuffle): each fold's plans scored by a fit on the others (Stone 1974, "Cross-validatory
    choice and assessment of statistical predictions"); the uncalibrated error on the same plans."""
    n = len(est)
    base = errors({}, est, y)
    base_mape = float(np.mean(base)) if base.size else 0.0
    if n < MIN_GUARD_PLANS:
        return Guard(base_mape=base_mape, cv_mape=float("inf"), folds=0)
    folds = n if n <= MAX_LOO else FOLDS
    order = np.random.default_rng(0).permutation(n)
    held = []
    for f in range(folds):
        test = set(order[f::folds].tolist())
        train = [i for i in range(n) if i not in test]
        sub = sorted(test)
        held.append(errors(fit([est[i] for i in train], _take(y, train)), [est[i] for i in sub], _take(y, sub)))
    return Guard(base_mape=base_mape, cv_mape=float(np.mean(np.concatenate(held))), folds=folds)


def _take(y, rows: list[int]):
    return y[rows] if isinstance(y, np.ndarray) else [y[i] for i in rows]
