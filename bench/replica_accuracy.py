"""Accuracy on schema-2 plans (issue #15): the planner's estimate of random two-group plans that run (no OOM)
(memx.planner.replicas.estimate_any_plans: each group's 1F1B + the closed-form cross-group term) against
the virtual cluster (memx.simulator.simulate_plan with its own cross-group exchange model), and the same
for the schema-1 plans of the same clusters as the reference.

Plans: for every two-group formation of whole nodes (memx.planner.replica_search.formations) and the
batch splits 1/4, 1/2, 3/4, each group's pipeline is drawn at random on its sub-cluster
(memx.simulator.sample.draw_plan, distributed optimizer and sequence parallelism on, as the default
search), and the pair kept when the groups can be placed together. Predictor: the closed form
(runtime catalog), as `memx plan` without a registered model.

Run: `PYTHONPATH=. python bench/replica_accuracy.py [--plans N]`
Last line: `replica_accuracy schema2_time_mape=… schema2_mem_mape=… schema1_time_mape=… schema1_mem_mape=… cross_ratio=… plans=…`
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics

import numpy as np

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.domain.errors import InputError
from memx.domain.groups import GroupedPlan, ReplicaGroup, validate_any_plan
from memx.domain.precision import resolve_precision
from memx.planner.cost import AnalyticStageModel
from memx.planner.replica_search import formation_cluster, formations
from memx.planner.replicas import estimate_any_plans
from memx.simulator.sample import draw_plan
from memx.simulator.schedule import simulate_plan

CASES = (("a100-v100-16", "llama2-7b", "default"), ("three-vendor-20", "llama2-7b", "default"),
         ("a100-t4-16", "llama-6l", "small"))
ON = (True,)


def _group(rnd: random.Random, cluster, model, space, nodes, share: int) -> ReplicaGroup | None:
    sub = formation_cluster(cluster, nodes)
    sp = dataclasses.replace(space, global_batch=share)
    for _ in range(200):
        p = draw_plan(rnd, sub, model, sp, distributed_optimizer=ON, sequence_parallel=ON)
        if p is not None:
            return ReplicaGroup(dp=p.dp, micro_batch=p.micro_batch, micro_batches=p.micro_batches, stages=p.stages)
    return None


def grouped_plans(cluster, model, space, n: int, seed: int) -> list[GroupedPlan]:
    rnd, out, gb = random.Random(seed), [], space.global_batch
    shares = sorted({(gb * k // 4, gb - gb * k // 4) for k in (1, 2, 3)})
    combos = [(f, s) for f in formations(cluster, 2) for s in shares]
    for attempt in range(n * 200):
        if len(out) >= n:
            break
        form, split = combos[attempt % len(combos)]
        groups = [_group(rnd, cluster, model, space, nodes, share) for nodes, share in zip(form, split)]
        if None in groups:
            continue
        plan = GroupedPlan(model=model.name, cluster=cluster.name, global_batch=gb, seq_len=space.seq_len or model.seq_len,
                           groups=tuple(groups), distributed_optimizer=True, sequence_parallel=True,
                           precision=resolve_precision("auto", [cluster.gpu(st.gpu) for g in groups for st in g.stages]))
        if runs(plan, cluster, model):
            out.append(plan)
    return out


def runs(plan, cluster, model) -> bool:
    """Valid and not out of memory on the virtual cluster (random draws mostly are not: an OOM run has no
    time to compare against)."""
    try:
        validate_any_plan(plan, cluster, model)
    except InputError:
        return False
    return not simulate_plan(plan, cluster, model, seed=0).oom


def errors(plans, cluster, model) -> tuple[list[float], list[float], list[float]]:
    """(time APE, mean per-GPU memory APE, predicted/simulated cross term) over plans that ran."""
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})
    est = estimate_any_plans(plans, cluster, model, pred)
    t_err, m_err, cross = [], [], []
    for p, e in zip(plans, est):
        run = simulate_plan(p, cluster, model, seed=0)
        if run.oom:
            continue
        t_err.append(abs(e.iteration_time_ms - run.iteration_time_ms) / run.iteration_time_ms)
        sim_peak, est_peak = np.asarray(run.peak_mem_mib), np.asarray(e.peak_mem_mib)
        m_err.append(float(np.mean(np.abs(est_peak - sim_peak) / sim_peak)))
        if isinstance(p, GroupedPlan) and run.cross_sync_ms > 0:
            cross.append(e.cross_sync_ms / run.cross_sync_ms)
    return t_err, m_err, cross


def main(n: int) -> None:
    tot = {"t2": [], "m2": [], "t1": [], "m1": [], "x": []}
    for cname, mname, sname in CASES:
        cluster, model = load_cluster(cname), load_model(mname)
        space = load_search(sname)
        two = grouped_plans(cluster, model, space, n, seed=0)
        ones, rnd = [], random.Random(1)
        for _ in range(n * 200):
            p = draw_plan(rnd, cluster, model, space, distributed_optimizer=ON, sequence_parallel=ON)
            if len(ones) >= n:
                break
            if p is not None and runs(p, cluster, model):
                ones.append(p)
        t2, m2, x = errors(two, cluster, model)
        t1, m1, _ = errors(ones, cluster, model)
        for k, v in (("t2", t2), ("m2", m2), ("t1", t1), ("m1", m1), ("x", x)):
            tot[k] += v
        print(f"{cname} + {mname}: schema-2 plans {len(two)} ({len(t2)} ran): time MAPE {100 * statistics.fmean(t2):.1f} %, "
              f"memory MAPE {100 * statistics.fmean(m2):.1f} %, cross term predicted/simulated median "
              f"{statistics.median(x):.2f}; schema-1 plans {len(ones)} ({len(t1)} ran): time MAPE {100 * statistics.fmean(t1):.1f} %, "
              f"memory MAPE {100 * statistics.fmean(m1):.1f} %")
    print(f"replica_accuracy schema2_time_mape={100 * statistics.fmean(tot['t2']):.1f} "
          f"schema2_mem_mape={100 * statistics.fmean(tot['m2']):.1f} schema1_time_mape={100 * statistics.fmean(tot['t1']):.1f} "
          f"schema1_mem_mape={100 * statistics.fmean(tot['m1']):.1f} "
          f"cross_ratio={statistics.median(tot['x']):.2f} plans={len(tot['t2'])}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", type=int, default=20, help="plans per cluster and schema")
    main(ap.parse_args().plans)
