"""Runs of the minimal-set design vs the full grid for the default scenario (paper: 243 vs 100,000).

    .venv/bin/python bench/profile_cost.py [--cluster three-vendor-20] [--model llama2-7b] [--search default]

Prints per GPU type and in total; the last line is `runs=<n> full_grid=<n> reduction=<x>`. The
prediction error each design leads to comes with the predictor (issue 5).
"""

from __future__ import annotations

import argparse

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.profiling import profile


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", default="three-vendor-20")
    ap.add_argument("--model", default="llama2-7b")
    ap.add_argument("--search", default="default")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    r = profile(load_cluster(a.cluster), load_model(a.model), load_search(a.search), seed=a.seed)
    for gpu, n in r.runs_by_gpu.items():
        full = r.full_grid_by_gpu[gpu]
        print(f"{gpu}: runs={n} full_grid={full} reduction={full / n:.1f}")
    print(f"failed={r.failed} oom={r.oom} (OOM points mark the memory boundary)")
    print(f"runs={r.runs} full_grid={r.full_grid} reduction={r.full_grid / r.runs:.1f}")


if __name__ == "__main__":
    main()
