"""The floor pick is exact over the whole space (issue #22): the branch-and-bound's pick, for every rule that
respects the floor, its (T, margin) front and "no plan clears the floor" equal a full enumeration that
keeps every plan (exhaustive search with top-k larger than the space), on small mixed-capacity spaces.
The default set runs a few examples; the slow test runs 200 (bench/pick_exact.py prints the same count)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memx.domain.catalog import load_gpu, load_model, load_search
from memx.domain.errors import InfeasibleError
from memx.domain.specs import Cluster, Node
from memx.planner.cost import AnalyticStageModel
from memx.planner.pick import PICK_RULES, choose
from memx.planner.search import search

PAIRS = (("h100-80g", "mi300x-192g"), ("a100-40g", "l40s-48g"), ("v100-16g", "a100-80g"))
SAFE_RULES = tuple(r for r in PICK_RULES if r not in ("phi", "phi-bounded"))
EVERYTHING = 10**7  # top-k larger than any space drawn here: the exhaustive search then keeps every plan


@st.composite
def mixed_spaces(draw, conf_root):
    pair = draw(st.sampled_from(PAIRS))
    nodes = tuple(Node(gpu=load_gpu(name, conf_root), count=draw(st.sampled_from((1, 2, 4)))) for name in pair)
    cluster = Cluster(name="mixed", inter_node_bandwidth_gbps=draw(st.sampled_from((12.0, 50.0))), nodes=nodes)
    model = dataclasses.replace(load_model("llama-6l", conf_root), layers=draw(st.integers(3, 9)),
                                hidden=draw(st.sampled_from((4096, 8192))), heads=32, query_groups=8,
                                seq_len=draw(st.sampled_from((2048, 4096))))
    space = dataclasses.replace(
        load_search("small", conf_root), global_batch=draw(st.sampled_from((8, 16))),
        tp_options=tuple(draw(st.lists(st.sampled_from((1, 2)), min_size=1, max_size=2, unique=True))),
        micro_batch_options=(1,), recompute_levels=("none", "selective", "full"), max_pp=draw(st.integers(2, 4)),
        use_all_gpus=draw(st.booleans()), max_time_ratio=draw(st.sampled_from((0.0, 1.1, 1.25))),
        max_stage_slowdown=0.0, target_margin=draw(st.sampled_from((0.1, 0.3))),
        margin_floor=draw(st.sampled_from((0.1, 0.3, 0.5, 0.7))),
        balance_tolerance=draw(st.sampled_from((0.0, 0.02, 0.1))), weights=draw(st.sampled_from(("auto", "default"))))
    return cluster, model, space


def _run(cluster, model, space, **kw):
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})
    try:
        return search(cluster, model, space, pred, **kw)
    except InfeasibleError as exc:
        return str(exc)


def _metrics(m):
    """What a pick is judged by (plans equal on all three are ties any rule may break either way)."""
    return (round(m.iteration_time_ms, 3), round(m.min_margin, 6), round(m.mem_variance_mib2, 1))


def _front(plans, window: float) -> list:
    """The (time, smallest margin) front of the plans within the window (of equal points the least V)."""
    out, best = [], -float("inf")
    for m in sorted(plans, key=lambda m: (m.iteration_time_ms, -m.min_margin, m.mem_variance_mib2)):
        if m.iteration_time_ms <= window and m.min_margin > best:
            out.append(_metrics(m))
            best = m.min_margin
    return out


def check_against_enumeration(cluster, model, space) -> bool:
    """Asserts the fast search agrees with the full enumeration; True when the space was feasible."""
    fast = _run(cluster, model, space, top_k=3)
    every = _run(cluster, model, space, top_k=EVERYTHING, exhaustive=True)
    if isinstance(every, str):
        assert fast == every
        return False
    plans = every.top_time  # every feasible plan
    assert len(plans) == every.space.feasible
    for rule in SAFE_RULES:
        kw = dict(rule=rule, margin_floor=space.margin_floor, balance_tolerance=space.balance_tolerance)
        got = choose(fast.top, [*fast.top_time, *fast.pareto, *fast.safe], **kw)
        want = choose(plans, plans, **kw)
        assert _metrics(got.plan) == _metrics(want.plan), rule
        assert got.warnings == want.warnings, rule  # "no plan clears the floor" (and its reason) iff true
    window = space.max_time_ratio * plans[0].iteration_time_ms if space.max_time_ratio > 0 else float("inf")
    assert _front(fast.pareto, window) == _front(plans, window)
    assert _metrics(fast.chosen) == _metrics(choose(plans, plans, rule=space.pick_rule, margin_floor=space.margin_floor,
                                                    balance_tolerance=space.balance_tolerance,
                                                    max_time_ratio=space.max_time_ratio).plan)
    return True


def _property(conf_root, examples: int):
    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))
    @given(mixed_spaces(conf_root))
    def check(problem):
        check_against_enumeration(*problem)

    check()


def test_floor_pick_front_and_none_clears_equal_full_enumeration(conf_root):
    _property(conf_root, 6)


@pytest.mark.slow
def test_floor_pick_equals_full_enumeration_on_200_spaces(conf_root):
    _property(conf_root, 200)
