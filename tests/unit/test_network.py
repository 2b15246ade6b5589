"""Network per node and the flat DP collective (issue #23), against hand calculations: the NCCL ring
all-reduce 2(n−1)/n · S / B at the ring's slowest hop, GPUs of a node sharing its NICs, the cross-vendor
link — in the closed form (memx.planner.network, memx.planner.replicas) and, independently, in the virtual
cluster (memx.simulator.links, memx.simulator.cross_sync)."""

from __future__ import annotations

import dataclasses

import pytest

from memx.domain.catalog import load_cluster, load_gpu, load_model
from memx.domain.groups import GroupedPlan, ReplicaGroup, group_plans, shared_partition
from memx.domain.plan import Plan, Stage
from memx.domain.specs import Cluster, Node
from memx.domain.precision import GRAD_BYTES
from memx.planner.cost import AnalyticStageModel
from memx.planner.network import pair_link, ring_link
from memx.planner.network import achieved
from memx.planner.replicas import cross_group_sync_ms, estimate_any_plans, flat_dp_ms, replica_sync_ms
from memx.planner.space import plan_links
from memx.simulator import links, load_traits, simulate_plan
from memx.simulator.cross_sync import flat_stage_ms, segments
from memx.simulator.physics import GRAD_BYTES_OF, ring_allreduce_ms
from memx.simulator.schedule import _prepare
from memx.simulator.stage import ADAM_STATIC_BYTES_PER_PARAM

V100_NIC, T4_NIC, LAT = 1.25, 6.25, 0.05  # conf/clusters/v100-t4-16.yaml: 10 Gb/s and 50 Gb/s NICs


@pytest.fixture(scope="module")
def vt():
    return load_cluster("v100-t4-16"), load_model("llama-6l")


def _total_params(model) -> float:
    """llama-6l: q, o, k, v + SwiGLU + 2 norms per layer; embedding, output layer and final norm."""
    h, f = model.hidden, model.ffn_hidden
    return model.layers * (4 * h * h + 3 * h * f + 2 * h) + 2 * model.vocab * h + h


def _pure_dp(tp: int, recompute: str = "none") -> GroupedPlan:
    """Pure data parallelism over both GPU types: one partition (all 6 layers, same tp), two groups."""
    v100 = ReplicaGroup(dp=12 // tp, micro_batch=1, micro_batches=4, stages=(Stage(gpu="v100-16g", tp=tp, layers=6,
                                                                                   recompute=recompute),))
    t4 = ReplicaGroup(dp=4 // tp, micro_batch=1, micro_batches=4, stages=(Stage(gpu="t4-16g", tp=tp, layers=6,
                                                                              recompute=recompute),))
    return GroupedPlan(model="llama-6l", cluster="v100-t4-16", global_batch=4 * (v100.dp + t4.dp), seq_len=2048,
                       groups=(v100, t4), precision="fp16")  # V100 and T4 have no bf16


def test_links_per_node_in_both_models(vt):
    cluster, _ = vt
    assert [cluster.nic_gbps(i) for i in range(4)] == [V100_NIC] * 3 + [T4_NIC]
    assert pair_link(cluster, 0, 3) == (V100_NIC, LAT)  # the smaller NIC of the two
    assert pair_link(cluster, 1, 1) == (150.0, 0.0)  # inside a node: the GPU type's intra-node link
    assert links.link(cluster, 3, 0) == (V100_NIC * 1e6, LAT) and links.link(cluster, 3, 3) == (16e6, 0.0)
    # a ring is as fast as its slowest hop; 4 concurrent rings (tp 4) share each node's one NIC
    ring = [0, 0, 1, 1, 2, 2, 3, 3]
    assert ring_link(cluster, ring) == (V100_NIC, LAT)
    assert ring_link(cluster, [0, 1, 2, 3], 4) == (V100_NIC / 4, LAT)
    assert ring_link(cluster, [3, 3], 4) == (16.0, 0.0)
    t4 = load_traits("t4-16g")
    assert links.ring(cluster, [3, 3, 3], [t4] * 3, 4) == (16e6 * t4.link_efficiency, t4.collective_step_latency_ms)


def test_nics_per_gpu_and_the_cross_vendor_link():
    a100, b = load_gpu("a100-80g"), load_gpu("vendor-b-32g")
    one_nic = Cluster(name="n", inter_node_bandwidth_gbps=25, nodes=(Node(gpu=a100, count=4),) * 2)
    per_gpu = dataclasses.replace(one_nic, nodes=(Node(gpu=a100, count=4, gpus_per_nic=1),) * 2)
    assert ring_link(one_nic, [0, 1], 4)[0] == 25 / 4 and ring_link(per_gpu, [0, 1], 4)[0] == 25
    assert ring_link(dataclasses.replace(per_gpu, nodes=(Node(gpu=a100, count=4, gpus_per_nic=2),) * 2), [0, 1], 4)[0] == 12.5
    tr = [load_traits("a100-80g")] * 2
    assert links.ring(per_gpu, [0, 1], tr, 4)[0] == 25e6 * tr[0].link_efficiency
    mixed = Cluster(name="m", inter_node_bandwidth_gbps=25, nodes=(Node(gpu=a100, count=4), Node(gpu=b, count=8),
                                                                    Node(gpu=a100, count=4)),
                    cross_vendor_bandwidth_gbps=2.0, cross_vendor_latency_ms=0.5)
    assert pair_link(mixed, 0, 1) == (2.0, 0.5) and pair_link(mixed, 0, 2) == (25, 0.01)
    assert links.link(mixed, 1, 2) == (2e6, 0.5) and links.link(mixed, 2, 0) == (25e6, 0.01)


def test_p2p_crosses_the_link_between_its_two_nodes(vt):
    cluster, _ = vt
    plan = Plan(model="llama-6l", cluster="v100-t4-16", global_batch=16, micro_batch=1, seq_len=2048, dp=1,
                stages=(Stage(gpu="v100-16g", tp=4, layers=2), Stage(gpu="v100-16g", tp=4, layers=2),
                        Stage(gpu="t4-16g", tp=4, layers=2)), precision="fp16")
    p2p, dp, lat, *_ = plan_links(cluster, plan)
    assert p2p == (V100_NIC, V100_NIC) and lat == (LAT, LAT) and dp == (150.0, 150.0, 16.0)


def test_flat_all_reduce_closed_form_is_the_nccl_ring(vt):
    """12 V100 + 4 T4 replicas at tp 1 share one partition: one ring over 16 ranks, 2·15/16 · 4P / 1.25 GB/s
    (its slowest hop leaves a V100 node; fp16 gradients, 2 B: V100 and T4 train in fp16); the two-level
    exchange is what the runtime does not run."""
    cluster, model = vt
    plan = _pure_dp(tp=1)
    assert shared_partition(plan)
    # + the ring's 2(n−1) steps, each the slowest hop's NIC latency (issue #23: NCCL's α-β ring)
    flat = 2 * 15 / 16 * GRAD_BYTES["fp16"] * _total_params(model) / (V100_NIC * 1e9) * 1e3 + 2 * 15 * LAT
    assert flat_dp_ms(plan, cluster, model) == pytest.approx([flat], rel=1e-9)
    # at tp 4: 4 rings over 4 replicas, one per node; each node's NIC carries all 4: a quarter of the NIC each
    flat4 = 2 * 3 / 4 * GRAD_BYTES["fp16"] * _total_params(model) / 4 / (V100_NIC / 4 * 1e9) * 1e3 + 2 * 3 * LAT
    assert flat_dp_ms(_pure_dp(tp=4), cluster, model) == pytest.approx([flat4], rel=1e-9)
    assert not shared_partition(dataclasses.replace(plan, groups=(plan.groups[0], dataclasses.replace(
        plan.groups[1], stages=(Stage(gpu="t4-16g", tp=2, layers=6),), dp=2))))


def test_groups_sharing_a_partition_cost_what_their_schema_one_plan_costs():
    """A dp 2 plan split into two dp 1 groups of the same partition: one flat all-reduce, the same time."""
    a100 = load_gpu("a100-80g")
    cluster = Cluster(name="a4", inter_node_bandwidth_gbps=25, nodes=(Node(gpu=a100, count=2),) * 2)
    model, pred = load_model("llama-6l"), AnalyticStageModel(gpus={"a100-80g": a100})
    one = Plan(model="llama-6l", cluster="a4", global_batch=16, micro_batch=1, seq_len=2048, dp=2,
               stages=(Stage(gpu="a100-80g", tp=2, layers=6),))
    g = ReplicaGroup(dp=1, micro_batch=1, micro_batches=8, stages=one.stages)
    two = GroupedPlan(model="llama-6l", cluster="a4", global_batch=16, seq_len=2048, groups=(g, g))
    a, b = estimate_any_plans([one, two], cluster, model, pred)
    assert b.iteration_time_ms == pytest.approx(a.iteration_time_ms, rel=1e-9)
    seen = achieved(cluster, pred)  # the NICs as the closed form sees them (memx.planner.network)
    assert b.cross_sync_ms == pytest.approx(replica_sync_ms(two, b.groups, seen, model)) and b.cross_sync_ms > 0
    # dp 1 groups: the two-level exchange is one ring over the 2 groups, no in-group broadcast — the same collective,
    # latency included (before issue #23 the flat step lacked the ring's latency and the two differed by it alone)
    assert cross_group_sync_ms(two, seen, model) == pytest.approx(b.cross_sync_ms)


def test_virtual_cluster_runs_one_flat_collective(vt):
    cluster, model = vt
    plan = _pure_dp(tp=4, recompute="full")
    run = simulate_plan(plan, cluster, model, seed=1)
    assert not run.oom, run.reason
    v, t = load_traits("v100-16g"), load_traits("t4-16g")
    plans, where = group_plans(plan), [[[0], [1], [2]], [[3]]]
    params = _prepare(plans[0], where[0], cluster, model, {"v100-16g": v}, ADAM_STATIC_BYTES_PER_PARAM).costs[0].params
    (seg,) = segments(plans, model)
    assert params == pytest.approx(seg.params / 4, rel=1e-3)  # the stage's parameters per rank (physics' count)
    # 4 rings over replicas on nodes 0, 1, 2, 3; every hop leaves a node whose one NIC carries all 4 rings
    bw = min(V100_NIC * 1e6 / 4 * v.link_efficiency, V100_NIC * 1e6 / 4 * t.link_efficiency)
    step = max(v.collective_step_latency_ms, t.collective_step_latency_ms) + LAT
    flat = ring_allreduce_ms(GRAD_BYTES_OF["fp16"] * params, 4, bw, step)  # fp16 gradients (physics.GRAD_BYTES_OF)
    assert flat_stage_ms(plans, where, 0, params, cluster, {"v100-16g": v, "t4-16g": t}) == \
        pytest.approx(flat, rel=1e-9)
    # the iteration: the last backward of any replica, the flat collective, the longer optimizer step
    finish = [a - d - o for a, d, o in zip(run.group_iteration_ms, run.dp_allreduce_ms, run.optimizer_ms)]
    assert run.iteration_time_ms == pytest.approx(max(finish) + flat + max(run.optimizer_ms), rel=1e-9)


def test_replicas_p2p_transfers_share_the_nics_they_cross(vt):
    """dp 2: both replicas' stage 0 on V100 node 0, both stage 1 on the T4 node; their transfers cross at
    once: 2 flows through each node's one NIC, min(1.25 / 2, 6.25 / 2) GB/s each, in both models."""
    cluster, model = vt
    plan = Plan(model="llama-6l", cluster="v100-t4-16", global_batch=8, micro_batch=1, seq_len=2048, dp=2,
                stages=(Stage(gpu="v100-16g", tp=2, layers=3, recompute="full"),
                        Stage(gpu="t4-16g", tp=2, layers=3, recompute="full")), precision="fp16")
    p2p, _, lat, *_ = plan_links(cluster, plan)
    assert p2p == (V100_NIC / 2,) and lat == (LAT,)
    v = load_traits("v100-16g")
    run = simulate_plan(plan, cluster, model)
    nbytes = 2 * 1 * 2048 * model.hidden  # bf16 activation b·s·h
    assert run.p2p_ms == pytest.approx((nbytes / (V100_NIC * 1e6 / 2 * v.link_efficiency) + LAT + v.p2p_overhead_ms,),
                                       rel=1e-9)
