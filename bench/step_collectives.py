"""The step-level collectives of issue #23 at scale: what the DP ring's latency and the tied embedding's
all-reduce add to the closed form's step time, and its accuracy against the virtual cluster with and without
them, in one process on the same plans.

Plans: memx.simulator.draw_plans from conf/search/default.yaml (distributed optimizer and sequence parallelism
drawn on or off) on the 1,024-GPU cluster (conf/clusters/mixed-1024.yaml: 10 µs per NIC message, the catalog's
default) and on the same cluster with 0.1 ms per message (`--latency-ms`, as a TCP / RoCE path without
GPUDirect), for a tied model (gpt-neo-2.7b) and an untied one (llama2-7b); each measured once with
memx.simulator.simulate_plan (which has both terms itself: memx.simulator.step_sync, physics.ring_allreduce_ms).
"without" is the same closed form with memx.planner.collectives.tail_collectives_ms replaced by zeros (the step
time before issue #23).

Run: `PYTHONPATH=. python bench/step_collectives.py [--plans 20] [--latency-ms 0.1]`
Last line: `step_collectives time_mape_with=… time_mape_without=… share_median=… share_max=… plans=…`
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from unittest import mock

import numpy as np

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.planner import schedule
from memx.planner.cost import AnalyticStageModel
from memx.planner.estimate import estimate_plans
from memx.simulator import draw_plans, simulate_plan

MODELS = ("gpt-neo-2.7b", "llama2-7b")


def _zeros(model, *, stage_tp, **_) -> np.ndarray:
    return np.zeros(len(stage_tp))


def case(cluster, model, n: int, seed: int) -> tuple[list[float], list[float], list[float], int]:
    """(APE with the terms, APE without, share of T the terms take, largest dp) over the plans that ran."""
    both = (False, True)
    plans = draw_plans(cluster, model, load_search("default"), n=n, seed=seed, distributed_optimizer=both,
                       sequence_parallel=both)
    runs = [simulate_plan(p, cluster, model, seed=seed + i) for i, p in enumerate(plans)]
    kept = [(p, r) for p, r in zip(plans, runs) if not r.oom]
    if not kept:
        return [], [], [], 0
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})
    ps = [p for p, _ in kept]
    new = estimate_plans(ps, cluster, model, pred)
    with mock.patch.object(schedule, "tail_collectives_ms", _zeros):
        old = estimate_plans(ps, cluster, model, pred)
    sim = [r.iteration_time_ms for _, r in kept]
    ape = [abs(e.iteration_time_ms - s) / s for e, s in zip(new, sim)]
    ape0 = [abs(e.iteration_time_ms - s) / s for e, s in zip(old, sim)]
    share = [(a.iteration_time_ms - b.iteration_time_ms) / a.iteration_time_ms for a, b in zip(new, old)]
    return ape, ape0, share, max((p.dp for p in ps), default=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", type=int, default=20, help="plans drawn per cluster and model")
    ap.add_argument("--latency-ms", type=float, default=0.1, help="the slower NIC latency of the second cluster")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    base = load_cluster("mixed-1024")
    slow = dataclasses.replace(base, name="mixed-1024", inter_node_latency_ms=args.latency_ms)
    pooled: list[tuple[list[float], list[float], list[float]]] = []
    for cluster, label in ((base, f"{base.inter_node_latency_ms:g} ms"), (slow, f"{args.latency_ms:g} ms")):
        for mname in MODELS:
            ape, ape0, share, top_dp = case(cluster, load_model(mname), args.plans, args.seed)
            pooled.append((ape, ape0, share))
            if not ape:
                print(f"mixed-1024 ({label}) + {mname}: no plan ran")
                continue
            print(f"mixed-1024 ({label}) + {mname}: {len(ape)} plans ran (dp up to {top_dp}): time MAPE with the terms "
                  f"{100 * statistics.fmean(ape):.2f} %, without {100 * statistics.fmean(ape0):.2f} %; the terms' share "
                  f"of T median {100 * statistics.median(share):.3f} %, max {100 * max(share):.3f} %")
    ape = [x for a, _, _ in pooled for x in a]
    ape0 = [x for _, a, _ in pooled for x in a]
    share = [x for _, _, a in pooled for x in a]
    print(f"step_collectives time_mape_with={100 * statistics.fmean(ape):.2f} time_mape_without="
          f"{100 * statistics.fmean(ape0):.2f} share_median={100 * statistics.median(share):.3f} "
          f"share_max={100 * max(share):.3f} plans={len(ape)}")


if __name__ == "__main__":
    main()
