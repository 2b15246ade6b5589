"""Context parallelism (issue #27): the closed form against the virtual cluster on random context-parallel
plans, the search time with `context_parallel_options` on vs off in the same process, and the worked case.

Plans: memx.simulator.draw_plans from conf/search/default.yaml at the model's sequence length, each drawn plan
with dp ≥ 2 re-read as dp/cp data-parallel replicas of cp context-parallel ranks (cp the largest of 4, 2 that
divides dp; the same GPUs, links and micro batches), measured once each with memx.simulator.simulate_plan (its
own step-by-step ring, memx.simulator.context_parallel); predicted by memx.planner.estimate.estimate_plans with
the runtime-aware closed form. Baseline: the same plans' rank-equivalent plans (dp·cp replicas at s/cp: every
term but the ring) — the ring terms should add no error of their own. Search: conf/search/default.yaml as is
(context_parallel_options [1]) vs [1, 2, 4], best of 3 runs each.

Usage: PYTHONPATH=. .venv/bin/python bench/context_parallel.py [--plans 40] [--seed 3] [--cases-only] [--by-m]
`--by-m` (issue #27, session 9): per micro-batch count, where the time error comes from — the paper's 1F1B assembly
(m − 1)·max_s t_s + Σ_s t_s + Σ 2·p2p_s + max_s tail_s (paper §3.1.2) applied to the simulator's own noise-free stage
times, p2p and tails, against its measured iteration (the assembly alone); the exact 1F1B schedule of the same terms
(fill and drain exact), and with each stage's DP step and optimizer started at its own last backward; and the closed
form's stage times against the simulator's (the stage model alone).
Goals: time_mape ≤ 0.10, mem_mape ≤ 0.10, oom_right ≥ 0.95 per case, search ratio ≤ 3×. Each accuracy line also
counts the OOM miscalls by side (safe_miss: called OOM, ran; unsafe_miss: called fitting, ran out of memory).
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
from memx.domain.context_parallel import rank_equivalent  # noqa: E402
from memx.domain.plan import Plan  # noqa: E402
from memx.planner.cost import AnalyticStageModel  # noqa: E402
from memx.planner.estimate import estimate_plans  # noqa: E402
from memx.planner.search import search  # noqa: E402
from memx.simulator import draw_plans, simulate_plan  # noqa: E402

from bench.interleave import figures  # noqa: E402  (the same accuracy figures as issue #27's interleaving bench)
from memx.domain.runtime import usable_capacity_mib  # noqa: E402

CASES = (("h100-h20-16", "llama3-8b"), ("a100-h20-h100-256", "llama3-8b-32k"), ("three-vendor-20", "llama2-7b"))
SEARCH_CASES = (("three-vendor-20", "llama2-7b"), ("h100-h20-16", "llama3-8b"))


def with_cp(plan: Plan) -> Plan | None:
    """`plan`'s dp replicas read as dp/cp replicas of cp ranks (cp 4 or 2, dividing dp and seq_len/2), or None."""
    cp = next((c for c in (4, 2) if plan.dp % c == 0 and plan.seq_len % (2 * c) == 0), None)
    if cp is None:
        return None
    return dataclasses.replace(plan, dp=plan.dp // cp, global_batch=plan.global_batch // cp, context_parallel=cp,
                               idle_gpus=None)


def errors(plans, cluster, model) -> str:
    """bench.interleave's figures, then the OOM miscalls by side: `safe_miss` called OOM but ran (the planner
    leaves a plan out that would have fitted), `unsafe_miss` called fitting but ran out of memory (a pick that
    crashes); each miscall with the predicted peak over (+) or under (−) the usable capacity of its tightest stage."""
    runs = [simulate_plan(p, cluster, model, seed=i) for i, p in enumerate(plans)]
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types}, runtime="catalog")
    est = estimate_plans(plans, cluster, model, pred)
    gpus = {g.name: g for g in cluster.gpu_types}
    safe = [i for i, (e, r) in enumerate(zip(est, runs)) if not e.feasible and not r.oom]
    unsafe = [i for i, (e, r) in enumerate(zip(est, runs)) if e.feasible and r.oom]
    over = {i: max(pk - usable_capacity_mib(gpus[st.gpu]) for pk, st in zip(est[i].stage_peak_mib, plans[i].stages))
            for i in safe + unsafe}
    detail = " ".join(f"{i}:{over[i]:+.0f}MiB" for i in safe + unsafe)
    return (f"{figures(plans, runs, est)} safe_miss={len(safe)} unsafe_miss={len(unsafe)}"
            + (f" (plan:predicted peak − capacity {detail})" if detail else ""))


def by_micro_batches(plans, cluster, model) -> None:
    """The `--by-m` attribution (module docstring): per m, the paper's assembly on the simulator's own terms (the
    assembly alone), the exact noise-free 1F1B of those stage times (memx.simulator.schedule.run_1f1b, forward :
    backward = 1 : 2, Narayanan et al. 2021 §5.1) plus max_s tail_s (fill and drain exact), the same with each stage's
    tail started at its own last backward (the drain overlapping the DP step), the closed form, the stage times."""
    from memx.simulator.schedule import run_1f1b

    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types}, runtime="catalog")
    rows = []
    for i, (p, e) in enumerate(zip(plans, estimate_plans(plans, cluster, model, pred))):
        r = simulate_plan(p, cluster, model, seed=i)
        if r.oom:
            continue
        t, m = np.array(r.stage_time_ms), p.micro_batches
        tails = np.array(r.dp_allreduce_ms) + np.array(r.optimizer_ms) + r.embedding_sync_ms
        paper = (m - 1) * t.max() + t.sum() + 2 * sum(r.p2p_ms) + tails.max()  # paper §3.1.2 on the simulator's terms
        end, _ = run_1f1b([[x / 3] * m for x in t], [[2 * x / 3] * m for x in t], list(r.p2p_ms))
        exact, own = max(end) + tails.max(), max(f + tl for f, tl in zip(end, tails))
        rows.append((m, *(x / r.iteration_time_ms for x in (paper, exact, own, e.iteration_time_ms)),
                     float(np.mean(np.array(e.stage_time_ms) / t))))
    x = np.array(rows)
    print("  per m, each / measured: paper assembly | exact 1F1B + max tail | + own tails | closed form; stage times"
          " closed / simulated")
    for m in sorted(set(x[:, 0])):
        y = x[x[:, 0] == m][:, 1:].mean(axis=0)
        print(f"  m={int(m):<3d} plans={int((x[:, 0] == m).sum()):<3d} " + " | ".join(f"{v:.3f}" for v in y[:4])
              + f";  {y[4]:.3f}")
    mape = np.abs(x[:, 1:5] - 1).mean(axis=0)
    print(f"  all: time_mape paper assembly {mape[0]:.4f} | exact 1F1B {mape[1]:.4f} | + own tails {mape[2]:.4f} | "
          f"closed form {mape[3]:.4f}", flush=True)


def search_seconds(cluster, model, space) -> tuple[float, float, int]:
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types}, runtime="catalog")
    best, r = float("inf"), None
    for _ in range(3):
        t0 = time.perf_counter()
        r = search(cluster, model, space, pred, top_k=5)
        best = min(best, time.perf_counter() - t0)
    return best, r.fastest.iteration_time_ms, r.fastest.plan.context_parallel


def worked_case() -> None:
    """llama3-8b-128k on vendor-b-128 (conf/search/long-context.yaml): no plan without cp, one with it."""
    from memx.domain.errors import InfeasibleError

    cluster, model, space = load_cluster("vendor-b-128"), load_model("llama3-8b-128k"), load_search("long-context")
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types}, runtime="catalog")
    try:
        search(cluster, model, dataclasses.replace(space, context_parallel_options=(1,)), pred, top_k=3)
        print("worked case: a plan without cp exists (unexpected)")
    except InfeasibleError as exc:
        print(f"worked case without cp: {exc}")
    r = search(cluster, model, space, pred, top_k=3)
    p = r.chosen.plan
    run = simulate_plan(p, cluster, model)
    same = simulate_plan(dataclasses.replace(rank_equivalent(p), seq_len=p.seq_len), cluster, model)  # m kept
    print(f"worked case with cp: dp {p.dp} cp {p.context_parallel} tp {[s.tp for s in p.stages]} "
          f"layers {[s.layers for s in p.stages]}: predicted {r.chosen.iteration_time_ms:.0f} ms, "
          f"{r.chosen.max_mem_mib / 1024:.1f} GiB; virtual cluster {run.iteration_time_ms:.0f} ms, "
          f"{max(run.peak_mem_mib) / 1024:.1f} GiB; the same GPUs as dp {p.dp * p.context_parallel} without cp: "
          f"{'OOM, ' + same.reason if same.oom else 'runs'}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plans", type=int, default=40)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--cases-only", action="store_true", help="accuracy only (no search timing, no worked case)")
    ap.add_argument("--by-m", action="store_true", help="with --cases-only: the time error per micro-batch count, "
                    "the 1F1B assembly's share apart from the stage times'")
    args = ap.parse_args()
    for cname, mname in CASES:
        cluster, model = load_cluster(cname), load_model(mname)
        drawn = draw_plans(cluster, model, load_search("default"), n=4 * args.plans, seed=args.seed)
        plans = [p for d in drawn if (p := with_cp(d)) is not None][:args.plans]
        print(f"{cname} {mname} context-parallel {errors(plans, cluster, model)}", flush=True)
        print(f"{cname} {mname} rank-equivalent  {errors([rank_equivalent(p) for p in plans], cluster, model)}",
              flush=True)
        if args.by_m:
            by_micro_batches(plans, cluster, model)
    if args.cases_only:
        return
    for cname, mname in SEARCH_CASES:
        cluster, model, space = load_cluster(cname), load_model(mname), load_search("default")
        off, t_off, _ = search_seconds(cluster, model, space)
        on, t_on, cp = search_seconds(cluster, model, dataclasses.replace(space, context_parallel_options=(1, 2, 4)))
        print(f"search {cname} {mname}: off {off:.2f}s (fastest {t_off:.0f} ms)  on [1,2,4] {on:.2f}s "
              f"(fastest {t_on:.0f} ms, cp {cp})  ratio {on / off:.2f}×", flush=True)
    worked_case()


if __name__ == "__main__":
    main()
