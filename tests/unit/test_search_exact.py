"""The branch-and-bound search gives exactly the answer of scoring every plan (`exhaustive=True`):
property test over random small clusters, models and search options; plus its building blocks."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memx.domain.catalog import load_gpu, load_model, load_search
from memx.domain.errors import InfeasibleError
from memx.domain.specs import PIPELINE_ASSEMBLIES, Cluster, Node
from memx.planner.bounds import MinMax, _lagrange_tables, box_variance_lb, max_lagrange_sum
from memx.planner.compositions import count_splits, sample_splits
from memx.planner.cost import AnalyticStageModel
from memx.planner.medians import RadixMedians, dkw_epsilon
from memx.planner.search import search

GPUS = ("v100-16g", "t4-16g", "a100-40g", "a100-80g", "vendor-b-32g", "rtx3090-24g", "h100-80g")
LEVELS = ("none", "selective", "full", "block")


def _key(c):
    return (c.plan, c.iteration_time_ms, c.max_mem_mib, c.mem_variance_mib2, c.min_margin, c.phi, c.stage_time_ms,
            c.stage_peak_mib)


@st.composite
def problems(draw, conf_root):
    names = draw(st.lists(st.sampled_from(GPUS), min_size=1, max_size=3, unique=True))
    nodes = []
    for name in names:
        gpu = load_gpu(name, conf_root)
        nodes += [Node(gpu=gpu, count=draw(st.sampled_from((1, 2, 4)))) for _ in range(draw(st.integers(1, 2)))]
    cluster = Cluster(name="random", inter_node_bandwidth_gbps=draw(st.sampled_from((12.0, 50.0))), nodes=tuple(nodes))
    heads = draw(st.sampled_from((16, 32)))
    model = dataclasses.replace(load_model("llama-6l", conf_root), layers=draw(st.integers(3, 10)),
                                hidden=draw(st.sampled_from((2048, 4096))), heads=heads,
                                query_groups=draw(st.sampled_from((heads, 8))), seq_len=draw(st.sampled_from((1024, 2048))))
    levels = draw(st.lists(st.sampled_from(LEVELS), min_size=1, max_size=4, unique=True))
    space = dataclasses.replace(
        load_search("small", conf_root), global_batch=draw(st.sampled_from((8, 16, 32))),
        tp_options=tuple(draw(st.lists(st.sampled_from((1, 2, 4)), min_size=1, max_size=3, unique=True))),
        micro_batch_options=tuple(draw(st.lists(st.sampled_from((1, 2)), min_size=1, max_size=2, unique=True))),
        recompute_levels=tuple(levels), max_pp=draw(st.integers(2, 5)), use_all_gpus=draw(st.booleans()),
        max_time_ratio=draw(st.sampled_from((0.0, 1.1, 1.5))), max_stage_slowdown=draw(st.sampled_from((0.0, 2.0))),
        target_margin=draw(st.sampled_from((0.1, 0.3))), reserve_gib=draw(st.sampled_from((0.5, 2.0))),
        weights=draw(st.sampled_from(("auto", "default", "safety", "throughput", "0.5,0.5,0"))),
        distributed_optimizer=draw(st.sampled_from(((False,), (True,), (False, True)))),
        sequence_parallel=draw(st.sampled_from(((False,), (True,), (True, False)))),
        virtual_stages_options=draw(st.sampled_from(((1,), (1, 2), (1, 3)))),  # interleaved 1F1B, issue #27
        pipeline_assembly=draw(st.sampled_from(PIPELINE_ASSEMBLIES)))  # the 1F1B steady state, issues #22, #27
    return cluster, model, space, draw(st.integers(1, 6))


def _run(cluster, model, space, k, **kw):
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})
    try:
        return search(cluster, model, space, pred, top_k=k, **kw)
    except InfeasibleError as exc:
        return str(exc)


@pytest.fixture(scope="module")
def conf(conf_root):
    return conf_root


# 4 random problems in the default set (~9 s), 25 in `make test-all`: the floor-pick property test
# (test_pick_exact.py) covers the same exactness fast on mixed capacities.
@pytest.mark.parametrize("examples", [pytest.param(4, id="quick"), pytest.param(25, id="deep", marks=pytest.mark.slow)])
def test_branch_and_bound_equals_full_enumeration(conf, examples):
    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))
    @given(problems(conf))
    def check(problem):
        cluster, model, space, k = problem
        fast = _run(cluster, model, space, k)
        ref = _run(cluster, model, space, k, exhaustive=True)
        if isinstance(ref, str):
            assert fast == ref
            return
        assert fast.weights == ref.weights and fast.space == ref.space and fast.refs == ref.refs
        assert [_key(c) for c in fast.top] == [_key(c) for c in ref.top]
        assert [_key(c) for c in fast.top_time] == [_key(c) for c in ref.top_time]
        assert [_key(c) for c in fast.pareto] == [_key(c) for c in ref.pareto]
        sharded = _run(cluster, model, space, k, shard_by="pp-order", mapper=lambda f, xs: [f(x) for x in xs])
        assert [_key(c) for c in sharded.top] == [_key(c) for c in ref.top]
        assert [_key(c) for c in sharded.pareto] == [_key(c) for c in ref.pareto]

    check()


def test_branch_and_bound_equals_full_enumeration_on_a_context_parallel_case(conf):
    """One small fixed case with context_parallel_options [1, 2, 4] (issue #27): the exact answer, cp plans in it."""
    nodes = (Node(gpu=load_gpu("a100-40g", conf), count=4), Node(gpu=load_gpu("v100-16g", conf), count=4))
    cluster = Cluster(name="random", inter_node_bandwidth_gbps=12.0, nodes=nodes)
    model = dataclasses.replace(load_model("llama-6l", conf), layers=4, seq_len=8192)
    space = dataclasses.replace(load_search("small", conf), global_batch=8, tp_options=(1, 2), micro_batch_options=(1,),
                                recompute_levels=("none", "full"), max_pp=2, context_parallel_options=(1, 2, 4))
    fast, ref = _run(cluster, model, space, 5), _run(cluster, model, space, 5, exhaustive=True)
    assert [_key(c) for c in fast.top] == [_key(c) for c in ref.top]
    assert [_key(c) for c in fast.pareto] == [_key(c) for c in ref.pareto]
    assert any(c.plan.context_parallel > 1 for c in ref.top)


@pytest.mark.slow
def test_branch_and_bound_equals_full_enumeration_with_context_parallelism(conf):
    """The same property with context_parallel_options [1, 2] (issue #27), a few random cases (slow: ~8 s)."""
    @settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
    @given(problems(conf))
    def check(problem):
        cluster, model, space, k = problem
        space = dataclasses.replace(space, context_parallel_options=(1, 2), virtual_stages_options=(1,))
        fast, ref = _run(cluster, model, space, k), _run(cluster, model, space, k, exhaustive=True)
        if isinstance(ref, str):
            assert fast == ref
            return
        assert [_key(c) for c in fast.top] == [_key(c) for c in ref.top]
        assert [_key(c) for c in fast.pareto] == [_key(c) for c in ref.pareto]

    check()


def test_bound_discards_plans_and_progress_reaches_the_end(conf):
    from memx.domain.catalog import load_cluster

    cluster, model = load_cluster("three-vendor-20", conf), load_model("llama2-7b", conf)
    space = dataclasses.replace(load_search("default", conf), max_pp=4, micro_batch_options=(1,))
    seen = []
    r = _run(cluster, model, space, 5, on_progress=lambda done, total: seen.append((done, total)))
    assert r.space.scored + r.space.discarded == r.space.evaluated and r.space.discarded > 0
    assert seen and seen[-1][0] == seen[-1][1] and [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_counts_and_samples_of_splits_are_exact():
    rng = np.random.default_rng(3)
    for _ in range(30):
        pp, total = int(rng.integers(1, 5)), int(rng.integers(1, 9))
        allowed = rng.random((pp, total + 1)) < 0.7
        allowed[:, 0] = False
        brute = [c for c in itertools.product(range(1, total + 1), repeat=pp)
                 if sum(c) == total and all(allowed[s, n] for s, n in enumerate(c))]
        assert count_splits(total, allowed) == len(brute)
        S = sample_splits(total, allowed, 4000, rng)
        assert len(S) == (4000 if brute else 0)
        got = {tuple(int(x) for x in row) for row in S}
        assert got <= set(brute)
        if 0 < len(brute) <= 20:
            assert got == set(brute)  # every allowed split is drawn (uniform: ≥ 200 draws each expected)


def test_radix_medians_are_exact_and_the_sample_bound_is_stated():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 1000, 100001):
        vals = [rng.lognormal(3, 2, n).astype(np.float32) for _ in range(3)]
        vals[2][: n // 3] = 0.0  # V may be exactly 0
        rm = RadixMedians()
        for i in range(0, n, 997):  # streamed in pieces, twice
            rm.first_pass(tuple(v[i:i + 997] for v in vals))
        for i in range(0, n, 997):
            rm.second_pass(tuple(v[i:i + 997] for v in vals))
        assert rm.medians() == tuple(float(np.median(v)) for v in vals)
    assert dkw_epsilon(1 << 17) < 0.0076


def test_box_variance_bound_is_a_tight_lower_bound():
    rng = np.random.default_rng(1)
    for _ in range(300):
        pp = int(rng.integers(1, 9))
        w = rng.random(pp)
        w /= w.sum()
        lo = rng.random((1, pp)) * 100
        hi = lo + rng.random((1, pp)) * rng.choice([0.0, 1.0, 50.0])
        v = box_variance_lb(lo, hi, w)[0]
        x = lo + (hi - lo) * rng.random((2000, pp))
        var = ((x - (x * w).sum(axis=1, keepdims=True)) ** 2 * w).sum(axis=1)
        assert v <= var.min() * (1 + 1e-9) + 1e-9
        c = np.linspace(lo.min(), hi.max(), 20001)[:, None]
        d = c - np.clip(c, lo, hi)
        assert v == pytest.approx((w * d * d).sum(axis=1).min(), rel=1e-3, abs=1e-6)


def _box_splits(a, b, total):
    return [c for c in itertools.product(*[range(x, y + 1) for x, y in zip(a, b)]) if sum(c) == total]


def test_box_time_bounds_are_valid_and_exact_where_promised():
    """MinMax ≤ min over the box's splits of max_s x(s, n_s), equal when x is non-decreasing with no gaps;
    the Lagrangian sum ≤ min of Σ_s x(s, n_s), equal when every x(s, ·) is linear with a slope tried."""
    rng = np.random.default_rng(7)
    for trial in range(200):
        pp, total = int(rng.integers(1, 5)), int(rng.integers(4, 13))
        rows, n = total + 1, np.arange(total + 1)
        kind = trial % 3  # 0: random with gaps, 1: non-decreasing without gaps, 2: linear
        if kind == 0:
            x = rng.random((pp, rows)) * 100
            x[rng.random((pp, rows)) < 0.2] = np.inf
        elif kind == 1:
            x = np.cumsum(rng.random((pp, rows)) * 10, axis=1)
        else:
            x = rng.choice([1.0, 3.0, 7.0], size=(pp, 1)) * n[None, :] + rng.random((pp, 1)) * 50  # slopes ≥ 2 % apart
        x[:, 0] = np.inf
        a = rng.integers(1, max(2, total // pp + 1), size=pp)
        b = np.minimum(a + rng.integers(0, total, size=pp), total)
        boxes = _box_splits(a, b, total)
        if not boxes:
            continue
        vals = [[x[s, c[s]] for s in range(pp)] for c in boxes]
        finite = [v for v in vals if np.isfinite(v).all()]
        mm = MinMax(x).query(a[None, :], b[None, :], total)[0]
        sm = max_lagrange_sum(_lagrange_tables(x, n), a[None, :], b[None, :], total)[0]
        if finite:
            assert mm <= min(max(v) for v in finite) + 1e-9
            assert sm <= min(sum(v) for v in finite) + 1e-6
        if kind >= 1:
            assert mm == pytest.approx(min(max(v) for v in vals))
        if kind == 2:
            assert sm == pytest.approx(min(sum(v) for v in vals), rel=1e-6)


def test_branch_and_bound_equals_full_enumeration_with_expert_parallel_options(conf):
    """Issue #27: a small mixture-of-experts case searched with expert_parallel_options (the all-to-all and the
    expert-dp step change stage times and tails per ep): branch-and-bound == every plan scored."""
    cluster = Cluster(name="moe", inter_node_bandwidth_gbps=12.0,
                      nodes=(Node(gpu=load_gpu("a100-80g", conf), count=4), Node(gpu=load_gpu("h100-80g", conf), count=4)))
    model = dataclasses.replace(load_model("llama-6l", conf), num_experts=4, moe_router_topk=2, moe_ffn_hidden=2048,
                                moe_first_dense_layers=1)  # a dense first layer: first-stage entries differ
    space = dataclasses.replace(load_search("small", conf), global_batch=16, micro_batch_options=(1,), max_pp=3,
                                expert_parallel_options=(1, 2, 4))
    fast, ref = _run(cluster, model, space, 5), _run(cluster, model, space, 5, exhaustive=True)
    assert any(c.plan.expert_parallel > 1 for c in ref.top_time)
    assert [_key(c) for c in fast.top_time] == [_key(c) for c in ref.top_time]
    assert _key(fast.pick) == _key(ref.pick)
