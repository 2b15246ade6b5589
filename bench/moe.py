"""Mixture of experts (issue #27): the closed form against the virtual cluster on random MoE plans, and the search
time with `expert_parallel_options` on vs off, in the same process.

Plans: memx.simulator.draw_plans from conf/search/default.yaml, each given a random expert-parallel size ep among
those that divide dp and the model's experts (sequence parallelism on, as Megatron needs with ep > 1 and tp > 1),
measured once each with memx.simulator.simulate_plan (memx.simulator.moe: its own grouped-GEMM experts and
all-to-all on the placement's links); predicted by memx.planner.estimate.estimate_plans with the runtime-aware
closed form (memx.planner.moe). The same plans at ep = 1 are printed beside them, and the drawn plans read with
context parallelism (dp/cp replicas of cp = 2 or 4 ranks) and an ep dividing dp·cp ("cp and ep"). Search: conf/search/default.yaml
with expert_parallel_options [1] (as is) vs [1, 2, 4, 8] (those dividing the experts), and the latter with
context_parallel_options [1, 2] too.

Usage: PYTHONPATH=. .venv/bin/python bench/moe.py [--plans 40] [--seed 3] [--accuracy-only]
Goals: time_mape ≤ 0.10, mem_mape ≤ 0.10, oom_right ≥ 0.95 per case, search ratio ≤ 3×.
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

from memx.domain.catalog import load_cluster, load_model, load_search  # noqa: E402
from memx.domain.plan import Plan  # noqa: E402
from memx.planner.cost import AnalyticStageModel  # noqa: E402
from memx.planner.search import search  # noqa: E402
from memx.simulator import draw_plans  # noqa: E402

from bench.interleave import errors as interleave_errors  # noqa: E402  (issue #27's accuracy figures)

CASES = (("h100-mi300x-32", "mixtral-8x7b"), ("three-vendor-20", "qwen1.5-moe-a2.7b"),
         ("h100-h20-16", "qwen1.5-moe-a2.7b"))


def with_experts(plan: Plan, experts: int, rnd: random.Random) -> Plan:
    """`plan` with a random ep dividing dp and the experts (> 1 where one exists), sequence parallelism on."""
    eps = [e for e in range(2, plan.dp + 1) if plan.dp % e == 0 and experts % e == 0]
    return dataclasses.replace(plan, expert_parallel=rnd.choice(eps) if eps else 1, sequence_parallel=True)


def with_cp_and_experts(plan: Plan, experts: int, rnd: random.Random) -> Plan | None:
    """`plan`'s dp replicas read as dp/cp replicas of cp context-parallel ranks (cp 2, else 4; dividing dp and
    seq_len/2), with a random ep dividing the dp·cp ranks and the experts — ep need not divide dp (the expert grid
    spans dp × cp, memx.domain.plan.moe_problems) — or None where no cp divides."""
    cp = next((c for c in (2, 4) if plan.dp % c == 0 and plan.seq_len % (2 * c) == 0), None)
    if cp is None:
        return None
    eps = [e for e in range(2, plan.dp + 1) if plan.dp % e == 0 and experts % e == 0]
    return dataclasses.replace(plan, dp=plan.dp // cp, global_batch=plan.global_batch // cp, context_parallel=cp,
                               idle_gpus=None, expert_parallel=rnd.choice(eps) if eps else 1, sequence_parallel=True)


def errors(plans, cluster, model) -> str:
    """bench.interleave.errors over the plans that ran and that the closed form calls feasible."""
    return interleave_errors(plans, cluster, model, predicted_feasible=True)


def search_seconds(cluster, model, space) -> tuple[float, float, int]:
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types}, runtime="catalog")
    t0 = time.perf_counter()
    r = search(cluster, model, space, pred, top_k=5)
    return time.perf_counter() - t0, r.fastest.iteration_time_ms, r.fastest.plan.expert_parallel


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plans", type=int, default=40)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--accuracy-only", action="store_true", help="the accuracy rows only (no search timing)")
    args = ap.parse_args()
    rnd = random.Random(args.seed)
    for cname, mname in CASES:
        cluster, model = load_cluster(cname), load_model(mname)
        drawn = draw_plans(cluster, model, load_search("default"), n=args.plans, seed=args.seed)
        plans = [with_experts(p, model.num_experts, rnd) for p in drawn]
        print(f"{cname} {mname} random ep  {errors(plans, cluster, model)}", flush=True)
        plain = [dataclasses.replace(p, expert_parallel=1) for p in plans]
        print(f"{cname} {mname} same, ep=1 {errors(plain, cluster, model)}", flush=True)
        both = [q for q in (with_cp_and_experts(p, model.num_experts, rnd) for p in drawn) if q is not None]
        print(f"{cname} {mname} cp and ep  {errors(both, cluster, model)}", flush=True)
    for cname, mname in ([] if args.accuracy_only else CASES[:2]):
        cluster, model, space = load_cluster(cname), load_model(mname), load_search("default")
        off, t_off, _ = search_seconds(cluster, model, space)
        options = tuple(e for e in (1, 2, 4, 8) if model.num_experts % e == 0)
        on, t_on, ep = search_seconds(cluster, model, dataclasses.replace(space, expert_parallel_options=options))
        print(f"search {cname} {mname}: off {off:.2f}s (fastest {t_off:.0f} ms)  on {list(options)} {on:.2f}s "
              f"(fastest {t_on:.0f} ms, ep {ep})  ratio {on / off:.2f}×", flush=True)
        both = dataclasses.replace(space, expert_parallel_options=options, context_parallel_options=(1, 2))
        on_cp, t_cp, ep_cp = search_seconds(cluster, model, both)
        print(f"search {cname} {mname}: ep {list(options)} and cp [1, 2] {on_cp:.2f}s (fastest {t_cp:.0f} ms, "
              f"ep {ep_cp})  ratio to ep only {on_cp / on:.2f}×, to off {on_cp / off:.2f}×", flush=True)


if __name__ == "__main__":
    main()
