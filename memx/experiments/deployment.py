"""Experiment 3 — deployment on v100-t4-6 with llama-6l and the safety profile (paper §4.4, Table 10,
Fig. 8).

Measured pool: plans drawn at random from the plan space plus every method's pick and MemX's top 10,
each run once on the virtual cluster. Measured Φ uses the safety weights with medians over the pool's
plans that ran. For each method: its pick's measured time, slowdown vs the fastest measured plan,
memory variance, Φ rank and time rank in the pool; and the rank correlation of time and Φ over the pool
(paper: pick 9.3 % slower, V 4.19e5 vs 9.13e5 MiB², Φ rank 1 vs 20, correlation 0.66).

Recompute cost in matched groups (paper Fig. 8): plans of the pool that ran without recompute, each
re-run with full-block (Megatron block method: the first ⌈n/2⌉ layers of every stage) and with
full-uniform (every layer) — same layout, split and micro batch. Median relative saving of the largest
per-GPU peak and median relative extra iteration time (paper: block 7.6 % for 8.5 %, uniform 13.9 % for
19.2 %).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pandas as pd

from memx.domain.catalog import load_cluster, load_model
from memx.experiments import figures
from memx.planner.baselines import methods
from memx.experiments.common import (
    Result, check_scale, describe, get_predictor, measure, measured_phi, predictor_kind, space, spearman, timer,
    write_tables,
)
from memx.domain.groups import any_plan_from_json as plan_from_json  # the AMP-/Metis-like picks may be schema 2
from memx.domain.groups import any_plan_to_json as plan_to_json
from memx.domain.groups import group_plans
from memx.domain.plan import Plan, Recompute
from memx.planner.objective import parse_weights
from memx.simulator import draw_plans

CLUSTER, MODEL, WEIGHTS = "v100-t4-6", "llama-6l", "safety"
POOL = {"small": 150, "full": 600}
GROUPS = {"small": 8, "full": 24}
PAPER = {"slowdown": 0.093, "var_pick": 4.19e5, "var_fastest": 9.13e5, "rank_corr": 0.66,
         "block": (0.076, 0.085), "uniform": (0.139, 0.192)}


def picks(cl, mo, sp, pred, weights: str = WEIGHTS) -> dict:
    return {name: p.plan(cl, mo, sp, pred) for name, p in methods(weights, with_profiles=True).items()}


def _recompute(plan, how: str):
    def stage(s):
        if how == "block":
            n = math.ceil(s.layers / 2)
            return dataclasses.replace(s, recompute=Recompute.FULL, recompute_layers=None if n >= s.layers else n)
        return dataclasses.replace(s, recompute=Recompute.FULL, recompute_layers=None)

    return dataclasses.replace(plan, stages=tuple(stage(s) for s in plan.stages))


def matched_groups(pool: pd.DataFrame, cl, mo, n_groups: int, seed: int) -> pd.DataFrame:
    base = [q for p, ok in zip(pool["plan"], ~pool["oom"]) if ok and isinstance(q := plan_from_json(p), Plan)]
    base = [p for p in base if all(s.recompute == Recompute.NONE for s in p.stages)][:n_groups]
    rows = []
    if not base:
        return pd.DataFrame(columns=["group", "variant", "time_cost", "memory_saving"])
    none = measure(base, cl, mo, seed=seed)
    for how in ("block", "uniform"):
        var = measure([_recompute(p, how) for p in base], cl, mo, seed=seed)
        for g, (a, b) in enumerate(zip(none.itertuples(), var.itertuples())):
            rows.append({"group": g, "variant": f"full-{how}", "plan": describe(base[g]),
                         "time_cost": b.time_ms / a.time_ms - 1, "memory_saving": 1 - b.M / a.M})
    return pd.DataFrame(rows)


def run(out: Path, *, scale: str = "small", seed: int = 0, predictor: str | None = None) -> Result:
    check_scale(scale)
    elapsed, res = timer(), Result(name="deployment")
    kind = predictor_kind(scale, predictor)
    cl, mo, sp = load_cluster(CLUSTER), load_model(MODEL), space("default")
    pred = get_predictor(cl, mo, sp, kind, seed)
    chosen = picks(cl, mo, sp, pred)
    plans = draw_plans(cl, mo, sp, n=POOL[scale], seed=seed + 11)
    extra = [p.plan for p in chosen.values() if p.plan is not None] + [c.plan for c in chosen["ours"].candidates[:10]]
    seen = {plan_to_json(p) for p in plans}
    for p in extra:
        if plan_to_json(p) not in seen:
            seen.add(plan_to_json(p))
            plans.append(p)
    pool = measure(plans, cl, mo, seed=seed + 1)
    ok = pool[~pool["oom"]].reset_index(drop=True)
    w = parse_weights(WEIGHTS)
    ok["phi"] = measured_phi(ok["time_ms"], ok["M"], ok["V"], w)
    ok["time_rank"] = ok["time_ms"].rank(method="min").astype(int)
    ok["phi_rank"] = ok["phi"].rank(method="min").astype(int)
    by_plan = {p: i for i, p in enumerate(ok["plan"])}
    fastest = ok.loc[ok["time_ms"].idxmin()]
    rows = []
    for name, pk in chosen.items():
        key = plan_to_json(pk.plan) if pk.plan is not None else None
        i = by_plan.get(key)
        row = {"method": name, "plan": describe(pk.plan), "predicted_ms": pk.predicted_time_ms,
               "oom": key is not None and i is None}
        if i is not None:
            r = ok.loc[i]
            row.update(measured_ms=r.time_ms, slowdown=r.time_ms / fastest.time_ms - 1, variance_mib2=r.V,
                       max_gib=r.M / 1024, margin=r.margin, phi_rank=int(r.phi_rank), time_rank=int(r.time_rank))
        rows.append(row)
    res.tables["picks"] = pd.DataFrame(rows)
    groups = matched_groups(pool, cl, mo, GROUPS[scale], seed + 3)
    res.tables["recompute_groups"] = (groups.groupby("variant")[["time_cost", "memory_saving"]].median()
                                      .reset_index().assign(groups=groups.groupby("variant").size().values)
                                      if len(groups) else groups)
    rho = spearman(ok["time_rank"], ok["phi_rank"])
    best_phi = ok.loc[ok["phi"].idxmin()]
    res.summary = {"pool": len(pool), "ran": len(ok), "oom": int(pool["oom"].sum()), "rank_corr": rho,
                   "fastest_ms": float(fastest.time_ms), "fastest_variance": float(fastest.V),
                   "fastest_phi_rank": int(fastest.phi_rank), "best_phi_plan": describe(plan_from_json(best_phi.plan)),
                   "predictor": kind, "paper": PAPER}
    res.tables["pool"] = pd.DataFrame([{"plans": len(pool), "ran": len(ok), "oom": int(pool["oom"].sum()),
                                        "fastest_ms": fastest.time_ms, "fastest_plan": describe(plan_from_json(fastest.plan)),
                                        "fastest_variance_mib2": fastest.V, "fastest_phi_rank": int(fastest.phi_rank),
                                        "spearman_time_rank_vs_phi_rank": rho}])
    # figures: per-GPU memory of the fastest measured plan vs the Φ pick; T–V Pareto with picks
    pick = chosen["ours"].plan
    if pick is not None and plan_to_json(pick) in by_plan:
        pr = ok.loc[by_plan[plan_to_json(pick)]]
        fp = plan_from_json(fastest.plan)
        gpus = [f"{st.gpu}#{k}" for g in group_plans(fp) for _ in range(g.dp) for st in g.stages for k in range(st.tp)]
        res.files.append(figures.memory_bars(gpus, {"fastest measured": fastest.peaks, "MemX Φ pick (safety)": pr.peaks},
                                             pr.capacity, out / "deployment-memory-bars.png"))
    pts = {}
    for name in ("amp", "metis", "hexiscale", "fasop", "ours", "ours-uniform"):
        pk = chosen[name].plan
        if pk is not None and plan_to_json(pk) in by_plan:
            r = ok.loc[by_plan[plan_to_json(pk)]]
            pts[name] = (r.time_ms, r.V)
    res.files.append(figures.pareto_tv(ok["time_ms"].to_numpy(), ok["V"].to_numpy(), pts, out / "deployment-pareto.png"))
    res.seconds = elapsed()
    notes = (f"Scale `{scale}`, {CLUSTER} + {MODEL}, search `default` (max_time_ratio 1.25), Φ profile `{WEIGHTS}`, "
             f"predictor `{kind}`, seed {seed}. Ranks are among the {len(ok)} pool plans that ran (1 = best). "
             "`oom` = the pick ran out of memory on the virtual cluster.")
    write_tables(res, out, "Experiment 3 — deployment (v100-t4-6, llama-6l, safety profile)", notes)
    return res
