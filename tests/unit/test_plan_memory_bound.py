"""Issue #14 acceptance: a memory-bound case the distributed optimizer makes feasible, with the closed
form and the simulator agreeing. llama2-70b (69.0 G params) on conf/clusters/vendor-b-128.yaml: 128 ×
32 GB in nodes of 4, so tp ≤ 4 and (default search) pp ≤ 8: tp·pp ≤ 32 and the replicated model states
alone are ≥ 18 B × 69.0 G / 32 = 36.1 GiB per GPU (Megatron-LM dist_optimizer docs: 18 B/param bf16 +
fp32 grads + Adam). With the distributed optimizer at dp 4: 6 + 12/4 = 9 B/param, 18.1 GiB."""

from __future__ import annotations

import dataclasses

import pytest

from memx.domain.catalog import load_cluster, load_model
from memx.domain.plan import Plan, Recompute, Stage
from memx.planner.cost import AnalyticStageModel
from memx.planner.estimate import estimate_plans
from memx.simulator import simulate_plan

def _plan(tp: int, pp: int, **options) -> Plan:
    dp = 128 // (tp * pp)
    split = [80 // pp + (1 if s < 80 % pp else 0) for s in range(pp)]
    return Plan(model="llama2-70b", cluster="vendor-b-128", global_batch=128, micro_batch=1, seq_len=4096, dp=dp,
                stages=tuple(Stage(gpu="vendor-b-32g", tp=tp, layers=n, recompute=Recompute.FULL) for n in split),
                **options)


def test_no_plan_fits_without_the_distributed_optimizer_and_one_does_with_it():
    cluster, model = load_cluster("vendor-b-128"), load_model("llama2-70b")
    assert max(n.count for n in cluster.nodes) == 4
    # every shape with tp ≤ 4 (a node), pp ≤ 8, dp = 128 / (tp·pp), the least memory (full recompute, micro batch 1)
    shapes = [(tp, pp) for tp in (1, 2, 4) for pp in range(1, 9) if 128 % (tp * pp) == 0]
    plans = [_plan(tp, pp) for tp, pp in shapes]
    model_ = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})
    plain = estimate_plans(plans, cluster, model, model_)
    assert not any(m.feasible for m in plain)
    assert min(max(m.stage_peak_mib) for m in plain) / 1024 > 36.0  # ≥ the 36.1 GiB of model states
    do = estimate_plans([dataclasses.replace(p, distributed_optimizer=True) for p in plans], cluster, model, model_)
    fits = {s: m for s, m in zip(shapes, do) if m.feasible}
    assert (4, 8) in fits  # dp 4: 9 B/param
    peak = max(fits[(4, 8)].stage_peak_mib) / 1024
    print(f"closed form, tp 4 pp 8 dp 4 full: {max(plain[shapes.index((4, 8))].stage_peak_mib) / 1024:.1f} GiB "
          f"without, {peak:.1f} GiB with the distributed optimizer, {fits[(4, 8)].iteration_time_ms / 1e3:.1f} s")
    assert 18.0 < peak < 31.0


@pytest.mark.parametrize("do", [False, True])
def test_the_simulator_agrees(do):
    cluster, model = load_cluster("vendor-b-128"), load_model("llama2-70b")
    run = simulate_plan(_plan(4, 8, distributed_optimizer=do), cluster, model)
    mib = run.demand_mem_mib if run.oom else run.peak_mem_mib
    print(f"simulator, tp 4 pp 8 dp 4 full, DO {do}: {max(mib) / 1024:.1f} GiB, oom {run.oom}, "
          f"{(run.iteration_time_ms or float('nan')) / 1e3:.1f} s")
    assert run.oom is (not do)
    assert max(mib) / 1024 > 45.0 if not do else max(mib) / 1024 < 31.0
    if not do:  # and no other shape fits either
        shapes = [(tp, pp) for tp in (1, 2, 4) for pp in range(1, 9) if 128 % (tp * pp) == 0]
        assert all(simulate_plan(_plan(tp, pp), cluster, model).oom for tp, pp in shapes)
