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

Usage: PYTHONPATH=. .venv/bin/python bench/moe_learned.py [--plans 40] [--seed 3]
Goals (issue #27): time_mape ≤ 0.10, mem_mape ≤ 0.10, oom_right ≥ 0.95.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import time
from pathlib import Path


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


def errors(plans, runs, cluster, model, predictor) -> str:
    """bench.interleave.figures of `predictor` over the plans that ran and that it calls feasible."""
    return figures(plans, runs, estimate_plans(plans, cluster, model, predictor), predicted_feasible=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plans", type=int, default=40)
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args()
    for cname, mname in CASES:
        cluster, model = load_cluster(cname), load_model(mname)
        gpus = {g.name: g for g in cluster.gpu_types}
        rnd = random.Random(args.seed)
        drawn = draw_plans(cluster, model, load_search("default"), n=args.plans, seed=args.seed)
        sets = {"random ep": [with_experts(p, model.num_experts, rnd) for p in drawn]}
        sets["cp and ep"] = [q for q in (with_cp_and_experts(p, model.num_experts, rnd) for p in drawn) if q is not None]
        runs = {k: [simulate_plan(p, cluster, model, seed=i) for i, p in enumerate(v)] for k, v in sets.items()}
        eps = tuple(e for e in (1, 2, 4, 8) if model.num_experts % e == 0)
        for name, moe_layers, cps in SETTINGS:
            space = dataclasses.replace(load_search("default"), expert_parallel_options=eps, context_parallel_options=cps)
            t0 = time.perf_counter()
            prof = profile(cluster, model, space, backend="simulated", moe_layers=moe_layers)
            pred = fit_predictor(augment(prof.stage_runs).stage_runs, gpus, seed=0)
            took = time.perf_counter() - t0
            for k in sets:
                print(f"{cname} {mname} {k:9s} {name:7s} {errors(sets[k], runs[k], cluster, model, pred)} "
                      f"(profile {prof.runs} points, profile+train {took:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
