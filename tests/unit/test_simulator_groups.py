"""Schema-2 plans on the virtual cluster (issue #15): joint placement, per-group 1F1B, the cross-group
gradient exchange (memx/simulator/cross_sync.py), OOM naming, and the one-group identity."""

from __future__ import annotations

import dataclasses

import pytest

from memx.domain.catalog import load_cluster, load_model
from memx.domain.groups import GroupedPlan, ReplicaGroup, as_grouped, group_plans, place_groups
from memx.domain.plan import Plan, Stage
from memx.simulator import load_traits, simulate_plan
from memx.simulator.cross_sync import schedule_sync, segment_ms, segments, Segment
from memx.simulator.physics import FP32_BYTES, ring_allreduce_ms, ring_collective_ms

CLUSTER = "three-vendor-20"
FAST = ReplicaGroup(dp=1, micro_batch=2, micro_batches=24, stages=(Stage(gpu="a100-80g", tp=4, layers=32),))
SLOW = ReplicaGroup(dp=2, micro_batch=1, micro_batches=40,
                    stages=(Stage(gpu="vendor-b-32g", tp=4, layers=16, recompute="selective"),
                            Stage(gpu="vendor-c-32g", tp=4, layers=16, recompute="full", recompute_layers=8)))


@pytest.fixture(scope="module")
def tv():
    return load_cluster(CLUSTER), load_model("llama2-7b")


def _grouped(*groups: ReplicaGroup, **kw) -> GroupedPlan:
    base = dict(model="llama2-7b", cluster=CLUSTER, global_batch=sum(g.samples for g in groups), seq_len=4096,
                groups=groups)
    return GroupedPlan(**{**base, **kw})


@pytest.mark.parametrize("options", [{}, {"distributed_optimizer": True, "sequence_parallel": True}])
def test_one_group_simulates_exactly_as_its_schema_one_plan(tv, options):
    v1 = Plan(model="llama2-7b", cluster=CLUSTER, global_batch=128, micro_batch=1, seq_len=4096, dp=2, **options,
              stages=(Stage(gpu="a100-80g", tp=2, layers=10), Stage(gpu="vendor-b-32g", tp=4, layers=11, recompute="full"),
                      Stage(gpu="vendor-c-32g", tp=4, layers=11, recompute="full", recompute_layers=6)))
    for seed in (0, 7):
        one, ref = simulate_plan(as_grouped(v1), *tv, seed=seed), simulate_plan(v1, *tv, seed=seed)
        assert one == ref and not ref.oom
        assert one.cross_sync_ms == 0.0 and one.group_iteration_ms == ()


def test_one_group_oom_reads_as_schema_one(tv):
    v1 = Plan(model="llama2-7b", cluster=CLUSTER, global_batch=64, micro_batch=8, seq_len=4096, dp=1,
              stages=(Stage(gpu="vendor-b-32g", tp=1, layers=32),))
    ref = simulate_plan(v1, *tv)
    assert ref.oom and simulate_plan(as_grouped(v1), *tv) == ref
    assert ref.reason.startswith("out of memory on GPU 0: needs")


def test_two_groups_first_group_runs_as_alone_then_waits_for_the_exchange(tv):
    plan = _grouped(FAST, SLOW)
    run = simulate_plan(plan, *tv, seed=3)
    assert not run.oom and len(run.peak_mem_mib) == 4 + 2 * 8  # group-major, then replica, stage, TP rank
    # group 0 is placed first and draws first from the seeded stream: alone it is the same run
    alone = simulate_plan(group_plans(plan)[0], *tv, seed=3)
    assert run.group_iteration_ms[0] == alone.iteration_time_ms
    assert run.peak_mem_mib[:4] == alone.peak_mem_mib
    assert run.cross_sync_ms > 0
    assert run.iteration_time_ms == pytest.approx(max(run.group_iteration_ms) + run.cross_sync_ms)
    # per-stage figures are concatenated in group order: 1 + 2 stages, 0 + 1 boundaries
    assert len(run.stage_time_ms) == len(run.dp_allreduce_ms) == len(run.optimizer_ms) == 3
    assert len(run.p2p_ms) == 1 and run.dp_allreduce_ms[0] == 0.0 and run.dp_allreduce_ms[1] > 0
    # seeded noise: same seed same run, another seed another run
    assert simulate_plan(plan, *tv, seed=3) == run
    assert simulate_plan(plan, *tv, seed=4).iteration_time_ms != run.iteration_time_ms


def test_exchange_of_two_single_stage_groups_is_one_ring_over_the_network(tv):
    cluster, model = tv
    slow = ReplicaGroup(dp=1, micro_batch=1, micro_batches=64,
                        stages=(Stage(gpu="vendor-b-32g", tp=8, layers=32, recompute="full"),))
    plan = _grouped(FAST, slow)
    run = simulate_plan(plan, *tv, grad_norm_barrier=False)  # the exchange alone (the barrier: test_grad_norm_barrier)
    (seg,) = segments(group_plans(plan), model)  # both groups hold everything in stage 0
    assert seg.stages == (0, 0)
    h, f = model.hidden, model.ffn_hidden  # llama2-7b: q, k, v, o + SwiGLU + 2 norms per layer; embedding, output
    assert seg.params == 32 * (4 * h * h + 3 * h * f + 2 * h) + 2 * model.vocab * h + h
    # the slower group finishes last, so the exchange adds one ring all-reduce of the whole fp32 gradient
    # between the two nodes (2 ranks, tp = min(4, 8) = 4 rings leave each node over the network), and then
    # the longer of the two optimizer steps
    assert run.group_iteration_ms[1] > run.group_iteration_ms[0]
    opt_a, opt_b = run.optimizer_ms
    a, b = load_traits("a100-80g"), load_traits("vendor-b-32g")
    bw = cluster.inter_node_bandwidth_gbps * 1e6 * min(a.link_efficiency, b.link_efficiency) / 4
    step = max(a.collective_step_latency_ms, b.collective_step_latency_ms) + cluster.inter_node_latency_ms
    ring = ring_allreduce_ms(FP32_BYTES * seg.params / 4, 2, bw, step)
    assert ring > 1000  # 27 GB of fp32 gradients over a 28 GB/s link shared by 4 rings
    assert run.cross_sync_ms == pytest.approx(ring + max(opt_a, opt_b) - opt_b, rel=1e-9)


def test_segments_follow_each_groups_layer_partition(tv):
    _, model = tv
    segs = segments(group_plans(_grouped(FAST, SLOW)), model)
    assert [s.stages for s in segs] == [(0, 0), (0, 1)]  # embedding + 16 layers, then 16 layers + output
    assert segs[0].params < segs[1].params  # the output layer (untied) also carries the vocab × hidden matrix
    uneven = dataclasses.replace(SLOW, stages=(dataclasses.replace(SLOW.stages[0], layers=10),
                                               dataclasses.replace(SLOW.stages[1], layers=22)))
    other = dataclasses.replace(FAST, stages=(Stage(gpu="a100-80g", tp=2, layers=20), Stage(gpu="a100-80g", tp=2, layers=12)))
    segs = segments(group_plans(_grouped(other, uneven)), model)
    assert [s.stages for s in segs] == [(0, 0), (0, 1), (1, 1)]


def test_sync_schedule_serialises_segments_on_a_shared_stage():
    segs = [Segment(stages=(0, 0), params=1.0), Segment(stages=(0, 1), params=1.0)]
    done = schedule_sync(segs, [5.0, 3.0], ready=[[10.0], [2.0, 1.0]])
    # both wait for group 0's stage 0 (ready at 10); the (0, 1) segment is ready as early, unit order breaks the tie
    assert done == [[18.0], [15.0, 18.0]]


def test_oom_in_the_second_group_names_group_replica_and_stage(tv):
    greedy = ReplicaGroup(dp=2, micro_batch=8, micro_batches=5,
                          stages=(Stage(gpu="vendor-b-32g", tp=4, layers=16), Stage(gpu="vendor-c-32g", tp=4, layers=16)))
    run = simulate_plan(_grouped(FAST, greedy), *tv)
    assert run.oom and run.iteration_time_ms is None and run.peak_mem_mib is None
    first = run.oom_gpus[0]
    assert first >= 4  # group 0 (4 GPUs) fits
    assert f"out of memory on GPU {first} (group 1, replica 0, stage 0, vendor-b-32g)" in run.reason
    assert len(run.demand_mem_mib) == 20


def test_groups_use_the_joint_placement(tv):
    cluster, _ = tv
    # two groups on the vendor-b node: the second takes the GPUs the first left free
    g = ReplicaGroup(dp=1, micro_batch=1, micro_batches=32,
                     stages=(Stage(gpu="vendor-b-32g", tp=4, layers=16, recompute="full"),
                             Stage(gpu="vendor-c-32g", tp=4, layers=16, recompute="full")))
    plan = _grouped(g, g)
    assert place_groups(plan, cluster) == [[[1, 2]], [[1, 2]]]
    run = simulate_plan(plan, *tv)
    # both groups sit on the same nodes: every hop of the exchange is intra-node, much faster than the network
    net = simulate_plan(_grouped(g, dataclasses.replace(g, stages=(Stage(gpu="a100-80g", tp=4, layers=32),))), *tv)
    assert 0 < run.cross_sync_ms < net.cross_sync_ms


def test_exchange_with_two_replicas_and_the_distributed_optimizer_runs_on_the_shards(tv):
    cluster, model = tv
    slow = ReplicaGroup(dp=2, micro_batch=1, micro_batches=40,
                        stages=(Stage(gpu="vendor-b-32g", tp=4, layers=32, recompute="full"),))
    plan = _grouped(FAST, slow, distributed_optimizer=True)  # 32 layers on a 32 GiB GPU at tp 4 need the sharding
    run = simulate_plan(plan, *tv)
    assert not run.oom, run.reason
    (seg,) = segments(group_plans(plan), model)
    a, b = load_traits("a100-80g"), load_traits("vendor-b-32g")
    per_ring = FP32_BYTES * seg.params / 4
    # two lanes, each half the gradient; both leave node 0 (group 0's one replica) and node 1: 2 × 4 rings each
    bw = cluster.inter_node_bandwidth_gbps * 1e6 * min(a.link_efficiency, b.link_efficiency) / 8
    step = max(a.collective_step_latency_ms, b.collective_step_latency_ms) + cluster.inter_node_latency_ms
    ring = ring_allreduce_ms(per_ring / 2, 2, bw, step)
    # with the distributed optimizer each replica keeps the summed shard it updates: no gather afterwards.
    # (Both groups hold all 32 layers at tp 4: they share a partition, so simulate_plan runs the flat collective
    # instead, tests/unit/test_network.py; the two-level exchange is checked on its own here.)
    placement = place_groups(plan, cluster)
    traits = {"a100-80g": a, "vendor-b-32g": b}
    assert segment_ms(seg, group_plans(plan), placement, cluster, traits) == pytest.approx(ring, rel=1e-9)
    # without it, group 1's two replicas (one node) then all-gather the halves they did not exchange
    intra = cluster.nodes[1].gpu.intra_node_bandwidth_gbps * 1e6 * b.link_efficiency
    gather = ring_collective_ms(per_ring, 2, intra, b.collective_step_latency_ms)
    plain = group_plans(dataclasses.replace(plan, distributed_optimizer=False))
    assert segment_ms(seg, plain, placement, cluster, traits) == pytest.approx(ring + gather, rel=1e-9)
