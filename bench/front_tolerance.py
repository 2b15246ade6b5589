"""The front's tolerance (issue #26, SearchSpace.front_tolerance): each case searched with the front over the whole
max_time_ratio window (front_tolerance null, the engine before) and with the shipped tolerance, in one process.

Cases: three-vendor-20 / llama2-7b (the default plan), h100-mi300x-32 / llama2-70b, a100-v100-16 / llama2-7b (the
peer-comparison cluster) and h100-h20-16 / llama3-8b, each under every floor rule (the tolerance applies to them; phi
and phi-bounded always keep the whole window), closed form, top 10. Printed per case and rule: plans scored and CPU
seconds of each, their ratio (tolerance / null), whether the pick, the safe set and the top-k sets are the same (they
must be), and the front's points (null, and cut). The deep case (llama3-405b, mixed-1024, max_pp 16) is
bench/dask_search.py's, with `--front-tolerance`.

Usage: PYTHONPATH=. .venv/bin/python bench/front_tolerance.py [--tolerance 0.10] [--repeat 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import time

CASES = (("three-vendor-20", "llama2-7b"), ("h100-mi300x-32", "llama2-70b"), ("a100-v100-16", "llama2-7b"),
         ("h100-h20-16", "llama3-8b"))
RULES = ("balanced-front", "fastest-above-floor", "balanced-phi", "balanced-margin")


def _keys(ms) -> list:
    return [m.plan for m in ms]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tolerance", type=float, default=None, help="the tolerance (default: the shipped search's)")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each search; the least CPU is printed")
    args = ap.parse_args()

    from memx.domain.catalog import load_cluster, load_model, load_search
    from memx.planner.cost import AnalyticStageModel
    from memx.planner.search import search

    base = load_search("default")
    tol = base.front_tolerance if args.tolerance is None else args.tolerance
    ratios, same_all = [], True
    for cname, mname in CASES:
        cl, mo = load_cluster(cname), load_model(mname)
        pred = AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types})
        for rule in RULES:
            runs = {}
            for label, t in (("null", None), ("tol", tol)):
                sp = dataclasses.replace(base, pick_rule=rule, front_tolerance=t)
                best = None
                for _ in range(args.repeat):
                    c0 = time.process_time()
                    r = search(cl, mo, sp, pred, top_k=10)
                    cpu = time.process_time() - c0
                    best = (r, cpu) if best is None or cpu < best[1] else best
                runs[label] = best
            (a, ca), (b, cb) = runs["null"], runs["tol"]
            same = (a.chosen.plan == b.chosen.plan and _keys(a.safe) == _keys(b.safe) and _keys(a.top) == _keys(b.top)
                    and _keys(a.top_time) == _keys(b.top_time))
            same_all &= same
            ratios.append(cb / ca)
            print(f"{cname}/{mname} {rule}: scored {a.space.scored:,} -> {b.space.scored:,} cpu_s {ca:.2f} -> {cb:.2f} "
                  f"ratio={cb / ca:.2f} front {len(a.pareto)} -> {len(b.pareto)} same={'yes' if same else 'no'}",
                  flush=True)
    print(f"tolerance {tol}: cpu ratio min {min(ratios):.2f} max {max(ratios):.2f}; same pick, safe and top sets: "
          f"{'yes' if same_all else 'no'}")


if __name__ == "__main__":
    main()
