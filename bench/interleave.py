"""Interleaved 1F1B (issue #27): the closed form against the virtual cluster on random interleaved plans, and
the search time with `virtual_stages_options` on vs off, in the same process.

Plans: memx.simulator.draw_plans from conf/search/default.yaml, each re-split into multiples of v layers per
stage with m a multiple of pp (v alternating 2, 4), measured once each with memx.simulator.simulate_plan (its
own event-by-event interleaved schedule); predicted by memx.planner.estimate.estimate_plans with the
runtime-aware closed form. The same plans at v = 1 are the baseline: the interleaving terms should add no
error of their own. Search: conf/search/default.yaml as is (virtual_stages_options [1]) vs [1, 2, 4].

Usage: PYTHONPATH=. .venv/bin/python bench/interleave.py [--plans 40] [--seed 3] [--accuracy-only]
Goals: time_mape ≤ 0.10, mem_mape ≤ 0.10 per case, search ratio ≤ 3×.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from memx.domain.catalog import load_cluster, load_model, load_search  # noqa: E402
from memx.domain.plan import Plan  # noqa: E402
from memx.planner.cost import AnalyticStageModel  # noqa: E402
from memx.planner.estimate import estimate_plans  # noqa: E402
from memx.planner.search import search  # noqa: E402
from memx.simulator import draw_plans, simulate_plan  # noqa: E402

CASES = (("three-vendor-20", "llama2-7b"), ("h100-h20-16", "llama3-8b"), ("three-vendor-20", "llama2-13b"))


def interleaved(plan: Plan, v: int, layers: int) -> Plan | None:
    """`plan` re-split into multiples of v layers per stage, global batch rounded so m is a multiple of pp."""
    if plan.pp < 2 or layers < v * plan.pp or layers % v:
        return None
    n = [max(v, round(st.layers / v) * v) for st in plan.stages]
    while sum(n) != layers:
        i = int(np.argmax(n)) if sum(n) > layers else int(np.argmin(n))
        n[i] += -v if sum(n) > layers else v
    per = plan.dp * plan.micro_batch * plan.pp
    stages = tuple(dataclasses.replace(st, layers=k, recompute_layers=None) for st, k in zip(plan.stages, n))
    return dataclasses.replace(plan, stages=stages, global_batch=per * max(1, round(plan.global_batch / per)),
                               virtual_stages=v)


def figures(plans, runs, est, *, predicted_feasible: bool = False) -> str:
    """Time and memory MAPE of predictions `est` against virtual-cluster `runs` over the plans that ran (and, with
    `predicted_feasible`, that the prediction calls feasible), the median memory ratio and OOM calls right. Both
    sides' peaks are what a process holds (no driver reserve: issue #27, docs/planner.md §Runtime terms)."""
    ok = [i for i, r in enumerate(runs) if not r.oom and (est[i].feasible or not predicted_feasible)]
    t = np.mean([abs(est[i].iteration_time_ms / runs[i].iteration_time_ms - 1) for i in ok]) if ok else float("nan")
    r = np.concatenate([np.asarray(est[i].peak_mem_mib) / np.asarray(runs[i].peak_mem_mib)
                        for i in ok]) if ok else np.array([np.nan])
    right = np.mean([e.feasible == (not run.oom) for e, run in zip(est, runs)])
    return (f"plans={len(plans):3d} ran={len(ok):3d} time_mape={t:.4f} mem_mape={np.mean(np.abs(r - 1)):.4f} "
            f"mem_bias={np.median(r):.3f} oom_right={right:.3f}")


def errors(plans, cluster, model, *, predicted_feasible: bool = False) -> str:
    """`figures` of the runtime-aware closed form on `plans`, each simulated once (seed = its index)."""
    runs = [simulate_plan(p, cluster, model, seed=i) for i, p in enumerate(plans)]
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types}, runtime="catalog")
    est = estimate_plans(plans, cluster, model, pred)
    return figures(plans, runs, est, predicted_feasible=predicted_feasible)


def search_seconds(cluster, model, space) -> tuple[float, float]:
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types}, runtime="catalog")
    t0 = time.perf_counter()
    r = search(cluster, model, space, pred, top_k=5)
    return time.perf_counter() - t0, r.fastest.iteration_time_ms


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plans", type=int, default=40)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--accuracy-only", action="store_true", help="the accuracy rows only (no search timing)")
    args = ap.parse_args()
    for cname, mname in CASES:
        cluster, model = load_cluster(cname), load_model(mname)
        drawn = draw_plans(cluster, model, load_search("default"), n=3 * args.plans, seed=args.seed)
        plans = [p for d, v in zip(drawn, [2, 4] * len(drawn)) if (p := interleaved(d, v, model.layers))][:args.plans]
        print(f"{cname} {mname} interleaved   {errors(plans, cluster, model)}", flush=True)
        plain = [dataclasses.replace(p, virtual_stages=1) for p in plans]
        print(f"{cname} {mname} same plans v=1 {errors(plain, cluster, model)}", flush=True)
    for cname, mname in ([] if args.accuracy_only else CASES[:2]):
        cluster, model, space = load_cluster(cname), load_model(mname), load_search("default")
        off, t_off = search_seconds(cluster, model, space)
        on, t_on = search_seconds(cluster, model, dataclasses.replace(space, virtual_stages_options=(1, 2, 4)))
        print(f"search {cname} {mname}: off {off:.2f}s (fastest {t_off:.0f} ms)  on [1,2,4] {on:.2f}s "
              f"(fastest {t_on:.0f} ms)  ratio {on / off:.2f}×", flush=True)


if __name__ == "__main__":
    main()
