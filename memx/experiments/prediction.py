"""Experiment 1 — prediction and ranking (paper Tables 5–8) on three-vendor-20.

Plans are drawn at random from the plan space (memx.simulator.sample_plans, a seed the profiler never
used) and run once on the virtual cluster. Every method predicts every plan with the same stage
predictor, through its own view of the plan (a method without a recompute model predicts it without
recompute) and its own memory estimate; we report time MAPE and max error, memory MAPE per GPU,
Spearman and top-1 under the time ranking and under Φ (default profile, as the paper's ranking
experiments), and how often its fits-or-not flag agrees with the measured OOM.

Top-1: the method's first choice among the plans it believes fit (a planner never picks a plan its
own model rejects) is the measured best. Time-only methods rank by predicted time also under Φ.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from memx.planner.cost import AnalyticStageModel
from memx.planner.baselines import methods, ours
from memx.domain.catalog import load_cluster, load_model
from memx.report.evaluate import _plans
from memx.experiments import figures
from memx.experiments.common import (
    Result, check_scale, get_predictor, measured_phi, predictor_kind, space, spearman, timer, write_tables,
)
from memx.planner.objective import parse_weights
from memx.simulator import sample_plans

SCENARIOS = {"small": [("three-vendor-20", "llama2-7b", "small", 150)],
             "full": [("three-vendor-20", m, "default", 900) for m in ("llama2-7b", "llama2-13b", "llama3-8b")]}


def metrics(est, measured: pd.DataFrame, w) -> dict:
    """Metrics of one method's estimates (list of MethodEstimate, one per row of `measured`)."""
    oom = measured["oom"].to_numpy(bool)
    t = pd.to_numeric(measured["iteration_time_ms"], errors="coerce").to_numpy(float)
    ok = np.flatnonzero(~oom & np.isfinite(t))
    mt = t[ok]
    pt = np.array([est[i].time_ms for i in ok])
    ape = np.abs(pt - mt) / mt
    peaks = [np.asarray(measured["peak_mem_mib"].iloc[i], float) for i in ok]
    has_mem = est[0].peak_mem_mib is not None
    mem_ape = (np.concatenate([np.abs(np.asarray(est[i].peak_mem_mib) - p) / p for i, p in zip(ok, peaks)])
               if has_mem else np.array([np.nan]))
    phi_meas = measured_phi(mt, [p.max() for p in peaks], [p.var() for p in peaks], w)
    feas = np.array([est[i].feasible for i in ok])
    key_t = np.where(feas, np.log(pt), np.inf)
    key_phi = np.where(feas, [est[i].score for i in ok], np.inf)
    rank_phi = np.where(feas, [est[i].score for i in ok], 1e6 + np.array([est[i].score for i in ok]))
    all_feas = np.array([e.feasible for e in est])
    return {
        "plans": int(len(ok)), "time_mape": float(ape.mean()), "time_max_ape": float(ape.max()),
        "mem_mape": float(mem_ape.mean()), "spearman_time": spearman(pt, mt), "spearman_phi": spearman(rank_phi, phi_meas),
        "top1_time": int(np.isfinite(key_t).any() and np.argmin(key_t) == np.argmin(mt)),
        "top1_phi": int(np.isfinite(key_phi).any() and np.argmin(key_phi) == np.argmin(phi_meas)),
        "oom_agreement": float(np.mean(all_feas == ~oom)) if has_mem else np.nan,
        "oom_caught": float(np.mean(~all_feas[oom])) if has_mem and oom.any() else np.nan,
    }


def run(out: Path, *, scale: str = "small", seed: int = 0, predictor: str | None = None) -> Result:
    check_scale(scale)
    elapsed, res = timer(), Result(name="prediction")
    kind = predictor_kind(scale, predictor)
    w = parse_weights("default")
    rows, scatter = [], {}
    for cl_name, mo_name, sp_name, n in SCENARIOS[scale]:
        cl, mo, sp = load_cluster(cl_name), load_model(mo_name), space(sp_name)
        pred = get_predictor(cl, mo, sp, kind, seed)
        measured = sample_plans(cl, mo, sp, n=n, seed=seed + 2024)
        plans = _plans(measured, cl, mo)
        planners = {**methods("default"),
                    "ours-analytic": ours("default", name="ours-analytic")}
        for name, planner in planners.items():
            p = AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types}) if name == "ours-analytic" else pred
            est = planner.estimate(plans, cl, mo, p, reserve_gib=sp.reserve_gib, weights=w)
            m = metrics(est, measured, w)
            rows.append({"model": mo_name, "method": name, **m})
            if mo_name == SCENARIOS[scale][0][1] and name in ("ours", "amp", "fasop"):
                ok = ~measured["oom"].to_numpy(bool)
                scatter[name] = (np.array([e.time_ms for e, o in zip(est, ok) if o]),
                                 measured["iteration_time_ms"].to_numpy(float)[ok])
        res.summary[mo_name] = {"sampled": len(measured), "oom": int(measured["oom"].sum()), "predictor": kind}
    res.tables["metrics"] = pd.DataFrame(rows)
    res.files.append(figures.predicted_vs_measured(scatter, out / "prediction-scatter.png"))
    res.seconds = elapsed()
    notes = (f"Scale `{scale}`, predictor `{kind}`, seed {seed}. Plans drawn by `sample_plans` (seed {seed + 2024}); "
             "errors are fractions; `—` = the method has no memory model. Φ uses the default profile (0.4, 0.2, 0.4). "
             "`ours-analytic` = MemX with the closed-form stage model instead of the learned one.")
    write_tables(res, out, "Experiment 1 — prediction and ranking (three-vendor-20)", notes)
    return res
