"""Closed-form stage model (no profiling) vs the virtual cluster: the earlier flat model and the
runtime-aware one, in the same process on the same sampled plans (issue 12).

Plans are drawn with memx.simulator.draw_plans from conf/search/default.yaml on several clusters and
models and measured once each with memx.simulator.simulate_plan (its own physics and traits,
conf/simulator). Both variants predict them through memx.planner.estimate.estimate_plans (the
search's signatures and 1F1B assembly).

Metrics per variant: memory MAPE over every GPU of every plan that ran (per-GPU peaks, as
memx.report.evaluate does), time MAPE over plans that ran, OOM called right over all plans
(feasible ⇔ measured without OOM) at the search's default reserve and at none, `unsafe` = share of
plans predicted to fit that ran out of memory, `mem_bias` = median predicted/measured peak.

Usage: PYTHONPATH=. .venv/bin/python bench/closed_form_accuracy.py [--plans 100] [--seed 7] [--options]
       [--assembly paper,cycle-mean,cycle-mean-drain]
`--options`: each plan draws the distributed optimizer and sequence parallelism on or off (issue #14).
`--assembly`: the 1F1B assemblies (SearchSpace.pipeline_assembly, issues #22 / #27) each variant is scored with,
on the same measured plans (default: the default assembly only); `time_bias` = median predicted/measured time.
Output: one line per case and variant, then one line per variant pooled over the paper's cases
(goals: mem_mape ≤ 0.10, time_mape ≤ 0.20, oom_right ≥ 0.95). gpt2-1024 on v100-t4-6 is printed as a
stress case (a 350M model: fixed per-process overheads dominate) and kept out of the pooled line.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from memx.domain.catalog import load_cluster, load_model, load_search  # noqa: E402
from memx.domain.specs import DEFAULT_PIPELINE_ASSEMBLY, PIPELINE_ASSEMBLIES  # noqa: E402
from memx.planner.cost import AnalyticStageModel  # noqa: E402
from memx.planner.estimate import estimate_plans  # noqa: E402
from memx.simulator import draw_plans, simulate_plan  # noqa: E402

PAPER_CASES = (("three-vendor-20", "llama2-7b"), ("three-vendor-20", "llama2-13b"), ("v100-t4-6", "llama-6l"),
               ("h100-h20-16", "llama2-13b"), ("h100-h20-16", "llama3-8b"))
STRESS_CASES = (("v100-t4-6", "gpt2-1024"),)
VARIANTS = {"flat (runtime=none)": "none", "runtime (catalog)": "catalog"}
RESERVE_GIB = 1.0  # conf/search/default.yaml reserve_gib


def measure(cluster_name: str, model_name: str, n: int, seed: int, options: bool = False):
    cluster, model = load_cluster(cluster_name), load_model(model_name)
    both = (False, True) if options else (False,)
    plans = draw_plans(cluster, model, load_search("default"), n=n, seed=seed, distributed_optimizer=both,
                       sequence_parallel=both)
    runs = [simulate_plan(p, cluster, model, seed=seed * 100_003 + i) for i, p in enumerate(plans)]
    return cluster, model, plans, runs


def errors(cluster, model, plans, runs, runtime: str, assembly: str = DEFAULT_PIPELINE_ASSEMBLY) -> dict[str, np.ndarray]:
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types}, runtime=runtime)
    est = estimate_plans(plans, cluster, model, pred, reserve_gib=RESERVE_GIB, pipeline_assembly=assembly)
    est0 = estimate_plans(plans, cluster, model, pred, reserve_gib=0.0, pipeline_assembly=assembly)
    oom = np.array([r.oom for r in runs])
    ok = np.flatnonzero(~oom)
    ratio = np.concatenate([np.asarray(est[i].peak_mem_mib) / np.asarray(runs[i].peak_mem_mib) for i in ok]) \
        if len(ok) else np.array([])
    t_ratio = np.array([est[i].iteration_time_ms / runs[i].iteration_time_ms for i in ok])
    feasible = np.array([e.feasible for e in est])
    return {"mem_ratio": ratio, "time_ape": np.abs(t_ratio - 1), "time_ratio": t_ratio, "oom_right": feasible == ~oom,
            "oom_right_0": np.array([e.feasible for e in est0]) == ~oom, "unsafe": feasible & oom}


def line(label: str, e: dict[str, np.ndarray]) -> str:
    r = e["mem_ratio"]
    return (f"{label:54s} plans={len(e['oom_right']):4d} ran={len(e['time_ape']):4d} "
            f"mem_mape={np.mean(np.abs(r - 1)):.4f} mem_bias={np.median(r):.3f} time_mape={np.mean(e['time_ape']):.4f} "
            f"oom_right={np.mean(e['oom_right']):.4f} oom_right_reserve0={np.mean(e['oom_right_0']):.4f} "
            f"unsafe={np.mean(e['unsafe']):.4f} time_bias={np.median(e['time_ratio']) if len(e['time_ratio']) else np.nan:.4f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plans", type=int, default=100, help="plans drawn per cluster and model")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--options", action="store_true", help="draw distributed optimizer / sequence parallel on or off")
    ap.add_argument("--assembly", default=DEFAULT_PIPELINE_ASSEMBLY,
                    help=f"comma-separated 1F1B assemblies to score with: {', '.join(PIPELINE_ASSEMBLIES)}")
    args = ap.parse_args()
    assemblies = [a for a in args.assembly.split(",") if a]
    if not assemblies or any(a not in PIPELINE_ASSEMBLIES for a in assemblies):
        ap.error(f"--assembly {args.assembly!r}; allowed: {', '.join(PIPELINE_ASSEMBLIES)}")
    variants = {(label if len(assemblies) == 1 else f"{label} {a}"): (runtime, a)
                for label, runtime in VARIANTS.items() for a in assemblies}
    t0 = time.perf_counter()
    pooled: dict[str, list[dict[str, np.ndarray]]] = {v: [] for v in variants}
    for case in PAPER_CASES + STRESS_CASES:
        measured = measure(*case, args.plans, args.seed, args.options)
        for label, (runtime, assembly) in variants.items():
            e = errors(*measured, runtime, assembly)
            print(line(f"{case[0]} {case[1]} {label}", e), flush=True)
            if case in PAPER_CASES:
                pooled[label].append(e)
    for label, parts in pooled.items():
        e = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        print(line(f"ALL paper cases {label}", e))
    print(f"elapsed {time.perf_counter() - t0:.1f}s")


if __name__ == "__main__":
    main()
