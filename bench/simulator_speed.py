"""Simulator throughput: stage runs per second and plan runs per second.

The plan figure is a 300-plan sample of three-vendor-20 + llama2-7b (draw + validate + simulate);
the issue requires it to take < 60 s on 2 cores. Stage runs are fresh signatures (no cache hits).
Last line: `stage_runs_per_s=<n> plan_runs_per_s=<n>`.
"""

from __future__ import annotations

import time

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.simulator import measure_stages
from memx.simulator.stage import stage_cost

N_PLANS = 300


def stage_rows(n: int) -> list[dict]:
    rows = []
    for i in range(n):
        rows.append(dict(gpu=("a100-80g", "vendor-b-32g", "vendor-c-32g")[i % 3], tp=(1, 2, 4, 8)[i % 4],
                         layers=1 + i % 16, micro_batch=1 + (i // 7) % 4, seq_len=1024 * (1 + (i // 5) % 4),
                         recompute=("none", "selective", "full")[i % 3], recompute_layers=None, first=i % 11 == 0,
                         last=i % 13 == 0, inflight=1 + (i // 3) % 8, hidden=4096, ffn_hidden=11008, heads=32,
                         query_groups=32, vocab=32000, mlp="swiglu"))
    return rows


def main() -> None:
    from memx.simulator import sample_plans

    rows = stage_rows(3000)
    stage_cost.cache_clear()
    t0 = time.perf_counter()
    measure_stages(rows, seed=0)
    stage_s = time.perf_counter() - t0

    cluster, model, search = load_cluster("three-vendor-20"), load_model("llama2-7b"), load_search("default")
    stage_cost.cache_clear()
    t0 = time.perf_counter()
    df = sample_plans(cluster, model, search, n=N_PLANS, seed=0)
    plan_s = time.perf_counter() - t0
    print(f"stage runs: {len(rows)} in {stage_s:.2f} s")
    print(f"plan runs: {len(df)} plans of three-vendor-20 + llama2-7b in {plan_s:.2f} s "
          f"({int(df.oom.sum())} OOM; limit 60 s)")
    print(f"stage_runs_per_s={len(rows) / stage_s:.0f} plan_runs_per_s={len(df) / plan_s:.0f}")


if __name__ == "__main__":
    main()
