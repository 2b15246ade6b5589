"""Aceso on CSCS Clariden GH200 (sailor/aceso_clariden_summary.csv): OPT-350M (h 1024, L 24, s 2048,
16 heads), TP 4, micro batch 8, no recompute. Per-stage max_allocated falls with stage index
(41.4 / 31.7 / 21.7 / 11.5 GB at PP=4): in 1F1B stage s holds min(pp − s, m) micro batches.

The GH200 is built here (96 GB HBM3, 989 TFLOPS, 4 TB/s, 150 GB/s NVLink per direction) with the
H100 traits and eager attention (Aceso's runtime has no fused attention). We compare the shape:
each stage's allocated memory divided by stage 0's, within 0.15 of the measured shares (the two PP=2 runs of the same
shape differ by 0.06 between themselves). Absolute
levels are ~45 % below Aceso's: its op-by-op runtime keeps unfused intermediates the simulator's
(Megatron-style) activation accounting does not (stated gap, docs/simulator.md).
"""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from memx.domain.plan import Plan, Stage
from memx.simulator import load_traits, simulate_plan
from memx.domain.specs import Cluster, GpuType, ModelArch, Node

GH200 = GpuType(name="gh200-96g", vendor="nvidia", memory_gib=96, peak_tflops_bf16=989,
                memory_bandwidth_gbps=4000, intra_node_bandwidth_gbps=150)
OPT350 = ModelArch(name="opt-350m", layers=24, hidden=1024, ffn_hidden=4096, heads=16, query_groups=16,
                   vocab=50272, seq_len=2048, mlp="gelu")


@pytest.mark.parametrize("config", ["16-1024-4-4-8", "32-1024-8-4-8", "8-512-4-2-8", "16-1024-8-2-8"])
def test_per_stage_peak_memory_falls_with_stage_index(realdata, config):
    summary = pd.read_csv(realdata / "sailor" / "aceso_clariden_summary.csv").set_index("config")
    row = summary.loc[config]
    measured = [float(x) for x in str(row.per_stage_max_allocated_MB).split()]
    traits = dataclasses.replace(load_traits("h100-80g"), name="gh200", flash_attention=False)
    cluster = Cluster(name="clariden", inter_node_bandwidth_gbps=25,
                      nodes=tuple(Node(gpu=GH200, count=4) for _ in range(int(row.gpus) // 4)))
    pp, tp = int(row.pp), int(row.tp)
    plan = Plan(model=OPT350.name, cluster=cluster.name, global_batch=int(row.gbs), micro_batch=int(row.mbs_per_replica),
                seq_len=2048, dp=int(row.dp), stages=tuple(Stage(gpu=GH200.name, tp=tp, layers=24 // pp) for _ in range(pp)))
    run = simulate_plan(plan, cluster, OPT350, seed=0, traits={GH200.name: traits})
    assert not run.oom
    # allocator view: device peak minus context, without fragmentation
    alloc = [(run.peak_mem_mib[s * tp] - traits.context_memory_mib) / (1 + traits.fragmentation_fraction)
             for s in range(pp)]
    assert all(a > b for a, b in zip(alloc, alloc[1:]))
    shares = [a / alloc[0] for a in alloc]
    expected = [m / measured[0] for m in measured]
    print(config, "simulated shares", [round(x, 3) for x in shares], "Aceso", [round(x, 3) for x in expected])
    assert shares == pytest.approx(expected, abs=0.15)
