"""Search at production scale: plans scored, plans discarded by bound, wall seconds and peak RSS per case.

Every case runs in its own subprocess (peak RSS = that process's ru_maxrss, imports and catalogs
included), with the analytic stage model as `memx plan` uses it. `--full` also runs the reference
search that scores every plan (`search(..., exhaustive=True)`) where it finishes within `--full-timeout`
seconds, and prints the ratio of wall times and whether the pick, top-k and Pareto front agree.
Cases (issue #13) and the peak-RSS-against-space-size table (same model and cluster, growing space).
One line per case:
case=<name> evaluated=<n> scored=<n> discarded=<n> wall_s=<s> peak_rss_mib=<n> [full_s=<s> ratio=<x> same=<bool>]
`--fixed` instead times the search's fixed costs outside the boxes (CPU s of `enumerate_layouts`, `predict_tables`,
`prepare_many`), with `--baseline DIR` also for the source tree DIR (e.g. `git worktree add ../base main`) in the
same run: case=<name> layouts=<n> enum_cpu_s=<s> predict_cpu_s=<s> prepare_cpu_s=<s> [baseline_enum_cpu_s=<s> …]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

CASES = {  # name: (cluster, model, search, space changes)
    "llama2-7b/three-vendor-20": ("three-vendor-20", "llama2-7b", "default", {}),
    "llama3-70b/h100-mi300x-32": ("h100-mi300x-32", "llama3-70b", "default", {}),
    "llama3-405b/mixed-1024": ("mixed-1024", "llama3-405b", "default", {}),
    "llama2-13b/h100-mi300x-32": ("h100-mi300x-32", "llama2-13b", "default", {}),
}
DEEP = {  # 16-stage pipelines: the 3-D Pareto front near the fastest plans keeps many boxes (docs/planner.md)
    "llama3-405b/mixed-1024/max_pp=16": ("mixed-1024", "llama3-405b", "default", {"max_pp": 16}),
}
GROWTH = {  # peak RSS against space size: one model and cluster, growing max_pp
    f"llama2-7b/three-vendor-20/max_pp={pp}": ("three-vendor-20", "llama2-7b", "default", {"max_pp": pp})
    for pp in (3, 4, 5, 6, 7, 8)
}


def run_case(cluster: str, model: str, search_name: str, changes: dict, exhaustive: bool) -> dict:
    """In this process: one search; returns its figures (or the InfeasibleError message)."""
    import dataclasses

    from memx.domain.catalog import load_cluster, load_model, load_search
    from memx.domain.errors import InfeasibleError
    from memx.planner.cost import AnalyticStageModel
    from memx.planner.search import search

    cl, mo = load_cluster(cluster), load_model(model)
    sp = dataclasses.replace(load_search(search_name), **changes)
    pred = AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types})
    t0 = time.perf_counter()
    try:
        r = search(cl, mo, sp, pred, top_k=10, exhaustive=exhaustive)
    except InfeasibleError as exc:
        return {"error": str(exc), "wall_s": time.perf_counter() - t0, "peak_rss_mib": _rss_mib()}
    wall = time.perf_counter() - t0

    def plans(cands):
        return [json.dumps([c.plan.dp, c.plan.micro_batch, [list(map(str, (s.gpu, s.tp, s.layers, s.recompute,
                                                                             s.recompute_layers))) for s in c.plan.stages]])
                for c in cands]

    return {"evaluated": r.space.evaluated, "scored": r.space.scored, "discarded": r.space.discarded, "wall_s": wall,
            "peak_rss_mib": _rss_mib(), "answer": [plans(r.top), plans(r.top_time), plans(r.pareto)],
            "medians_sample": r.refs_sample, "pick_ms": r.best.iteration_time_ms}


def fixed_costs(cluster: str, model: str, search_name: str, changes: dict) -> dict:
    """In this process: CPU seconds of the layout enumeration, the stage tables' prediction and the layouts'
    preparation of one case (memx.planner.search.search's first step)."""
    import dataclasses

    from memx.domain.catalog import load_cluster, load_model, load_search
    from memx.planner.cost import AnalyticStageModel
    from memx.planner.predictions import predict_tables
    from memx.planner.prepared import layout_contexts, prepare_many
    from memx.planner.schedule import assembly_of
    from memx.planner.space import enumerate_layouts

    cl, mo = load_cluster(cluster), load_model(model)
    sp = dataclasses.replace(load_search(search_name), **changes)
    pred = AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types})
    seq = sp.seq_len or mo.seq_len
    t0 = time.process_time()
    lays = enumerate_layouts(cl, mo, sp)
    t1 = time.process_time()
    pt = predict_tables(layout_contexts(lays, mo.layers), cl, mo, seq, sp.recompute_levels, sp.reserve_gib, pred)
    t2 = time.process_time()
    prepare_many(lays, pt, cl, mo, seq, sp.max_stage_slowdown, assembly_of(pred))
    t3 = time.process_time()
    return {"layouts": len(lays), "enum_cpu_s": t1 - t0, "predict_cpu_s": t2 - t1, "prepare_cpu_s": t3 - t2}


def _fixed_line(name: str, spec: tuple, baseline: str | None) -> str:
    code = ("import json, runpy, sys; fixed_costs = runpy.run_path(sys.argv[2])['fixed_costs']; "
            "print(json.dumps(fixed_costs(*json.loads(sys.argv[1]))))")  # this file's function, the tree's memx
    runs = [("", None)] + ([("baseline_", baseline)] if baseline else [])
    parts = [f"case={name}"]
    for prefix, tree in runs:
        env = dict(os.environ, PYTHONPATH=tree or os.environ.get("PYTHONPATH", os.getcwd()))
        out = subprocess.run([sys.executable, "-c", code, json.dumps(list(spec)), os.path.abspath(__file__)], capture_output=True,
                             text=True, check=True, env=env, cwd=tree)  # -c puts the cwd first on sys.path
        got = json.loads(out.stdout.strip().splitlines()[-1])
        parts += [f"{prefix}{k}={v:.2f}" if isinstance(v, float) else f"{prefix}{k}={v}" for k, v in got.items()]
    return " ".join(parts) + f" load={os.getloadavg()[0]:.1f}"


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _subprocess(spec: tuple, exhaustive: bool, timeout: float) -> dict | None:
    code = ("import json, sys; from bench.search_scale import run_case; "
            f"print(json.dumps(run_case(*json.loads(sys.argv[1]), exhaustive={exhaustive})))")
    try:
        out = subprocess.run([sys.executable, "-c", code, json.dumps(list(spec))], capture_output=True, text=True,
                             timeout=timeout, check=True)
    except subprocess.TimeoutExpired:
        return None
    except subprocess.CalledProcessError as exc:
        return {"error": exc.stderr.strip().splitlines()[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="all", help="comma-separated case names, 'all', 'growth' or 'deep'")
    ap.add_argument("--full", action="store_true", help="also run the full enumeration where it finishes")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--full-timeout", type=float, default=900.0)
    ap.add_argument("--fixed", action="store_true", help="time the fixed costs outside the boxes instead")
    ap.add_argument("--baseline", help="with --fixed: also time this source tree's (a checkout's root directory)")
    args = ap.parse_args()
    table = {**CASES, **GROWTH, **DEEP}
    names = (list(CASES) if args.cases == "all" else list(GROWTH) if args.cases == "growth"
             else list(DEEP) if args.cases == "deep" else args.cases.split(","))
    for name in names:
        spec = table[name]
        if args.fixed:
            print(_fixed_line(name, spec, args.baseline), flush=True)
            continue
        got = _subprocess(spec, False, args.timeout)
        if got is None:
            print(f"case={name} timeout_s={args.timeout:.0f}", flush=True)
            continue
        if "evaluated" not in got:
            print(f"case={name} wall_s={got.get('wall_s', 0):.2f} peak_rss_mib={got.get('peak_rss_mib', 0):.0f} "
                  f"error={got['error']!r}", flush=True)
            continue
        line = (f"case={name} evaluated={got['evaluated']} scored={got['scored']} discarded={got['discarded']} "
                f"wall_s={got['wall_s']:.2f} peak_rss_mib={got['peak_rss_mib']:.0f} medians_sample={got['medians_sample']}")
        if args.full:
            ref = _subprocess(spec, True, args.full_timeout)
            line += (f" full_s>{args.full_timeout:.0f}" if ref is None else
                     f" full_s={ref['wall_s']:.2f} full_rss_mib={ref['peak_rss_mib']:.0f} "
                     f"ratio={ref['wall_s'] / got['wall_s']:.1f} same={ref['answer'] == got['answer']}")
        print(line, flush=True)


if __name__ == "__main__":
    main()
