"""Learning curve of plan calibration (issue #16): error vs number of measured plans.

Truth: the virtual cluster (memx.simulator: draw_plans + simulate_plan, its own physics and traits).
Base predictor: the closed form (memx.planner.cost.AnalyticStageModel), `--runtime none` (the flat
model, default) or `catalog` (runtime-aware); or with `--profile-rows N` a learned predictor
(memx.learn.fit_predictor, default variant) trained on N single-stage runs measured on the virtual
cluster (stage signatures of the pool's plans, never of test plans). Plans are drawn from conf/search/default.yaml and each
measured once; the plans that ran are split into a fixed held-out test set (`--test`, never fitted)
and a pool; for each n in `--n` and each of `--seeds` seeds, n plans are drawn from the pool,
memx.learn.calibration.fit_plan_calibration is fitted on them — without the guard (the raw fit) and
with it (each part kept only when its leave-one-out error on the n plans beats the uncalibrated error)
— and the calibrated estimates (calibrated_estimates, the search's assembly) are scored on the test
set: time MAPE over test plans, memory MAPE over every GPU of every test plan. n counts measured plans
that ran (OOM rows carry no time or peak).

Usage: PYTHONPATH=. .venv/bin/python bench/learning_curve.py [--cluster three-vendor-20] [--model llama2-7b]
       [--runtime none] [--profile-rows N] [--plans 300] [--test 40] [--n 0 5 10 20 40] [--seeds 3] [--seed 7]
       [--residual on|off]
From 40 timed plans on the fit also tries the plan residual (memx.learn.residual; `--residual off`: the
parametric calibration alone, for the side-by-side in docs/benchmarks.md).
Output: one line per n and guard: mean (± spread over seeds) time and memory MAPE, the ratio to n = 0,
and (guarded) how many seeds kept the time / memory part.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from memx.domain.catalog import load_cluster, load_model, load_search  # noqa: E402
from memx.learn import fit_predictor  # noqa: E402
from memx.learn.calibration import calibrated_estimates, fit_plan_calibration  # noqa: E402
from memx.planner.cost import AnalyticStageModel  # noqa: E402
from memx.simulator import draw_plans, measure_stages, simulate_plan, stage_signatures  # noqa: E402


def measured(cluster, model, n: int, seed: int):
    plans = draw_plans(cluster, model, load_search("default"), n=n, seed=seed)
    runs = [simulate_plan(p, cluster, model, seed=seed * 100_003 + i) for i, p in enumerate(plans)]
    return [(p, r) for p, r in zip(plans, runs) if not r.oom]


def learned(cluster, model, plans, rows: int, seed: int):
    sigs = list({str(d): d for d in (s.to_dict() for p in plans for s in stage_signatures(p, model))}.values())
    pick = random.Random(seed).sample(sigs, min(rows, len(sigs)))
    return fit_predictor(measure_stages(pick, seed=seed, gpus=cluster), {g.name: g for g in cluster.gpu_types},
                         seed=seed)


def score(cluster, model, pred, cal, test) -> tuple[float, float]:
    est = calibrated_estimates([p for p, _ in test], cluster, model, pred, cal)
    t = np.mean([abs(e.iteration_time_ms - r.iteration_time_ms) / r.iteration_time_ms for e, (_, r) in zip(est, test)])
    m = np.mean(np.concatenate([np.abs(np.asarray(e.peak_mem_mib) / np.asarray(r.peak_mem_mib) - 1)
                                for e, (_, r) in zip(est, test)]))
    return float(t), float(m)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cluster", default="three-vendor-20")
    ap.add_argument("--model", default="llama2-7b")
    ap.add_argument("--runtime", default="none", choices=("none", "catalog"))
    ap.add_argument("--profile-rows", type=int, default=0, help="> 0: a learned predictor from this many stage runs")
    ap.add_argument("--plans", type=int, default=300, help="plans drawn (about half run on three-vendor-20)")
    ap.add_argument("--test", type=int, default=40, help="held-out plans that ran")
    ap.add_argument("--n", type=int, nargs="+", default=[0, 5, 10, 20, 40])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--residual", choices=("on", "off"), default="on",
                    help="the plan residual (memx.learn.residual, from 40 timed plans on): on = the library default")
    args = ap.parse_args()
    t0 = time.perf_counter()
    cluster, model = load_cluster(args.cluster), load_model(args.model)
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types}, runtime=args.runtime)
    ran = measured(cluster, model, args.plans, args.seed)
    random.Random(args.seed).shuffle(ran)
    test, pool = ran[:args.test], ran[args.test:]
    if len(pool) < max(args.n) or len(test) < args.test:
        sys.exit(f"only {len(ran)} of {args.plans} plans ran: raise --plans")
    label = f"closed form runtime={args.runtime}"
    if args.profile_rows:
        pred = learned(cluster, model, [p for p, _ in pool], args.profile_rows, args.seed)
        label = f"learned from {args.profile_rows} stage runs"
    print(f"{args.cluster} {args.model} {label}: {len(ran)} of {args.plans} plans ran, "
          f"test {len(test)}, pool {len(pool)}")
    base = None
    for n in args.n:
        for guard in ((False, True) if n else (False,)):
            scores, kept = [], [0, 0, 0]
            for s in range(args.seeds if n else 1):
                fit = random.Random(1000 * args.seed + s).sample(pool, n)
                cal = fit_plan_calibration([p for p, _ in fit], [r.iteration_time_ms for _, r in fit],
                                           [r.peak_mem_mib for _, r in fit], cluster, model, pred, guard=guard,
                                           residual=args.residual == "on")
                scores.append(score(cluster, model, pred, cal, test))
                kept[0] += bool(cal.time_guard and cal.time_guard.accepted)
                kept[1] += bool(cal.mem_guard and cal.mem_guard.accepted)
                kept[2] += cal.residual is not None
            t, m = np.mean(scores, axis=0)
            t_sd, m_sd = np.std(scores, axis=0)
            base = base or (t, m)
            tag = (f"guard kept time {kept[0]}/{len(scores)} mem {kept[1]}/{len(scores)} residual {kept[2]}/{len(scores)}"
                   if guard else f"no guard (residual {kept[2]}/{len(scores)})")
            print(f"n={n:3d} {tag:44s} time_mape={t:.4f} (±{t_sd:.4f}) mem_mape={m:.4f} (±{m_sd:.4f}) "
                  f"time_ratio_vs_0={t / base[0]:.3f} mem_ratio_vs_0={m / base[1]:.3f}", flush=True)
    print(f"elapsed {time.perf_counter() - t0:.1f}s")


if __name__ == "__main__":
    main()
