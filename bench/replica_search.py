"""Replica-group search (issue #15): search time v1 (schema 1, max_replica_groups 1) vs v2
(max_replica_groups 2) in one process, and the best schema-1 vs best schema-2 plan, predicted
(analytic stage model + memx.planner.replicas' closed-form cross-group term) and measured on the
virtual cluster (memx.simulator.simulate_plan, which simulates schema-2 plans with its own
cross-group exchange model, memx/simulator/cross_sync.py), mean over SEEDS seeded runs.

Scenario: llama2-7b, conf/search/default.yaml (global batch 128), clusters a100-v100-16 and
three-vendor-20. Run: `PYTHONPATH=. python bench/replica_search.py [cluster ...]`
Last line per cluster: <cluster> v1_s=<s> v2_s=<s> v1_pred_ms=… v2_pred_ms=… v1_sim_ms=… v2_sim_ms=…
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.experiments.common import describe
from memx.planner.cost import AnalyticStageModel
from memx.planner.replica_search import search_replicas
from memx.planner.search import search
from memx.simulator.schedule import simulate_plan

SEEDS = range(5)
CLUSTERS = ("a100-v100-16", "three-vendor-20")


def simulated_ms(plan, cluster, model) -> float | None:
    runs = [simulate_plan(plan, cluster, model, seed=s) for s in SEEDS]
    return None if any(r.oom for r in runs) else statistics.fmean(r.iteration_time_ms for r in runs)


def main(clusters: tuple[str, ...]) -> None:
    model = load_model("llama2-7b")
    for name in clusters:
        cluster = load_cluster(name)
        pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})
        v1_space = load_search("default")
        t0 = time.perf_counter()
        v1 = search(cluster, model, v1_space, pred)
        v1_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        v2 = search_replicas(cluster, model, dataclasses.replace(v1_space, max_replica_groups=2), pred)
        v2_s = time.perf_counter() - t0
        one, two = v1.chosen, v2.grouped
        print(f"{name}: v1 search {v1_s:.1f} s; v2 search {v2_s:.1f} s ({v2.formations} formations, "
              f"{v2.splits} splits, {v2.group_searches} group searches, exact={v2.exact})")
        print(f"  v1 pick  {one.iteration_time_ms:9.1f} ms predicted  {describe(one.plan)}")
        v1_sim = simulated_ms(one.plan, cluster, model)
        v2_sim = None
        if two is not None:
            print(f"  v2 best  {two.iteration_time_ms:9.1f} ms predicted (cross-group {two.cross_sync_ms:.1f} ms; "
                  f"groups {[round(g.iteration_time_ms, 1) for g in two.groups]})  {describe(two.plan)}")
            v2_sim = simulated_ms(two.plan, cluster, model)
            run = simulate_plan(two.plan, cluster, model, seed=0)
            print(f"  v2 simulated: groups {[round(x, 1) for x in run.group_iteration_ms]} ms, "
                  f"cross-group {run.cross_sync_ms:.1f} ms (seed 0)")
        print(f"  answer with max_replica_groups 2: {type(v2.result.chosen.plan).__name__} "
              f"{v2.result.chosen.iteration_time_ms:.1f} ms predicted")

        def f(x):
            return "n/a" if x is None else f"{x:.1f}"

        print(f"{name} v1_s={v1_s:.2f} v2_s={v2_s:.2f} v1_pred_ms={one.iteration_time_ms:.1f} "
              f"v2_pred_ms={f(two.iteration_time_ms if two else None)} v1_sim_ms={f(v1_sim)} v2_sim_ms={f(v2_sim)}")


if __name__ == "__main__":
    main(tuple(sys.argv[1:]) or CLUSTERS)
