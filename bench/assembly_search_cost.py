"""Search cost of the 1F1B assemblies (issues #22, #27): the default search (conf/search/default.yaml, closed form)
with `pipeline_assembly: paper`, `cycle-mean` and `cycle-mean-drain` (session 10), alternating in one process, CPU seconds per search (process time,
so the load of other processes counts less than wall time does), the plans scored, and the pick.

  PYTHONPATH=. .venv/bin/python bench/assembly_search_cost.py [--cluster three-vendor-20] [--model llama2-7b]
                                                             [--repeat 3]
Last line: drain_ratio=<cycle-mean-drain / paper>, cpu_ratio=<cycle-mean / paper, the medians> (goal ≤ 1.15).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from memx.domain.catalog import load_cluster, load_model, load_search  # noqa: E402
from memx.domain.specs import PIPELINE_ASSEMBLIES  # noqa: E402
from memx.planner.cost import AnalyticStageModel  # noqa: E402
from memx.planner.search import search  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cluster", default="three-vendor-20")
    ap.add_argument("--model", default="llama2-7b")
    ap.add_argument("--search", default="default")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    cluster, model = load_cluster(args.cluster), load_model(args.model)
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})
    base = load_search(args.search)
    cpu: dict[str, list[float]] = {a: [] for a in PIPELINE_ASSEMBLIES}
    search(cluster, model, base, pred)  # warm-up: imports, catalogs
    for _ in range(args.repeat):
        for a in PIPELINE_ASSEMBLIES:
            t0 = time.process_time()
            r = search(cluster, model, dataclasses.replace(base, pipeline_assembly=a), pred)
            cpu[a].append(time.process_time() - t0)
            c = r.chosen
            print(f"{a:16s} cpu_s={cpu[a][-1]:.2f} scored={r.space.scored} evaluated={r.space.evaluated} "
                  f"pick T={c.iteration_time_ms:,.1f} ms pp={c.plan.pp} layers={[s.layers for s in c.plan.stages]}",
                  flush=True)
    med = {a: statistics.median(v) for a, v in cpu.items()}
    print(f"median cpu_s paper={med['paper']:.2f} cycle-mean={med['cycle-mean']:.2f} "
          f"cycle-mean-drain={med['cycle-mean-drain']:.2f} drain_ratio={med['cycle-mean-drain'] / med['paper']:.3f} "
          f"cpu_ratio={med['cycle-mean'] / med['paper']:.3f}")


if __name__ == "__main__":
    main()
