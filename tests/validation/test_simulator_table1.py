"""The paper's Table 1 story (§1) on xy-2 + llama2-7b: one vendor-X (≈300 TFLOPS, 32 GB) and one
vendor-Y (≈256 TFLOPS, 64 GB), pipeline of two stages, no recompute, micro batch 2, s 4096.

- The compute-proportional split 21:11 runs out of memory on the 32 GB X (and only there).
- The memory-feasible split (most layers X can hold) is near the paper's 8:24 (we accept 6–10), and
  leaves X idle most of the cycle (paper: X busy ≈ 41 % of Y's time; we require X busy < 50 %).
- Memory is what costs the time: with unlimited memory on X, 21:11 would be faster.

Adam states for 7B (18 B/param = 126 GB) do not fit the pair's 96 GB at any split, so the paper's
runs must have kept optimizer state off the GPUs; we simulate that with 4 B/param on the GPU
(bf16 weights + bf16 grads, optimizer offloaded) — stated assumption.
"""

from __future__ import annotations

import dataclasses

from memx.domain.catalog import load_cluster, load_model
from memx.domain.plan import Plan, Stage
from memx.simulator import simulate_plan
from memx.domain.specs import Cluster, Node

OFFLOADED = 4.0


def split(k: int, cluster: str = "xy-2") -> Plan:
    return Plan(model="llama2-7b", cluster=cluster, global_batch=16, micro_batch=2, seq_len=4096, dp=1,
                stages=(Stage(gpu="vendor-x-32g", tp=1, layers=k), Stage(gpu="vendor-y-64g", tp=1, layers=32 - k)))


def test_table1_story():
    cluster, model = load_cluster("xy-2"), load_model("llama2-7b")
    compute = simulate_plan(split(21), cluster, model, static_bytes_per_param=OFFLOADED)
    assert compute.oom and compute.oom_gpus == (0,)
    assert simulate_plan(split(21), cluster, model).oom_gpus == (0,)  # with Adam on the GPU too
    fits = [k for k in range(1, 32) if not simulate_plan(split(k), cluster, model,
                                                          static_bytes_per_param=OFFLOADED).oom]
    k_mem = max(fits)
    feasible = simulate_plan(split(k_mem), cluster, model, static_bytes_per_param=OFFLOADED)
    x_busy = feasible.stage_busy_fraction[0]
    print(f"memory-feasible split {k_mem}:{32 - k_mem}; X busy {100 * x_busy:.0f}% of the iteration "
          f"(idle {100 * (1 - x_busy):.0f}%, paper ≈59%)")
    assert 6 <= k_mem <= 10
    assert x_busy < 0.5 and feasible.stage_busy_fraction[1] > 0.9
    big_x = dataclasses.replace(cluster.nodes[0].gpu, memory_gib=1024)
    roomy = Cluster(name="xy-2", inter_node_bandwidth_gbps=cluster.inter_node_bandwidth_gbps,
                    nodes=(Node(gpu=big_x, count=1), cluster.nodes[1]))
    unconstrained = simulate_plan(split(21), roomy, model, static_bytes_per_param=OFFLOADED)
    assert unconstrained.iteration_time_ms < feasible.iteration_time_ms
