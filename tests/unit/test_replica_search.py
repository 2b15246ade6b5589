"""The replica-group search (memx.planner.replica_search): formations, batch splits, the one-group
identity, and exactness against brute force over every formation × batch split × exhaustive per-group
search on tiny clusters (property test)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memx.domain.catalog import load_cluster, load_gpu, load_model, load_search
from memx.domain.errors import InfeasibleError
from memx.domain.precision import resolve_precision
from memx.domain.groups import GroupedPlan, ReplicaGroup, place_groups
from memx.domain.specs import Cluster, Node
from memx.planner.cost import AnalyticStageModel
from memx.planner.network import achieved
from memx.planner.pick import plan_key
from memx.planner.replica_search import batch_splits, formations, search_replicas
from memx.planner.replicas import estimate_any_plans, replica_sync_ms
from memx.planner.search import search


def _pred(cluster):
    return AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})


def test_formations_whole_nodes(conf_root):
    cl = load_cluster("three-vendor-20", conf_root)
    assert formations(cl, 2) == [((1, 1, 0), (0, 0, 1)), ((1, 0, 1), (0, 1, 0)), ((1, 0, 0), (0, 1, 1))]
    assert formations(cl, 3) == [((1, 0, 0), (0, 1, 0), (0, 0, 1))]
    assert formations(cl, 4) == []
    # two nodes of one class: swapping them is one formation; with idle nodes allowed there are more
    twin = Cluster(name="twin", inter_node_bandwidth_gbps=10, nodes=(Node(gpu=load_gpu("v100-16g", conf_root), count=2),) * 2)
    assert formations(twin, 2) == [((1,), (1,))]
    assert formations(twin, 2, use_all_gpus=False) == [((1,), (1,))]
    assert len(formations(cl, 2, use_all_gpus=False)) > 3


def test_batch_splits():
    assert batch_splits(6, 2, 1) == [(5, 1), (4, 2), (3, 3), (2, 4), (1, 5)]
    assert batch_splits(10, 2, 4) == [(6, 4)]  # remainder 2 to the first group
    assert all(sum(s) == 16 for s in batch_splits(16, 3, 2))


def test_one_group_is_todays_search(conf_root):
    cl, mo = load_cluster("v100-t4-6", conf_root), load_model("llama-6l", conf_root)
    sp = dataclasses.replace(load_search("small", conf_root), global_batch=8)
    out = search_replicas(cl, mo, sp, _pred(cl))
    ref = search(cl, mo, sp, _pred(cl))
    assert out.grouped is None and out.result.chosen == ref.chosen and out.result.top == ref.top


def _brute(cluster, model, space, G):
    """Every assignment of nodes to G non-empty groups × every split × per-group exhaustive search."""
    pred, best = _pred(cluster), float("inf")
    n = len(cluster.nodes)
    # one precision for every group, resolved over the whole cluster (as replica_search does; issue #23)
    space = dataclasses.replace(space, precision=resolve_precision(space.precision, cluster.gpu_types))
    for labels in itertools.product(range(G), repeat=n):
        if len(set(labels)) < G:
            continue
        subs = [dataclasses.replace(cluster, nodes=tuple(cluster.nodes[i] for i in range(n) if labels[i] == g))
                for g in range(G)]
        for shares in itertools.product(range(1, space.global_batch), repeat=G):
            if sum(shares) != space.global_batch:
                continue
            picks = []
            for sub, share in zip(subs, shares):
                try:
                    r = search(sub, model, dataclasses.replace(space, global_batch=share), pred, exhaustive=True)
                except InfeasibleError:
                    break
                m = r.chosen
                if r.margins_high.get(plan_key(m), m.min_margin) < space.margin_floor:
                    break
                picks.append(m.plan)
            else:
                plan = GroupedPlan(model=model.name, cluster=cluster.name, global_batch=space.global_batch,
                                   seq_len=picks[0].seq_len, distributed_optimizer=picks[0].distributed_optimizer,
                                   sequence_parallel=picks[0].sequence_parallel, precision=picks[0].precision,
                                   groups=tuple(ReplicaGroup(dp=p.dp, micro_batch=p.micro_batch,
                                                             micro_batches=p.micro_batches, stages=p.stages) for p in picks))
                if place_groups(plan, cluster) is None:
                    continue
                (m,) = estimate_any_plans([plan], cluster, model, pred, reserve_gib=space.reserve_gib)
                best = min(best, m.iteration_time_ms)
    return best


TINY = ("v100-16g", "t4-16g", "a100-40g", "vendor-b-32g")


@st.composite
def tiny(draw, conf_root):
    names = draw(st.lists(st.sampled_from(TINY), min_size=1, max_size=3, unique=True))
    nodes = [Node(gpu=load_gpu(g, conf_root), count=draw(st.sampled_from((1, 2)))) for g in names]
    if len(nodes) < 3 and draw(st.booleans()):
        nodes.append(nodes[0])
    if len(nodes) < 2:
        nodes.append(Node(gpu=nodes[0].gpu, count=1))
    cluster = Cluster(name="tiny", inter_node_bandwidth_gbps=draw(st.sampled_from((12.0, 50.0))), nodes=tuple(nodes))
    model = dataclasses.replace(load_model("llama-6l", conf_root), layers=draw(st.integers(2, 4)), hidden=2048,
                                heads=16, query_groups=16, seq_len=1024)
    space = dataclasses.replace(
        load_search("small", conf_root), global_batch=draw(st.integers(2, 6)), tp_options=(1, 2),
        micro_batch_options=(1,), recompute_levels=("none", "full"), max_pp=3, max_replica_groups=2,
        distributed_optimizer=(draw(st.booleans()),), sequence_parallel=(True,), weights="throughput",
        margin_floor=draw(st.sampled_from((0.0, 0.1))),
        # the rule under which the grouped plan joining the candidates (pick.with_candidate) can only make the pick
        # faster; a balanced rule may take a slower grouped plan within its tolerance (docs/planner.md §Replica groups)
        pick_rule="fastest-above-floor")
    return cluster, model, space


# 4 random problems in the default set (about 4 s), 25 in `make test-all` (issue #17: `make test` under 3 min).
@pytest.mark.parametrize("examples", [4, pytest.param(25, marks=pytest.mark.slow)])
def test_replica_search_equals_brute_force(conf_root, examples):
    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))
    @given(tiny(conf_root))
    def check(problem):
        cluster, model, space = problem
        try:
            out = search_replicas(cluster, model, space, _pred(cluster), granule=1)
        except InfeasibleError:
            return
        assert out.exact
        ref = _brute(cluster, model, space, 2)
        got = out.grouped.iteration_time_ms if out.grouped is not None else float("inf")
        assert got == pytest.approx(ref, rel=1e-6)  # search: float32 columns; estimate: float64
        # never worse than the one-group pick, and the answer's estimate is its own
        assert out.result.chosen.iteration_time_ms <= out.one_group.chosen.iteration_time_ms
        if out.grouped is not None:
            (again,) = estimate_any_plans([out.grouped.plan], cluster, model, _pred(cluster), reserve_gib=space.reserve_gib)
            assert again.iteration_time_ms == pytest.approx(out.grouped.iteration_time_ms, rel=1e-6)
            seen = achieved(cluster, _pred(cluster))  # the NICs as the closed form sees them (memx.planner.network)
            assert again.cross_sync_ms == pytest.approx(replica_sync_ms(out.grouped.plan, again.groups, seen, model),
                                                        rel=1e-6, abs=1e-6)

    check()


# ~13 s (two CLI searches): `make test-all`; replica groups stay in the default set via
# test_replica_search_equals_brute_force and the schema-2 outputs via tests/unit/test_report_grouped.py.
@pytest.mark.slow
def test_memx_plan_prints_schema_two(tmp_path, conf_root):
    """`memx plan --search <yaml with max_replica_groups: 2>`: on 8 × A100 + 8 × T4 with llama-6l and a
    global batch of 256 the planner's best plan is two groups (the A100 group takes most sequences); the
    JSON is schema 2 and round-trips; the table renders; max_replica_groups: 1 gives today's schema-1 pick."""
    import json

    import yaml
    from typer.testing import CliRunner

    from memx.cli.app import app
    from memx.domain.groups import any_plan_from_dict

    small = yaml.safe_load((conf_root / "search" / "small.yaml").read_text())
    for groups in (1, 2):
        (tmp_path / f"s{groups}.yaml").write_text(yaml.safe_dump({**small, "name": f"s{groups}", "global_batch": 256,
                                                                   "max_replica_groups": groups}))
    args = ["plan", "--cluster", "a100-t4-16", "--model", "llama-6l", "--search"]
    runner = CliRunner()
    two = runner.invoke(app, [*args, str(tmp_path / "s2.yaml"), "--format", "json"])
    assert two.exit_code == 0, two.output
    obj = json.loads(two.stdout)
    plan = any_plan_from_dict(obj["plan"])
    shares = [g["samples"] for g in obj["predicted"]["groups"]]
    assert isinstance(plan, GroupedPlan) and sum(shares) == 256 and shares[0] > 8 * shares[1]
    assert obj["predicted"]["cross_group_sync_ms"] > 0 and {r["group"] for r in obj["stages"]} == {0, 1}
    one = json.loads(runner.invoke(app, [*args, str(tmp_path / "s1.yaml"), "--format", "json"]).stdout)
    assert "schema" not in one["plan"] and one["predicted"]["iteration_time_ms"] > obj["predicted"]["iteration_time_ms"]
    table = runner.invoke(app, [*args, str(tmp_path / "s2.yaml")])
    assert table.exit_code == 0 and "g1 s0" in table.stdout


def test_shares_no_micro_batch_divides_are_skipped(conf_root):
    """micro_batch_options (2,): odd shares have no plan; the search still answers (even splits only)."""
    cl, mo = load_cluster("three-vendor-20", conf_root), load_model("llama-6l", conf_root)
    sp = dataclasses.replace(load_search("small", conf_root), global_batch=8, micro_batch_options=(2,),
                             max_replica_groups=2)
    out = search_replicas(cl, mo, sp, _pred(cl), granule=1)
    assert out.exact and out.grouped is not None
    assert all(g.samples % 2 == 0 for g in out.grouped.plan.groups)
