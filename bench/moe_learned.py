"""Mixture of experts and context parallelism in the learned predictor (issue #27): its accuracy on MoE plans
against the virtual cluster, before and after the profiler measures MoE layers and cp rank lengths, in one process.

Per case (bench/moe.py's CASES): plans drawn by memx.simulator.draw_plans from conf/search/default.yaml, each given
a random ep dividing dp and the experts ("random ep"), and the same drawn plans read with context parallelism
(cp 2 or 4, an ep dividing dp·cp: "cp and ep"; bench/moe.py's with_cp_and_experts), each measured once with
memx.simulator.simulate_plan (which never imports the planner). Predictors: memx.learn.fit_predictor
(hybrid-calibrated, seed 0) on the augmented simulated profile (memx.learn.augment) of the same cluster and model,
the profile space conf/search/default.yaml with expert_parallel_options the values of (1, 2, 4, 8) dividing the
experts, and
- before: `profile(..., moe_layers="none")`, context_parallel_options [1] — every stage measured as its dense
  equivalent (the design before this change), a cp rank's s/cp reached by the sequence-length transfer;
- all: `moe_layers="all"` (the default: every point a MoE stage), context_parallel_options [1];
- points: `moe_layers="points"` (the dense equivalent's design plus MoE points at every ep), [1];
- all+cp, pts+cp: the same with context_parallel_options [1, 2, 4] (the cheap points at s/2 and s/4).
Each is scored by memx.planner.estimate.estimate_plans (the search's assembly; the closed form adds the MoE and
ring terms after the predictor).

With --dense-first: deepseek-v2-lite (layer 0 dense, conf/models) on h100-h20-16 and three-vendor-20, settings
before, pts-dense (the "points" profile without its dense-first points: the dense layer predicted from the MoE
design and moved by the closed form's MLP difference) and points (with them: memx.profiling.design.dense_first_points,
read through memx.planner.moe.dense_layers_shift).

Usage: PYTHONPATH=. .venv/bin/python bench/moe_learned.py [--plans 40] [--seed 3] [--dense-first]
Goals (issue #27): time_mape ≤ 0.10, mem_mape ≤ 0.10, oom_right ≥ 0.95.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import time
from pathlib import Path

import numpy as np


REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from memx.domain.catalog import load_cluster, load_model, load_search  # noqa: E402
from memx.learn import fit_predictor  # noqa: E402
from memx.learn.augment import augment  # noqa: E402
from memx.planner.estimate import estimate_plans  # noqa: E402
from memx.profiling import profile  # noqa: E402
from memx.simulator import draw_plans, simulate_plan  # noqa: E402
from moe import CASES, with_cp_and_experts, with_experts  # noqa: E402

from bench.interleave import figures  # noqa: E402  (issue #27's accuracy figures)

SETTINGS = (("before", "none", (1,)), ("all", "all", (1,)), ("points", "points", (1,)), ("all+cp", "all", (1, 2, 4)),
            ("pts+cp", "points", (1, 2, 4)))
# --dense-first (a model with `moe_first_dense_layers`, issue #27 session 5): "points" with the dense-first points
# (memx.profiling.design.dense_first_points, the default) against the same profile without them ("pts-dense": the
# rows dropped before training, so the planner moves those layers by the closed form's MLP difference, as before)
DENSE_FIRST_SETTINGS = (("before", "none", (1,)), ("pts-dense", "points", (1,)), ("points", "points", (1,)))
DENSE_FIRST_CASES = (("h100-h20-16", "deepseek-v2-lite"), ("three-vendor-20", "deepseek-v2-lite"))


def errors(plans, runs, cluster, model, predictor, first_stage: bool = False) -> str:
    """bench.interleave.figures of `predictor` over the plans that ran and that it calls feasible; `first_stage`:
    also the MAPE of stage 0's time and GPU 0's peak alone (the stage that holds a model's dense-first layers)."""
    est = estimate_plans(plans, cluster, model, predictor)
    out = figures(plans, runs, est, predicted_feasible=True)
    ok = [i for i, r in enumerate(runs) if not r.oom and est[i].feasible]
    if first_stage and ok:
        t = np.mean([abs(est[i].stage_time_ms[0] / runs[i].stage_time_ms[0] - 1) for i in ok])
        m = np.mean([abs(est[i].peak_mem_mib[0] / runs[i].peak_mem_mib[0] - 1) for i in ok])
        out += f" stage0_time_mape={t:.4f} gpu0_mem_mape={m:.4f}"
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plans", type=int, default=40)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--dense-first", action="store_true",
                    help="deepseek-v2-lite (its first layer dense): with and without the dense-first points")
    args = ap.parse_args()
    cases, settings = (DENSE_FIRST_CASES, DENSE_FIRST_SETTINGS) if args.dense_first else (CASES, SETTINGS)
    for cname, mname in cases:
        cluster, model = load_cluster(cname), load_model(mname)
        gpus = {g.name: g for g in cluster.gpu_types}
        rnd = random.Random(args.seed)
        drawn = draw_plans(cluster, model, load_search("default"), n=args.plans, seed=args.seed)
        sets = {"random ep": [with_experts(p, model.num_experts, rnd) for p in drawn]}
        sets["cp and ep"] = [q for q in (with_cp_and_experts(p, model.num_experts, rnd) for p in drawn) if q is not None]
        runs = {k: [simulate_plan(p, cluster, model, seed=i) for i, p in enumerate(v)] for k, v in sets.items()}
        eps = tuple(e for e in (1, 2, 4, 8) if model.num_experts % e == 0)
        for name, moe_layers, cps in settings:
            space = dataclasses.replace(load_search("default"), expert_parallel_options=eps, context_parallel_options=cps)
            t0 = time.perf_counter()
            prof = profile(cluster, model, space, backend="simulated", moe_layers=moe_layers)
            rows = prof.stage_runs
            if name == "pts-dense":
                rows = rows[rows["source"] != "design:dense_first"].reset_index(drop=True)
            pred = fit_predictor(augment(rows).stage_runs, gpus, seed=0)
            took = time.perf_counter() - t0
            for k in sets:
                print(f"{cname} {mname} {k:9s} {name:7s} {errors(sets[k], runs[k], cluster, model, pred, args.dense_first)} "
                      f"(profile {prof.runs} points, profile+train {took:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
