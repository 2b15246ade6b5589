"""A data-parallel degree per stage (issue #27): MemX with and without `stage_data_parallel` on Metis' side-by-side
problem, the closed form against the virtual cluster on random per-stage-dp plans, and the search time ratio.

Side by side: 4 × A100-80G + 12 × V100-32G (conf/clusters/a100-v100-16.yaml) / llama2-7b (Metis' problem), h100-h20-16 and
/ llama2-7b and v100-t4-6 / llama-6l, conf/search/default.yaml
with `stage_data_parallel` false (today's space) and true (the opt-in per-stage-dp space beside it), both
through memx.planner.launcher.launcher_search (what `memx plan` runs) with the runtime-aware closed form; each
pick simulated on the virtual cluster (memx.simulator.simulate_plan, 3 seeds). Also the best per-stage-dp plan on
its own (memx.planner.stage_dp_search.search_stage_dp), predicted and simulated.

Accuracy: random per-stage-dp plans — a random layout of the per-stage-dp space (stage_dp_search.layouts: a
(tp, dp) per GPU type with different dp, any type order and micro batch), a uniformly random layer split and a
random recomputation per stage — predicted by estimate_plans (memx.planner.stage_dp) and simulated once each
(memx.simulator.stage_dp, its own hand-off and schedule). Baseline: as many plans with one dp drawn by
memx.simulator.draw_plans from the same search on the same cluster — the stage model's own error there.

Usage: PYTHONPATH=. .venv/bin/python bench/stage_dp.py [--plans 150] [--seed 5]
       PYTHONPATH=. .venv/bin/python bench/stage_dp.py --accuracy-only   (the random-plan rows only)
       PYTHONPATH=. .venv/bin/python bench/stage_dp.py --time a100-v100-16 h100-h20-16 three-vendor-20 [--model M]
                                                        [--search moe]
       PYTHONPATH=. .venv/bin/python bench/stage_dp.py --new-dims [--plans 100]   (issue #27: with cp, tied embeddings)
(`--time`: only the search time, CPU s, the best of 2 runs each way interleaved in this process, with and without the
option, and the ratio; goal ≤ 3×.)
`--new-dims`: the accuracy rows on random per-stage-dp plans with context parallelism (a random layout of the space
with context_parallel_options [1, 2, 4] whose cp > 1), with tied embeddings (gpt-neo-2.7b: the first ↔ last
all-reduce along FlagScale's pipeline paths, cp 1, 2 or 4) and with a mixture-of-experts model
(qwen1.5-moe-a2.7b) at ep 1 (session 14: every expert on every rank of a stage, cp 1, 2 or 4) and at ep > 1
(session 15: expert_parallel_options [1, 2, 4], plans whose ep > 1, each stage's ep groups of its own, an ep per
mesh where the layout draws one — FlagScale's), and the
per-stage-dp search's CPU time (stage_dp_search.search_stage_dp, conf/search/default.yaml) with
context_parallel_options [1, 2] and [1, 2, 4] against [1] (today's per-stage-dp space), and for the MoE model with
expert_parallel_options [1, 2] and [1, 2, 4] against [1], the best of 2 runs each, interleaved; goal ≤ 3×.
`--kinds 'MoE at ep > 1'` runs only those kinds' accuracy rows.
Goals: time_mape ≤ 0.10, mem_mape ≤ 0.10, oom_right ≥ 0.95 per case.
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

from memx.domain.catalog import load_cluster, load_model, load_search  # noqa: E402
from memx.domain.plan import Recompute, plan_to_dict, plan_to_json  # noqa: E402
from memx.domain.stage_dp import stage_eps  # noqa: E402
from memx.planner.baselines.metis import METIS  # noqa: E402
from memx.planner.cost import AnalyticStageModel  # noqa: E402
from memx.planner.launcher import launcher_search  # noqa: E402
from memx.planner.stage_dp_search import layouts, search_stage_dp  # noqa: E402
from memx.report.notation import compact_stages, dp_text  # noqa: E402
from memx.simulator import draw_plans, simulate_plan  # noqa: E402

from bench.interleave import errors  # noqa: E402  (the accuracy figures of issue #27's other benches)

SIDE_BY_SIDE = (("a100-v100-16", "llama2-7b"), ("h100-h20-16", "llama2-7b"), ("v100-t4-6", "llama-6l"))
CASES = (("a100-v100-16", "llama2-7b"), ("h100-h20-16", "llama2-7b"), ("a100-t4-16", "llama2-7b"))


def random_plans(cluster, model, space, n: int, seed: int, keep=lambda probe: True):
    rnd = random.Random(seed)
    probes = [p for p in layouts(cluster, model, space) if keep(p)]
    out = []
    while len(out) < n:
        probe = rnd.choice(probes)
        cuts = sorted(rnd.sample(range(1, model.layers), probe.pp - 1))
        split = [b - a for a, b in zip([0, *cuts], [*cuts, model.layers])]
        stages = []
        for st, k in zip(probe.stages, split):
            kind = rnd.choice(["none", "selective", "full", "block"])
            rc = (Recompute.FULL, rnd.randint(1, k - 1)) if kind == "block" and k > 1 else (
                Recompute(kind if kind != "block" else "full"), None)
            stages.append(dataclasses.replace(st, layers=k, recompute=rc[0], recompute_layers=rc[1]))
        out.append(dataclasses.replace(probe, stages=tuple(stages)))
    return out


def simulated(plan, cluster, model) -> str:
    runs = [simulate_plan(plan, cluster, model, seed=s) for s in range(3)]
    if any(r.oom for r in runs):
        return "OOM on the virtual cluster"
    t = np.mean([r.iteration_time_ms for r in runs])
    return f"simulated {t:,.0f} ms, peak {max(runs[0].peak_mem_mib) / 1024:.1f} GiB"


def side_by_side(cname: str, mname: str) -> None:
    cluster, model, space = load_cluster(cname), load_model(mname), load_search("default")
    print(f"== {cname} / {mname}, conf/search/default.yaml", flush=True)
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types}, runtime="catalog")
    times = {}
    for on in (False, True):
        sp = dataclasses.replace(space, stage_data_parallel=on)
        best, r = float("inf"), None
        for _ in range(3):
            t0 = time.perf_counter()
            r = launcher_search(cluster, model, sp, pred)
            best = min(best, time.perf_counter() - t0)
        times[on] = best
        c = r.chosen
        print(f"stage_data_parallel={on!s:5} search {best:6.2f} s  pick {c.iteration_time_ms:,.0f} ms predicted, "
              f"margin {c.min_margin:.1%}; {simulated(c.plan, cluster, model)}"
              + (f"; per-stage-dp layouts {r.timings['stage_dp_layouts']:.0f}, re-scored {r.timings['stage_dp_plans']:.0f}"
                 if on else ""), flush=True)
        print(f"  {plan_to_json(c.plan)}", flush=True)
    print(f"search time ratio (with / without) {times[True] / times[False]:.2f}x", flush=True)
    m, high = search_stage_dp(cluster, model, space, pred)
    print(f"best per-stage-dp plan alone: {m.iteration_time_ms:,.0f} ms predicted, margin {high:.1%}; "
          f"{simulated(m.plan, cluster, model)}\n  {plan_to_json(m.plan)}", flush=True)
    for on in (False, True):  # the Metis-like baseline (its memory estimate, no recompute, time only)
        pk = METIS.plan(cluster, model, dataclasses.replace(space, stage_data_parallel=on), pred)
        d = plan_to_dict(pk.plan)
        print(f"Metis-like, stage_data_parallel={on!s:5}: {pk.predicted_time_ms:,.0f} ms predicted; "
              f"{simulated(pk.plan, cluster, model)}; {compact_stages(d)}, dp {dp_text(d)}", flush=True)


def timing(cname: str, mname: str = "llama2-7b", search_name: str = "default") -> None:
    """CPU s of launcher_search with and without stage_data_parallel (conf/search/<search_name>.yaml), interleaved."""
    cluster, model, space = load_cluster(cname), load_model(mname), load_search(search_name)
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types}, runtime="catalog")
    cpu: dict[bool, list[float]] = {False: [], True: []}
    for on in (False, True, False, True):
        t0 = time.process_time()
        r = launcher_search(cluster, model, dataclasses.replace(space, stage_data_parallel=on), pred)
        cpu[on].append(time.process_time() - t0)
    off, on = min(cpu[False]), min(cpu[True])
    print(f"{cname} / {mname}: search {off:.2f} CPU s without, {on:.2f} with (ratio {on / off:.2f}x); pick "
          f"{r.chosen.iteration_time_ms:,.0f} ms, dp {dp_text(plan_to_dict(r.chosen.plan))}", flush=True)


NEW_DIMS = (("a100-v100-16", "llama2-7b", "cp > 1"), ("h100-h20-16", "llama2-7b", "cp > 1"),
            ("a100-t4-16", "llama2-7b", "cp > 1"), ("a100-v100-16", "gpt-neo-2.7b", "tied"),
            ("h100-h20-16", "gpt-neo-2.7b", "tied"), ("h100-h20-16", "qwen1.5-moe-a2.7b", "MoE at ep 1"),
            ("three-vendor-20", "qwen1.5-moe-a2.7b", "MoE at ep 1"),
            ("h100-h20-16", "qwen1.5-moe-a2.7b", "MoE at ep > 1"), ("three-vendor-20", "qwen1.5-moe-a2.7b", "MoE at ep > 1"))
EP_OPTIONS = (1, 2, 4)  # conf/search/moe.yaml's expert_parallel_options
# the search-time rows: (cluster, model, option, its values today, with the new dimension)
TIME_ROWS = (("a100-v100-16", "llama2-7b", "context_parallel_options", (1,), ((1, 2), (1, 2, 4))),
             ("h100-h20-16", "llama2-7b", "context_parallel_options", (1,), ((1, 2), (1, 2, 4))),
             ("a100-v100-16", "gpt-neo-2.7b", "context_parallel_options", (1,), ((1, 2), (1, 2, 4))),
             ("h100-h20-16", "qwen1.5-moe-a2.7b", "expert_parallel_options", (1,), ((1, 2), EP_OPTIONS)))


def new_dims(n: int, seed: int, kinds: set[str] | None = None) -> None:
    """Issue #27's combined dims: accuracy on random per-stage-dp plans with cp / tied embeddings / MoE, and search
    time (`kinds`: only these NEW_DIMS kinds and no search time)."""
    for cname, mname, kind in (d for d in NEW_DIMS if kinds is None or d[2] in kinds):
        cluster, model = load_cluster(cname), load_model(mname)
        space = dataclasses.replace(load_search("default"), context_parallel_options=(1, 2, 4))
        if kind == "MoE at ep > 1":
            space = dataclasses.replace(space, expert_parallel_options=EP_OPTIONS)
        keep = {"cp > 1": lambda p: p.context_parallel > 1, "MoE at ep > 1": lambda p: p.expert_parallel > 1}.get(
            kind, lambda p: True)
        plans = random_plans(cluster, model, space, n, seed, keep)
        mixed = sum(len(set(stage_eps(p))) > 1 for p in plans)  # FlagScale's per-mesh ep (session 15)
        dims = (f"cp {sorted({p.context_parallel for p in plans})}, ep {sorted({e for p in plans for e in stage_eps(p)})}"
                f", {mixed} with an ep per stage")
        print(f"{cname} {mname} per-stage dp, {kind} ({dims})  {errors(plans, cluster, model)}", flush=True)
        uniform = draw_plans(cluster, model, space, n=n, seed=seed)  # the stage model's own error, one dp, same space
        print(f"{cname} {mname} one dp (drawn, same options) {errors(uniform, cluster, model)}", flush=True)
    if kinds is not None:
        return
    for cname, mname, field, today, wider in TIME_ROWS:
        cluster, model, space = load_cluster(cname), load_model(mname), load_search("default")
        pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types}, runtime="catalog")
        cpu: dict[tuple, list[float]] = {}
        for _ in range(2):
            for values in (today, *wider):
                sp = dataclasses.replace(space, **{field: values})
                t0 = time.process_time()
                best, _ = search_stage_dp(cluster, model, sp, pred)
                cpu.setdefault(values, []).append(time.process_time() - t0)
                cpu.setdefault(("n", values), [len(layouts(cluster, model, sp))])
                cpu.setdefault(("pick", values), [best.iteration_time_ms, best.plan.context_parallel,
                                                  best.plan.expert_parallel])
        base = min(cpu[today])
        print(f"search_stage_dp {cname} / {mname}, {field}: " + "; ".join(
            f"{list(v)} {min(cpu[v]):.2f} CPU s ({min(cpu[v]) / base:.2f}x), {cpu[('n', v)][0]} layouts, "
            f"pick {cpu[('pick', v)][0]:,.0f} ms at cp {cpu[('pick', v)][1]}, ep {cpu[('pick', v)][2]}"
            for v in (today, *wider)), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plans", type=int, default=150)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--accuracy-only", action="store_true", help="the random-plan accuracy rows only")
    ap.add_argument("--time", nargs="+", metavar="CLUSTER", help="only the search-time ratio on these clusters")
    ap.add_argument("--model", default="llama2-7b", help="the model of --time (e.g. qwen1.5-moe-a2.7b: MoE at ep 1)")
    ap.add_argument("--search", default="default", help="the search space of --time (e.g. moe: expert parallelism)")
    ap.add_argument("--new-dims", action="store_true", help="issue #27's cp / tied-embedding / MoE rows and search time")
    ap.add_argument("--kinds", help="with --new-dims: only these kinds' accuracy rows, comma-separated (e.g. "
                                    "'MoE at ep > 1'), no search time")
    args = ap.parse_args()
    if args.new_dims:
        new_dims(args.plans, args.seed, set(args.kinds.split(",")) if args.kinds else None)
        return
    if args.time:
        for cname in args.time:
            timing(cname, args.model, args.search)
        return
    for cname, mname in ([] if args.accuracy_only else SIDE_BY_SIDE):
        side_by_side(cname, mname)
    for cname, mname in CASES:
        cluster, model = load_cluster(cname), load_model(mname)
        plans = random_plans(cluster, model, load_search("default"), args.plans, args.seed)
        print(f"{cname} {mname} per-stage dp  {errors(plans, cluster, model)}", flush=True)
        uniform = draw_plans(cluster, model, load_search("default"), n=args.plans, seed=args.seed)
        print(f"{cname} {mname} one dp (drawn) {errors(uniform, cluster, model)}", flush=True)


if __name__ == "__main__":
    main()
