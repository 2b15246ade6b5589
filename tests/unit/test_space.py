"""Plan space: layer splits, layouts, and the size of the space."""

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.domain.plan import Plan, Stage, validate_plan
from memx.planner.space import count_compositions, count_with_options, enumerate_layouts, splits, splits_many


def _brute(total, lo, hi):
    ranges = [range(a, b + 1) for a, b in zip(lo, hi)]
    return sorted(c for c in itertools.product(*ranges) if sum(c) == total)


@settings(max_examples=150, deadline=None)
@given(pp=st.integers(1, 5), total=st.integers(1, 14), data=st.data())
def test_splits_are_exactly_the_bounded_compositions(pp, total, data):
    lo = np.array([data.draw(st.integers(0, 3)) for _ in range(pp)])
    hi = lo + np.array([data.draw(st.integers(0, 8)) for _ in range(pp)])
    got = [tuple(int(x) for x in r) for r in splits(total, lo, hi)]
    assert got == _brute(total, lo, hi)


@settings(max_examples=60, deadline=None)
@given(pp=st.integers(1, 5), total=st.integers(1, 14), data=st.data())
def test_splits_many_is_every_box_splits_in_order(pp, total, data):
    """Many boxes at once (issue #26): each box's `splits`, concatenated in box order, with their box indices;
    empty and infeasible boxes (lo > hi, Σ lo > L, Σ hi < L) give no row."""
    boxes = data.draw(st.integers(1, 6))
    lo = np.array([[data.draw(st.integers(0, 4)) for _ in range(pp)] for _ in range(boxes)])
    hi = lo + np.array([[data.draw(st.integers(-1, 8)) for _ in range(pp)] for _ in range(boxes)])
    S, box = splits_many(total, lo, hi)
    assert S.dtype == np.int16 and S.shape == (len(box), pp)
    want = [(i, tuple(r)) for i in range(boxes) for r in _brute(total, lo[i], hi[i])]
    assert [(int(i), tuple(int(x) for x in r)) for i, r in zip(box, S)] == want


def test_unbounded_splits_count_is_binomial():
    S = splits(32, np.ones(6, int), np.full(6, 32))
    assert len(S) == count_compositions(32, 6) == 169911
    assert (S.sum(axis=1) == 32).all() and S.min() >= 1


def test_count_with_options_matches_brute_force():
    opts = (0, 1, 3, 4, 5, 6)  # options for n = 1..5 layers
    brute = sum(np.prod([opts[n] for n in c]) for c in _brute(5, [1, 1], [5, 5]))
    assert count_with_options(5, 2, opts) == brute


def test_layouts_use_every_gpu_and_valid_tp(conf_root):
    cluster, model = load_cluster("three-vendor-20", conf_root), load_model("llama2-7b", conf_root)
    space = load_search("default", conf_root)
    layouts = enumerate_layouts(cluster, model, space)
    assert len(layouts) > 100
    for lay in layouts[:: max(1, len(layouts) // 60)]:
        used = {}
        for g, t in zip(lay.stage_gpus, lay.stage_tp):
            used[g] = used.get(g, 0) + lay.dp * t
            assert model.heads % t == 0 and t <= max(cluster.node_sizes(g))
        assert used == {g.name: cluster.gpu_count(g.name) for g in cluster.gpu_types}
        assert space.global_batch % (lay.dp * lay.micro_batch) == 0
        assert lay.pp <= space.max_pp
        plan = Plan(model=model.name, cluster=cluster.name, global_batch=space.global_batch, micro_batch=lay.micro_batch,
                    seq_len=model.seq_len, dp=lay.dp,
                    stages=tuple(Stage(gpu=g, tp=t, layers=1) for g, t in zip(lay.stage_gpus, lay.stage_tp)))
        # A valid plan once layers sum to the model's.
        stages = list(plan.stages)
        stages[-1] = Stage(gpu=stages[-1].gpu, tp=stages[-1].tp, layers=model.layers - lay.pp + 1)
        validate_plan(Plan(**{**plan.__dict__, "stages": tuple(stages)}), cluster, model)
    # Stages of one GPU type are contiguous: the type sequence changes at most (types − 1) times.
    assert all(sum(a != b for a, b in zip(l.stage_gpus, l.stage_gpus[1:])) <= 2 for l in layouts)


def test_links_inside_and_across_nodes(conf_root):
    cluster, model = load_cluster("three-vendor-20", conf_root), load_model("llama2-7b", conf_root)
    lay = next(l for l in enumerate_layouts(cluster, model, load_search("default", conf_root))
               if l.stage_gpus[:2] == ("a100-80g", "a100-80g") and l.dp == 1)
    assert lay.p2p_gbps[0] == 300.0  # both A100 stages on the one A100 node: NVLink
    assert 28.0 in lay.p2p_gbps  # crossing to another GPU type crosses nodes
