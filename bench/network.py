"""Network per node and the flat DP collective (issue #23, network side): what they change, in one process.

1. Pure data parallelism over mixed GPU types (replica groups of one layer partition, one per GPU type):
   the planner's old two-level exchange (each group's own all-reduce, a cross-group ring, a broadcast:
   memx.planner.replicas.cross_group_sync_ms) against the flat collective the runtime runs
   (memx.planner.replicas.replica_sync_ms), both against the virtual cluster (which runs the flat one,
   implemented on its own: memx.simulator.cross_sync.flat_stage_ms).
2. Closed form vs virtual cluster, time MAPE, on random schema-1 plans of clusters with a NIC per node
   (v100-t4-16; three-vendor-20 with per-node NICs and a cross-vendor link).
3. Search time of the default scenario (three-vendor-20 / llama2-7b / default, closed form): this tree
   against a baseline tree (`--baseline DIR`, e.g. `git worktree add ../base d172f51`: the code before) run in a child process.

Run: `PYTHONPATH=. python bench/network.py [--plans N] [--baseline DIR]`
Last line: `network old_two_level_mape=… flat_mape=… random_mape=… search_ratio=…`
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import time

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.domain.groups import GroupedPlan, ReplicaGroup
from memx.domain.plan import Stage
from memx.domain.precision import resolve_precision
from memx.planner.cost import AnalyticStageModel
from memx.planner.replicas import combine, cross_group_sync_ms, estimate_any_plans
from memx.simulator.sample import draw_plans
from memx.simulator.schedule import simulate_plan
from memx.simulator.traits import load_traits

PURE_DP = (("v100-t4-16", "llama-6l"), ("a100-v100-16", "llama2-7b"), ("three-vendor-20", "llama2-7b"),
           ("a100-t4-16", "llama-6l"))
SEARCH_SNIPPET = ("import time; from memx.domain.catalog import load_cluster, load_model, load_search; "
                  "from memx.planner.cost import AnalyticStageModel; from memx.planner.search import search; "
                  "c, m, s = load_cluster('three-vendor-20'), load_model('llama2-7b'), load_search('default'); "
                  "p = AnalyticStageModel(gpus={g.name: g for g in c.gpu_types}); t = time.perf_counter(); "
                  "search(c, m, s, p); print(time.perf_counter() - t)")


def pure_dp_plans(cluster, model) -> list[GroupedPlan]:
    """One group per GPU type, every group the same stages (tp, layers), all its GPUs as replicas."""
    out = []
    types = cluster.gpu_types
    for tp in (1, 2, 4, 8):
        if any(tp > max(cluster.node_sizes(g.name)) or cluster.gpu_count(g.name) % tp for g in types):
            continue
        for pp in (1, 2):
            if any((cluster.gpu_count(g.name) // tp) % pp for g in types):
                continue
            for rc in ("none", "full"):
                layers = [model.layers // pp + (1 if s < model.layers % pp else 0) for s in range(pp)]
                groups = tuple(ReplicaGroup(dp=cluster.gpu_count(g.name) // (tp * pp), micro_batch=1, micro_batches=8,
                                            stages=tuple(Stage(gpu=g.name, tp=tp, layers=n, recompute=rc) for n in layers))
                               for g in types)
                for do in (False, True):
                    out.append(GroupedPlan(model=model.name, cluster=cluster.name, seq_len=model.seq_len,
                                           global_batch=sum(g.samples for g in groups), groups=groups,
                                           distributed_optimizer=do, sequence_parallel=tp > 1,
                                           precision=resolve_precision("auto", types)))  # V100/T4: fp16
    return out


def old_two_level_ms(plan, est, cluster, model) -> float:
    """The planner's time of the plan under the old model: the groups' own times + the two-level exchange."""
    return combine(plan, est.groups, cross_group_sync_ms(plan, cluster, model)).iteration_time_ms


def nominal_links(cluster) -> dict:
    """The virtual cluster's traits with link_efficiency 1: links at nominal bandwidth, as the closed form's
    DP formula assumes (isolates the collective model from the achieved-bandwidth gap)."""
    return {g.name: dataclasses.replace(load_traits(g.name), link_efficiency=1.0) for g in cluster.gpu_types}


def section_pure_dp() -> tuple[list[float], list[float]]:
    old_err, new_err = [], []
    for cname, mname in PURE_DP:
        cluster, model = load_cluster(cname), load_model(mname)
        pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})
        plans = pure_dp_plans(cluster, model)
        runs = [simulate_plan(p, cluster, model, seed=0) for p in plans]
        kept = [(p, r) for p, r in zip(plans, runs) if not r.oom]
        if not kept:
            print(f"{cname}: no pure-DP plan fits")
            continue
        est = estimate_any_plans([p for p, _ in kept], cluster, model, pred)
        nominal = [simulate_plan(p, cluster, model, seed=0, traits=nominal_links(cluster)) for p, _ in kept]
        o, n, o1, n1 = [], [], [], []
        for (p, r), e, r1 in zip(kept, est, nominal):
            old = old_two_level_ms(p, e, cluster, model)
            for out, out1, t in ((o, o1, old), (n, n1, e.iteration_time_ms)):
                out.append((t - r.iteration_time_ms) / r.iteration_time_ms)
                out1.append((t - r1.iteration_time_ms) / r1.iteration_time_ms)
        old_err += [abs(x) for x in o]
        new_err += [abs(x) for x in n]
        print(f"{cname} + {mname}: {len(kept)} pure-DP plans over {len(cluster.gpu_types)} GPU types, planner vs virtual "
              f"cluster (mean signed): old two-level model {100 * statistics.fmean(o):+.1f} %, flat collective "
              f"{100 * statistics.fmean(n):+.1f} %; against nominal links (link_efficiency 1): old "
              f"{100 * statistics.fmean(o1):+.1f} %, flat {100 * statistics.fmean(n1):+.1f} %, flat MAPE "
              f"{100 * statistics.fmean(abs(x) for x in n1):.1f} %")
    return old_err, new_err


def nic_clusters():
    tv = load_cluster("three-vendor-20")
    nics = (25.0, 50.0, 12.5)  # per node, GB/s: 200, 400, 100 Gb/s
    nodes = tuple(dataclasses.replace(n, nic_bandwidth_gbps=b) for n, b in zip(tv.nodes, nics))
    return [(load_cluster("v100-t4-16"), load_model("llama-6l"), load_search("small")),
            (dataclasses.replace(tv, nodes=nodes, cross_vendor_bandwidth_gbps=3.0, cross_vendor_latency_ms=0.05),
             load_model("llama2-7b"), load_search("default"))]


def section_random(n: int) -> list[float]:
    errs = []
    for cluster, model, space in nic_clusters():
        pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})
        plans = draw_plans(cluster, model, space, n=4 * n, seed=0, distributed_optimizer=(True,), sequence_parallel=(True,))
        kept = [(p, r) for p in plans if not (r := simulate_plan(p, cluster, model, seed=0)).oom][:n]
        est = estimate_any_plans([p for p, _ in kept], cluster, model, pred)
        e = [abs(x.iteration_time_ms - r.iteration_time_ms) / r.iteration_time_ms for x, (_, r) in zip(est, kept)]
        errs += e
        cross = sum(1 for p, _ in kept if p.pp > 1 or p.dp > 1)
        print(f"{cluster.name} (NIC per node{', cross-vendor link' if cluster.cross_vendor_bandwidth_gbps else ''}) + "
              f"{model.name}: {len(kept)} random plans that run ({cross} with network traffic): closed form vs virtual "
              f"cluster time MAPE {100 * statistics.fmean(e):.1f} %")
    return errs


def _search_s(path: str) -> float:
    env = {**os.environ, "PYTHONPATH": path}
    out = subprocess.run([sys.executable, "-c", SEARCH_SNIPPET], env=env, capture_output=True, text=True, check=True,
                         cwd=path)
    return float(out.stdout.strip().splitlines()[-1])


def section_search(baseline: str | None, repeats: int) -> float | None:
    if baseline is None:
        return None
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ours, base = [], []
    for _ in range(repeats):  # interleaved, best of each (a shared machine)
        base.append(_search_s(baseline))
        ours.append(_search_s(here))
    ratio = min(ours) / min(base)
    print(f"search three-vendor-20 + llama2-7b + default (closed form): this tree {min(ours):.2f} s, baseline "
          f"{baseline} {min(base):.2f} s (best of {repeats}): ratio {ratio:.2f}")
    return ratio


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", type=int, default=20, help="random plans per cluster (section 2)")
    ap.add_argument("--baseline", default=None, help="a tree with today's code for the search-time ratio")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    t0 = time.perf_counter()
    old, new = section_pure_dp()
    rnd = section_random(args.plans)
    ratio = section_search(args.baseline, args.repeats)
    print(f"network old_two_level_mape={100 * statistics.fmean(old):.1f} flat_mape={100 * statistics.fmean(new):.1f} "
          f"random_mape={100 * statistics.fmean(rnd):.1f} search_ratio={'n/a' if ratio is None else f'{ratio:.2f}'} "
          f"bench_s={time.perf_counter() - t0:.0f}")


if __name__ == "__main__":
    main()
