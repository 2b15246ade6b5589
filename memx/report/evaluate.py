"""Predicted vs measured whole plans (config_runs): MAPE, Spearman, top-1 under T and Φ, OOM accuracy.

Errors are fractions (0.08 = 8 %). Per plan the prediction is memx.planner.replicas.estimate_any_plans — for
schema-1 plans memx.planner.estimate.estimate_plans, the same signatures, stage predictor and 1F1B assembly
the search uses; for schema-2 plans (issue #15) each group so, plus the cross-group term. A config_runs file
may mix both schemas. Baselines on the same plans:
- ``analytic``: the closed-form stage model (memx.planner.cost) in the same assembly;
- ``time_only_uniform``: what AMP/Metis-style planners optimise — the analytic model with one uniform
  recompute level per plan (the most memory-saving level any of its stages uses; per group in a schema-2
  plan, each group being its own job) and ranking by
  predicted time alone, also under Φ (it has no memory objective).
Φ of measured plans uses medians of the measured plans, Φ of predicted plans medians of the predictions
(paper §3.1.2: each term divided by its median over feasible candidates).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from memx.domain.errors import InputError
from memx.domain.groups import (AnyPlan, GroupedPlan, any_plan_from_dict, any_plan_from_json, group_plans,
                                validate_any_plan)
from memx.domain.specs import Cluster, ModelArch, Weights
from memx.learn.calibration import CONFIG_RUNS_COLUMNS, peak_list, require_config_runs
from memx.planner.baselines import uniform_view
from memx.planner.cost import AnalyticStageModel
from memx.planner.metrics import PlanMetrics
from memx.planner.objective import EPSILON_MIB2, auto_profile, parse_weights, phi
from memx.planner.replicas import estimate_any_plans
from memx.planner.signatures import StagePredictor

KEYS = ("n", "time_mape", "time_max_ape", "mem_mape", "spearman_time", "spearman_phi", "top1_time", "top1_phi",
        "oom_accuracy")


def read_config_runs(path: str | Path, required: tuple[str, ...] = CONFIG_RUNS_COLUMNS) -> pd.DataFrame:
    """config_runs from Parquet, JSONL (`.json` also as one JSON array) or CSV (plan as a JSON string or an
    object) with the `required` columns — the one reader of `--measured` files; InputError names the problem."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"--measured {path}: no such file")
    try:
        df = _read_table(path)
    except Exception as exc:  # pyarrow / json / csv parser errors: bad input, not a crash
        raise InputError(f"{path}: not readable as Parquet, JSONL or CSV ({exc.__class__.__name__}: {exc})") from exc
    return _peak_lists(require_config_runs(df, str(path), required), path)


def _peak_lists(df: pd.DataFrame, path: Path) -> pd.DataFrame:
    """peak_mem_mib as one list of numbers (MiB per GPU) or None per row (calibration.peak_list: a CSV cell
    holds it as a JSON string, an empty cell is NaN)."""
    if "peak_mem_mib" not in df.columns:
        return df
    return df.assign(peak_mem_mib=[peak_list(v, f"{path}: row {i}") for i, v in enumerate(df["peak_mem_mib"])])


def _read_table(path: Path) -> pd.DataFrame:
    if path.suffix == ".csv":
        return pd.read_csv(path)
    if path.suffix in (".jsonl", ".ndjson"):
        return pd.read_json(path, lines=True)
    if path.suffix == ".json":
        try:
            return pd.read_json(path, lines=True)
        except ValueError:
            return pd.read_json(path)  # one JSON array of rows
    return pd.read_parquet(path)


def _plans(df: pd.DataFrame, cluster: Cluster, model: ModelArch) -> list[AnyPlan]:
    """Every row's plan, schema 1 or 2 (docs/architecture.md §Plan JSON), validated against the specs."""
    plans = []
    for i, raw in enumerate(df["plan"]):
        src = f"config_runs row {i}: field 'plan'"
        plan = any_plan_from_dict(raw, source=src) if isinstance(raw, dict) else any_plan_from_json(str(raw), source=src)
        validate_any_plan(plan, cluster, model, source=src)
        plans.append(plan)
    return plans


def _uniform(plan: AnyPlan) -> AnyPlan:
    """uniform_view of a plan of either schema (schema 2: group by group)."""
    if not isinstance(plan, GroupedPlan):
        return uniform_view(plan)
    groups = tuple(dataclasses.replace(g, stages=uniform_view(gp).stages) for g, gp in zip(plan.groups, group_plans(plan)))
    return dataclasses.replace(plan, groups=groups)


def _phi(t, m, v, w: Weights) -> np.ndarray:
    refs = (float(np.median(t)), float(np.median(m)), float(np.median(v)))
    return np.asarray(phi(t, m, v, refs=refs, weights=w, epsilon_mib2=EPSILON_MIB2))


def _spearman(a, b) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic) if len(a) > 2 else float("nan")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Measured:
    time_ms: np.ndarray  # non-OOM plans
    peaks: list[np.ndarray]
    oom: np.ndarray  # all plans
    ok: np.ndarray  # index of non-OOM plans with a time


def _measured(df: pd.DataFrame) -> Measured:
    oom = df["oom"].to_numpy(dtype=bool)
    t = pd.to_numeric(df["iteration_time_ms"], errors="coerce").to_numpy(np.float64)
    ok = np.flatnonzero(~oom & np.isfinite(t))
    peaks = [np.asarray(df["peak_mem_mib"].iloc[i], dtype=np.float64) for i in ok]
    return Measured(time_ms=t[ok], peaks=peaks, oom=oom, ok=ok)


# A measured time or peak this many times below the prediction is another unit (s for ms: 1,000×; GiB for
# MiB: 1,024×), not a prediction error: the closed form's documented 90 % band is -40 %/+60 %
# (memx.learn.intervals.CLOSED_FORM_BANDS), a learned predictor's is narrower.
UNIT_RATIO = 20.0


def check_measured(meas: Measured, est: list[PlanMetrics]) -> None:
    """Measured values the metrics can use: times > 0, one peak per GPU of the plan, and values in the units
    the columns name (ms, MiB) — InputError naming the row and field otherwise."""
    for i, t in zip(meas.ok, meas.time_ms):
        if t <= 0:
            raise InputError(f"config_runs row {i}: field 'iteration_time_ms' is {float(t)!r}; a plan that ran took > 0 ms "
                             "(an empty cell or oom = true marks one that did not)")
    for i, p in zip(meas.ok, meas.peaks):
        want = len(est[i].peak_mem_mib)
        if p.shape != (want,):
            raise InputError(f"config_runs row {i}: field 'peak_mem_mib' has {p.size} value(s); the plan has {want} "
                             "GPUs (one peak per GPU, in the order memx simulate plan writes them)")
    ratio_t = float(np.median([est[i].iteration_time_ms for i in meas.ok] / meas.time_ms))
    ratio_m = float(np.median([est[i].max_mem_mib / p.max() for i, p in zip(meas.ok, meas.peaks)]))
    for field, ratio, unit, other in (("iteration_time_ms", ratio_t, "ms", "seconds"), ("peak_mem_mib", ratio_m, "MiB", "GiB")):
        if ratio > UNIT_RATIO:
            raise InputError(f"config_runs: field '{field}' is {ratio:,.0f}× below the predictions (median): the values "
                             f"look like {other}, not {unit}; convert them to {unit}")


def _metrics(est: list[PlanMetrics], meas: Measured, w: Weights, *, rank_by_time_only: bool = False) -> dict[str, Any]:
    e_ok = [est[i] for i in meas.ok]
    pt = np.array([e.iteration_time_ms for e in e_ok])
    mt = meas.time_ms
    ape = np.abs(pt - mt) / mt
    mem_ape = np.concatenate([np.abs(np.asarray(e.peak_mem_mib) - p) / p for e, p in zip(e_ok, meas.peaks)])
    m_max = np.array([p.max() for p in meas.peaks])
    m_var = np.array([p.var() for p in meas.peaks])
    phi_meas = _phi(mt, m_max, m_var, w)
    phi_pred = pt if rank_by_time_only else _phi(pt, np.array([e.max_mem_mib for e in e_ok]),
                                                  np.array([e.mem_variance_mib2 for e in e_ok]), w)
    feasible = np.array([e.feasible for e in est])
    return {
        "n": int(len(mt)), "time_mape": float(ape.mean()), "time_max_ape": float(ape.max()),
        "mem_mape": float(mem_ape.mean()), "spearman_time": _spearman(pt, mt), "spearman_phi": _spearman(phi_pred, phi_meas),
        "top1_time": int(np.argmin(pt) == np.argmin(mt)), "top1_phi": int(np.argmin(phi_pred) == np.argmin(phi_meas)),
        "oom_accuracy": float(np.mean(feasible == ~meas.oom)),
    }


def evaluate(cluster: Cluster, model: ModelArch, measured: pd.DataFrame, predictor: StagePredictor,
             weights: str | Weights | None = None, *, reserve_gib: float = 1.0,
             pipeline_assembly: str | None = None) -> dict[str, Any]:
    """Metrics of `predictor` and of the baselines on the measured plans (see module doc); pipeline_assembly: the
    search space's 1F1B assembly (SearchSpace.pipeline_assembly; None: the predictor's or the default)."""
    plans = _plans(measured, cluster, model)
    meas = _measured(measured)
    if len(meas.ok) < 2:
        raise InputError(f"config_runs: {len(meas.ok)} plan(s) with a measured time; need at least 2 to evaluate")
    est = estimate_any_plans(plans, cluster, model, predictor, reserve_gib=reserve_gib, pipeline_assembly=pipeline_assembly)
    check_measured(meas, est)
    w = weights if isinstance(weights, Weights) else parse_weights(weights or "auto")
    if w is None:  # auto: from the fastest predicted feasible plan's margin (paper §3.1.2)
        feas = [e for e in est if e.feasible] or est
        w = auto_profile(cluster, min(feas, key=lambda e: e.iteration_time_ms).min_margin)
    out = _metrics(est, meas, w)
    analytic = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})
    out["baselines"] = {
        "analytic": _metrics(estimate_any_plans(plans, cluster, model, analytic, reserve_gib=reserve_gib,
                                                pipeline_assembly=pipeline_assembly), meas, w),
        "time_only_uniform": _metrics(estimate_any_plans([_uniform(p) for p in plans], cluster, model, analytic,
                                                         reserve_gib=reserve_gib, pipeline_assembly=pipeline_assembly),
                                      meas, w, rank_by_time_only=True),
    }
    out["weights"] = {"profile": w.profile, "w_time": w.w_time, "w_mem": w.w_mem, "w_var": w.w_var}
    out["predictor"] = getattr(predictor, "name", type(predictor).__name__)
    out["memory_source"] = getattr(predictor, "memory_source", "closed-form" if isinstance(predictor, AnalyticStageModel)
                                   else "learned")
    sources = getattr(predictor, "sources", None)
    if callable(sources):  # per GPU type: measured / closed-form / unprofiled (memx.learn.model)
        out["sources"] = sources()
    return out


def format_table(result: dict[str, Any]) -> str:
    """A plain-text table: one column per method."""
    cols = {"predictor": result, **result.get("baselines", {})}
    lines = [f"{'metric':<14}" + "".join(f"{k:>20}" for k in cols)]
    for key in KEYS:
        vals = [c.get(key) for c in cols.values()]
        lines.append(f"{key:<14}" + "".join(f"{v:>20.4f}" if isinstance(v, float) else f"{v!s:>20}" for v in vals))
    return "\n".join(lines)


def _plain(obj: Any) -> Any:
    """JSON-ready values: NaN and infinities become null (a metric that could not be computed), numpy
    scalars plain numbers."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, (np.integer, np.bool_)):
        return obj.item()
    if isinstance(obj, (float, np.floating)):
        return float(obj) if np.isfinite(obj) else None
    return obj


def to_json(result: dict[str, Any]) -> str:
    """Strict JSON (allow_nan=False): never NaN, null where a metric is undefined."""
    return json.dumps(_plain(result), indent=2, sort_keys=False, allow_nan=False)
