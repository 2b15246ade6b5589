"""The virtual cluster's gradient-norm barrier (issue #27; memx.simulator.step_sync): with Megatron-LM's
--clip-grad > 0 every rank of the grad-stats group waits for the last one's DP step, all-reduces one fp32 norm
(a tree of 2·⌈log2 n⌉ latency steps) and only then runs its Adam step. Each test fails on the code before the
barrier (which ended each stage at its own ready time + its own optimizer step)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from memx.domain.catalog import load_cluster, load_gpu, load_model
from memx.domain.plan import Plan, Stage, plan_from_dict
from memx.domain.specs import Cluster, Node
from memx.simulator import load_traits, simulate_plan
from memx.simulator.step_sync import grad_norm_ms, step_end

LAT = 0.05  # ms per message through a NIC


def _cluster(nodes: int = 4) -> Cluster:
    """`nodes` nodes of one A100 each: every rank of the grad-stats group on its own node."""
    return Cluster(name="a1x4", inter_node_bandwidth_gbps=25.0, inter_node_latency_ms=LAT,
                   nodes=(Node(gpu=load_gpu("a100-80g"), count=1),) * nodes)


def _traits() -> dict:
    return {"a100-80g": dataclasses.replace(load_traits("a100-80g"), noise_std_fraction=0.0)}


def _plan(dp: int, pp: int, **kw) -> Plan:
    layers = [6 // pp + (1 if s < 6 % pp else 0) for s in range(pp)]
    return Plan(model="llama-6l", cluster="a1x4", global_batch=16, micro_batch=1, seq_len=2048, dp=dp,
                stages=tuple(Stage(gpu="a100-80g", tp=1, layers=n) for n in layers), **kw)


def test_the_norm_all_reduce_is_a_latency_bound_tree():
    cluster, t = _cluster(), _traits()["a100-80g"]
    one_node = [(0, t)] * 4  # 4 ranks of one node: no network latency
    assert grad_norm_ms(cluster, one_node) == pytest.approx(2 * 2 * t.collective_step_latency_ms)
    spread = [(n, t) for n in range(4)] + [(0, t)]  # 5 ranks: ⌈log2 5⌉ = 3 steps each way
    assert grad_norm_ms(cluster, spread) == pytest.approx(2 * 3 * (t.collective_step_latency_ms + LAT))
    assert grad_norm_ms(cluster, [(0, t)]) == 0.0
    assert step_end([5.0, 9.0, 7.0], [3.0, 1.0, 2.0], 0.5) == 9.0 + 0.5 + 3.0
    assert step_end([5.0, 9.0, 7.0], [3.0, 1.0, 2.0], None) == 9.0 + 1.0  # --clip-grad 0: each after its own


def test_every_stage_steps_behind_the_last_ready_one():
    """pp 3 on 3 nodes, no noise: the barrier ends the iteration at max_s ready_s + norm + max_s o_s, which is
    the run without it plus what the barrier costs, never less."""
    cluster, tr, model = _cluster(3), _traits(), load_model("llama-6l")
    plan = _plan(dp=1, pp=3)
    free = simulate_plan(plan, cluster, model, traits=tr, grad_norm_barrier=False)
    held = simulate_plan(plan, cluster, model, traits=tr)
    t = tr["a100-80g"]
    norm = 2 * math.ceil(math.log2(3)) * (t.collective_step_latency_ms + LAT)
    assert held.iteration_time_ms > free.iteration_time_ms + norm - 1e-9
    # stage 0 finishes its last backward last (1F1B); stage 2's larger optimizer step (6 = 2 + 2 + 2 layers, the
    # last stage also holds the output layer) now waits for it
    o = held.optimizer_ms
    assert max(o) > o[0]
    assert held.iteration_time_ms == pytest.approx(free.iteration_time_ms + norm + max(o) - o[0], rel=1e-9)


def test_the_distributed_optimizer_widens_the_group_to_every_rank():
    """dp 2 × pp 2 on 4 nodes: the norm all-reduce spans the 2 ranks of one replica, or all 4 with the
    distributed optimizer (Megatron's grad-stats group is the whole world there)."""
    cluster, tr, model = _cluster(4), _traits(), load_model("llama-6l")
    t = tr["a100-80g"]
    step = t.collective_step_latency_ms + LAT
    for dist, ranks in ((False, 2), (True, 4)):
        plan = _plan(dp=2, pp=2, distributed_optimizer=dist)
        free = simulate_plan(plan, cluster, model, traits=tr, grad_norm_barrier=False)
        held = simulate_plan(plan, cluster, model, traits=tr)
        o = held.optimizer_ms
        extra = held.iteration_time_ms - free.iteration_time_ms
        assert extra >= 2 * math.ceil(math.log2(ranks)) * step - 1e-9
        assert extra <= 2 * math.ceil(math.log2(ranks)) * step + max(o) - min(o) + 1e-9


def test_a_per_stage_dp_plan_waits_for_its_slowest_mesh():
    """FlagScale's per-mesh dp (memx.simulator.stage_dp): the barrier holds there too, and only adds time."""
    cluster, model = load_cluster("a100-v100-16"), load_model("llama2-7b")
    plan = plan_from_dict({
        "model": "llama2-7b", "cluster": "a100-v100-16", "global_batch": 64, "micro_batch": 1, "seq_len": 4096,
        "dp": 2, "precision": "fp16",
        "stages": [{"gpu": "a100-80g", "tp": 2, "layers": 12, "recompute": "none", "data_parallel": 2},
                   {"gpu": "v100-32g", "tp": 4, "layers": 10, "recompute": "full", "data_parallel": 1},
                   {"gpu": "v100-32g", "tp": 4, "layers": 10, "recompute": "full", "data_parallel": 2}]})
    free = simulate_plan(plan, cluster, model, grad_norm_barrier=False)
    held = simulate_plan(plan, cluster, model)
    assert held.iteration_time_ms > free.iteration_time_ms
    assert held.iteration_time_ms - free.iteration_time_ms <= 1.0 + max(held.optimizer_ms)
