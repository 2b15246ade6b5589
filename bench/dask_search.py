"""Sharded search on Prefect's DaskTaskRunner: 2 local single-threaded worker processes against 1.

Scenario: three-vendor-20 + llama2-7b + conf/search/default.yaml with the analytic stage model
(the stage predictor does not matter for the engine's speed). Shards = (pp, GPU-type order).
Last line: workers1_s=<s> workers2_s=<s> speedup=<x>
"""

from __future__ import annotations

import json
import os
import tempfile
import time

os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="memx-bench-prefect-"))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


def main() -> None:
    from prefect import flow

    from flows.pipeline import dask_runner
    from flows.search import task_mapper
    from memx.planner.cost import AnalyticStageModel
    from memx.domain.catalog import load_cluster, load_model, load_search
    from memx.pipeline.steps import compute_search

    cl, mo, sp = load_cluster("three-vendor-20"), load_model("llama2-7b"), load_search("default")
    pred = AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types})
    timings, plans = {}, {}
    for workers in (1, 2):
        @flow(task_runner=dask_runner("local", workers=workers))
        def sharded():
            return compute_search(pred, cl, mo, sp, weights=None, top_k=5, mapper=task_mapper, shard_by="pp-order")

        t0 = time.perf_counter()
        out = sharded()
        timings[workers] = time.perf_counter() - t0
        obj = json.loads(out.files["plan.json"])
        plans[workers] = (obj["plan"], [e["plan"] for e in obj["top"]], obj["fastest"]["plan"], obj["space"])
        print(f"{workers} worker(s): {timings[workers]:.1f} s (search {out.manifest['search_s']} s, "
              f"{out.manifest['evaluated']:,} plans)")
    assert plans[1] == plans[2], "sharded results differ between 1 and 2 workers"
    print(f"workers1_s={timings[1]:.1f} workers2_s={timings[2]:.1f} speedup={timings[1] / timings[2]:.2f}")


if __name__ == "__main__":
    main()
