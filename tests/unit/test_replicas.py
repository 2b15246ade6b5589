"""Schema-2 plans in the planner (memx.planner.replicas): cross-group term, combined metrics, estimates."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from memx.domain.catalog import load_cluster, load_model
from memx.domain.groups import GroupedPlan, ReplicaGroup, as_grouped, group_plans
from memx.domain.plan import Plan, Stage
from memx.planner.cost import AnalyticStageModel, GRAD_BYTES_PER_PARAM
from memx.planner.estimate import estimate_plans
from memx.planner.replicas import cross_group_sync_ms, estimate_any_plans
from memx.planner.result import _entry, metrics_from_dict

CLUSTER = "three-vendor-20"


@pytest.fixture(scope="module")
def env():
    cluster = load_cluster(CLUSTER)
    return cluster, load_model("llama2-7b"), AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})


def _two(do: bool = False, fast_layers=(32,), slow_dp=2) -> GroupedPlan:
    fast = ReplicaGroup(dp=1, micro_batch=1, micro_batches=48,
                        stages=tuple(Stage(gpu="a100-80g", tp=4 // len(fast_layers), layers=n) for n in fast_layers))
    slow = ReplicaGroup(dp=slow_dp, micro_batch=1, micro_batches=80 // slow_dp,
                        stages=(Stage(gpu="vendor-b-32g", tp=4, layers=16, recompute="full"),
                                Stage(gpu="vendor-c-32g", tp=4, layers=16, recompute="full")))
    return GroupedPlan(model="llama2-7b", cluster=CLUSTER, global_batch=128, seq_len=4096, groups=(fast, slow),
                       distributed_optimizer=do)


def test_one_group_equals_schema_one(env):
    cluster, model, pred = env
    v1 = Plan(model="llama2-7b", cluster=CLUSTER, global_batch=128, micro_batch=1, seq_len=4096, dp=1,
              stages=(Stage(gpu="a100-80g", tp=4, layers=10), Stage(gpu="vendor-b-32g", tp=8, layers=11, recompute="full"),
                      Stage(gpu="vendor-c-32g", tp=8, layers=11, recompute="full")))
    g = as_grouped(v1)
    assert cross_group_sync_ms(g, cluster, model) == 0.0
    (a,) = estimate_plans([v1], cluster, model, pred)
    b, c = estimate_any_plans([g, v1], cluster, model, pred)
    assert b.plan is g and c.plan is v1
    assert dataclasses.replace(b, plan=v1) == a == c


def test_cross_term_closed_form(env):
    """Same partition boundaries at 16 layers. The fast group (pp 1, one node) holds both segments, so its
    node's one network link carries 2(G−1)/G · 4·P bytes of the whole model, whatever the ring count k:
    T_x = 4·P / bw + 2 segments × 2(G−1) latencies — above any single stage's k = 4 rings (a quarter of that)."""
    cluster, model, _ = env
    p = _two(do=False)
    h, f, v = model.hidden, model.ffn_hidden, model.vocab
    layer = 2 * h * h + 2 * h * (h * model.query_groups / model.heads) + 3 * h * f + 2 * h
    total = 32 * layer + v * h + v * h + h
    bw = cluster.inter_node_bandwidth_gbps * 1e9
    lat = 2 * 2 * cluster.inter_node_latency_ms
    node = 2 * (2 - 1) / 2 * GRAD_BYTES_PER_PARAM * total / bw * 1e3 + lat
    assert cross_group_sync_ms(p, cluster, model) == pytest.approx(node, rel=1e-9)
    # the distributed optimizer: the same node traffic (the shards of one node add up to the model), no broadcast
    assert cross_group_sync_ms(_two(do=True), cluster, model) == pytest.approx(node, rel=1e-9)
    assert cross_group_sync_ms(_two(do=True, slow_dp=1), cluster, model) == pytest.approx(node, rel=1e-9)


def test_different_partitions_serialise_on_a_stage(env):
    """Fast group pp 2 (tp 2) at 10/22 against the slow group's 16/16: three segments; k = 2."""
    cluster, model, _ = env
    p = _two(do=True, fast_layers=(10, 22))
    t = cross_group_sync_ms(p, cluster, model)
    same = cross_group_sync_ms(_two(do=True, fast_layers=(16, 16)), cluster, model)
    assert t > same > 0  # the 16-layer stage of the slow group now also holds the 10..16 segment of the other


def test_grouped_estimate(env):
    cluster, model, pred = env
    p = _two(do=True)
    (m,) = estimate_any_plans([p], cluster, model, pred)
    assert len(m.groups) == 2 and m.cross_sync_ms > 0
    assert m.iteration_time_ms == pytest.approx(max(g.iteration_time_ms for g in m.groups) + m.cross_sync_ms)
    assert len(m.peak_mem_mib) == 4 + 16 and len(m.stage_time_ms) == 3
    assert m.max_mem_mib == max(m.peak_mem_mib)
    assert m.mem_variance_mib2 == pytest.approx(float(np.var(m.peak_mem_mib)))
    assert m.min_margin == min(g.min_margin for g in m.groups)
    # each group alone is estimated as a schema-1 plan of its share
    fast = Plan(model="llama2-7b", cluster=CLUSTER, global_batch=48, micro_batch=1, seq_len=4096, dp=1,
                stages=p.groups[0].stages, distributed_optimizer=True)
    assert m.groups[0].iteration_time_ms == pytest.approx(estimate_plans([fast], cluster, model, pred)[0].iteration_time_ms)


def test_report_entry_schema_two_round_trip(env):
    """The JSON entry of a schema-2 plan: schema-2 plan, group per stage row, cross term and groups in
    `predicted`; metrics_from_dict reads it back. A schema-1 entry carries none of the new keys."""
    cluster, model, pred = env
    p = _two(do=True)
    (m,) = estimate_any_plans([p], cluster, model, pred)
    m = dataclasses.replace(m, phi=1.0)
    e = _entry(m)
    assert e["plan"]["schema"] == 2 and [r["group"] for r in e["stages"]] == [0, 1, 1]
    assert e["predicted"]["groups"] == [{"samples": 48, "iteration_time_ms": round(m.groups[0].iteration_time_ms, 3)},
                                        {"samples": 80, "iteration_time_ms": round(m.groups[1].iteration_time_ms, 3)}]
    assert e["predicted"]["cross_group_sync_ms"] == round(m.cross_sync_ms, 3)
    back = metrics_from_dict(e)
    assert back.plan == p and back.cross_sync_ms == round(m.cross_sync_ms, 3)
    assert back.iteration_time_ms == round(m.iteration_time_ms, 3)
    (one,) = estimate_plans([group_plans(p)[0]], cluster, model, pred)
    e1 = _entry(dataclasses.replace(one, phi=1.0))
    assert "schema" not in e1["plan"] and "group" not in e1["stages"][0] and "groups" not in e1["predicted"]
