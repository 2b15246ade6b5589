"""Experiment 6 — what the paper argues but never tests: does balanced memory buy robustness?

For each method's pick, on the virtual cluster:
* nominal run (does it fit at all);
* activation headroom: the largest uniform inflation of activation memory every GPU survives,
  computed from the simulator's own stage costs (peak = context + (static + inflight·act·(1+j) +
  workspace)·(1 + fragmentation), memx.simulator.stage_cost);
* a +10 % activation spike on every GPU (OOM or not);
* a long run: `ITERATIONS` iterations, each GPU's activations × (1 + |N(0, σ)|) per iteration
  (σ = `JITTER`), counting the iterations that would run out of memory;
* changed afterwards: micro batch ×2 (global batch kept; skipped when it does not divide) and
  sequence length ×2, each re-run (OOM or not).
Counted per method over all scenarios.

Full scale runs 9 planners per scenario, every one over the whole `default` space (the exact
branch-and-bound search, issue #13; the space was bounded to max_pp 4 and micro batch 1–2 before).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd

from memx.domain.catalog import load_cluster, load_model
from memx.experiments.common import (
    Result, check_scale, describe, get_predictor, predictor_kind, space, timer, write_tables,
)
from memx.experiments.deployment import picks
from memx.simulator import load_traits, simulate_plan, stage_cost, stage_signatures

SPIKE, JITTER, ITERATIONS = 0.10, 0.05, 1000
SCENARIOS = {  # (cluster, model, search space, weights)
    "small": [("v100-t4-6", "llama-6l", "default", "safety"), ("three-vendor-20", "llama2-7b", "small", "default")],
    "full": [("v100-t4-6", "llama-6l", "default", "safety"),
             ("three-vendor-20", "llama2-7b", "default", "default"),
             ("three-vendor-20", "llama3-8b", "default", "default"),
             ("h100-h20-16", "llama2-13b", "default", "auto")],
}


def headroom(plan, cluster, model) -> float:
    """Largest j such that every stage fits with activations × (1 + j) (can be negative: OOM already)."""
    worst = np.inf
    for sig in stage_signatures(plan, model):
        c = stage_cost(sig, cluster.gpu(sig.gpu), load_traits(sig.gpu))
        act = sig.inflight * c.act_mem_mib
        room = (c.capacity_mib - c.context_mem_mib) / (1 + c.fragmentation_fraction) - c.static_mem_mib - c.workspace_mem_mib
        worst = min(worst, room / act - 1 if act > 0 else np.inf)
    return float(worst)


def _oom(plan, cluster, model, seed) -> bool | None:
    try:
        return simulate_plan(plan, cluster, model, seed=seed).oom
    except Exception:  # an invalid variant (e.g. global batch no longer divisible): not applicable
        return None


def run(out: Path, *, scale: str = "small", seed: int = 0, predictor: str | None = None) -> Result:
    check_scale(scale)
    elapsed, res = timer(), Result(name="robustness")
    kind = predictor_kind(scale, predictor)
    rng = np.random.default_rng(seed)
    rows, timing = [], []
    for cl_name, mo_name, sp_name, weights in SCENARIOS[scale]:
        cl, mo, sp = load_cluster(cl_name), load_model(mo_name), space(sp_name)
        pred = get_predictor(cl, mo, sp, kind, seed)
        t0, n0 = elapsed(), len(rows)
        for name, pk in picks(cl, mo, sp, pred, weights).items():
            row = {"scenario": f"{cl_name}/{mo_name}", "method": name,
                   "plan": describe(pk.plan)}
            if pk.plan is None:
                rows.append({**row, "note": pk.note[:60]})
                continue
            p = pk.plan
            run0 = simulate_plan(p, cl, mo, seed=seed)
            j = headroom(p, cl, mo)
            draws = np.abs(rng.normal(0.0, JITTER, ITERATIONS))
            mb2 = dataclasses.replace(p, micro_batch=2 * p.micro_batch)
            seq2 = dataclasses.replace(p, seq_len=2 * p.seq_len)
            rows.append({**row, "time_ms": run0.iteration_time_ms, "oom": run0.oom, "headroom": j,
                         "oom_spike_10pct": bool(j < SPIKE), "jitter_oom_iters": int((draws > j).sum()),
                         "oom_mb_x2": _oom(mb2, cl, mo, seed), "oom_seq_x2": _oom(seq2, cl, mo, seed)})
        timing.append({"scenario": f"{cl_name}/{mo_name}", "space": sp_name,
                       "weights": weights, "planners": len(rows) - n0, "seconds": elapsed() - t0})
    df = pd.DataFrame(rows)
    res.tables["picks"] = df
    agg = []
    for name, g in df.groupby("method", sort=False):
        def count(col):
            return int(g[col].fillna(False).astype(bool).sum()) if col in g else 0

        agg.append({"method": name, "scenarios": len(g), "no_plan": int(g["time_ms"].isna().sum() - count("oom")),
                    "oom_nominal": count("oom"), "oom_spike_10pct": count("oom_spike_10pct"),
                    "runs_hit_by_jitter": int((g["jitter_oom_iters"].fillna(0) > 0).sum()),
                    "oom_mb_x2": count("oom_mb_x2"), "oom_seq_x2": count("oom_seq_x2"),
                    "median_headroom": float(g["headroom"].median())})
    res.tables["oom_counts"] = pd.DataFrame(agg)
    res.tables["scenarios"] = pd.DataFrame(timing)  # seconds: searches + simulations, training excluded
    res.summary = {"predictor": kind, "spike": SPIKE, "jitter_sigma": JITTER, "iterations": ITERATIONS}
    res.seconds = elapsed()
    notes = (f"Scale `{scale}`, predictor `{kind}`, seed {seed}. `headroom` = largest activation inflation the pick "
             f"survives on every GPU (0.25 = +25 %; negative = OOM nominally). Spike = +{SPIKE:.0%} activations on every "
             f"GPU; jitter = {ITERATIONS} iterations with activations × (1 + |N(0, {JITTER})|) per iteration "
             "(`jitter_oom_iters` = iterations that would OOM). `—` in mb/seq ×2 = variant not valid for the plan.")
    write_tables(res, out, "Experiment 6 — robustness of each method's pick", notes)
    return res


RULE_SCENARIOS = [("v100-t4-6", "llama-6l"), ("three-vendor-20", "llama2-7b"), ("h100-h20-16", "llama2-13b"),
                  ("h100-mi300x-32", "llama2-70b"), ("a100-v100-16", "llama2-7b")]  # the last two: mixed capacities
# rule → the max_time_ratio it searches with (the safe sets the floor rules pick from do not depend on it)
RULES = {"phi": 0.0, "phi-bounded": 1.25, "fastest-above-floor": 0.0, "balanced-phi": 1.25, "balanced-margin": 1.25,
         "balanced-front": 1.25}


def _measured_balance(run, m, r) -> dict:
    """Measured smallest margin, memory std-dev (GiB), recomputed layers and Φ (measured T, M, V against the
    search's medians and weights; paper §3.1.2) of one simulated pick."""
    from memx.planner.objective import phi  # the score's one definition

    demand = np.asarray(run.demand_mem_mib, dtype=float)
    cap = np.asarray([c for _ in range(m.plan.dp) for c, st in zip(m.capacity_mib, m.plan.stages)
                      for _ in range(st.tp)], dtype=float)
    recomputed = sum(st.recomputed_layers for st in m.plan.stages)
    t = run.iteration_time_ms if run.iteration_time_ms is not None else np.nan
    return {"meas_margin": float(np.min((cap - demand) / cap)), "meas_std_gib": float(demand.std() / 1024),
            "recomputed_layers": int(recomputed),
            "meas_phi": float(phi(t, demand.max(), demand.var(), refs=r.refs, weights=r.weights,
                                  epsilon_mib2=r.epsilon_mib2))}


def compare_pick_rules(out: Path, *, seeds: tuple[int, ...] = (0, 1, 2), predictor: str = "analytic",
                       scenarios=RULE_SCENARIOS, weights: str = "auto") -> pd.DataFrame:
    """The three pick rules (memx.planner.pick) on the unbounded `default` space: each pick run on the
    virtual cluster (seeded) nominally, under a +10 % activation spike, micro batch ×2 and sequence ×2.
    `time_cost` = measured time / measured time of the fastest predicted plan that clears the margin floor
    (the `fastest-above-floor` pick) − 1 (docs/results.md §Choosing the pick rule)."""
    from memx.planner.search import search  # experiments run searches; kept local to the comparison

    rows = []
    for cl_name, mo_name in scenarios:
        cl, mo = load_cluster(cl_name), load_model(mo_name)
        for seed in seeds:
            sp0 = space("default")
            pred = get_predictor(cl, mo, sp0, predictor, seed)
            picks_, results = {}, {}
            for rule, ratio in RULES.items():
                sp = dataclasses.replace(sp0, pick_rule=rule, max_time_ratio=ratio)
                results[rule] = search(cl, mo, sp, pred, weights=weights, top_k=10)
                picks_[rule] = results[rule].chosen
            ref = simulate_plan(picks_["fastest-above-floor"].plan, cl, mo, seed=seed).iteration_time_ms
            for rule, m in picks_.items():
                p = m.plan
                run0 = simulate_plan(p, cl, mo, seed=seed)
                j = headroom(p, cl, mo)
                rows.append({"scenario": f"{cl_name}/{mo_name}", "seed": seed, "rule": rule, "plan": describe(p),
                             "pred_ms": m.iteration_time_ms, "pred_margin": m.min_margin,
                             "time_ms": run0.iteration_time_ms, "time_cost": run0.iteration_time_ms / ref - 1,
                             **_measured_balance(run0, m, results[rule]),
                             "oom": run0.oom, "headroom": j, "oom_spike_10pct": bool(j < SPIKE),
                             "oom_mb_x2": _oom(dataclasses.replace(p, micro_batch=2 * p.micro_batch), cl, mo, seed),
                             "oom_seq_x2": _oom(dataclasses.replace(p, seq_len=2 * p.seq_len), cl, mo, seed)})
    df = pd.DataFrame(rows)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "pick_rules.csv", index=False)
    return df
