"""The floor pick is exact over the whole space (issue #22): the branch-and-bound's pick, for every rule that
respects the floor, its front and "no plan clears the floor" equal a full enumeration that keeps every plan
(exhaustive search with top-k larger than the space), on small mixed-capacity spaces — with the closed form
(point margins) and with an interval predictor (the floor on the upper-bound margin, `peak_mem_mib_high`).
The default set runs a few examples; the slow test runs 200 (bench/pick_exact.py prints the same count)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import numpy as np

from memx.domain.catalog import load_gpu, load_model, load_search
from memx.domain.errors import InfeasibleError
from memx.domain.specs import PIPELINE_ASSEMBLIES, Cluster, Node
from memx.learn.intervals import GLOBAL, Band, Intervals, interval_columns, memory_group
from memx.planner import candidates
from memx.planner.cost import AnalyticStageModel
from memx.planner.pick import PICK_RULES, choose
from memx.planner.search import search

PAIRS = (("h100-80g", "mi300x-192g"), ("a100-40g", "l40s-48g"), ("v100-16g", "a100-80g"))
SAFE_RULES = tuple(r for r in PICK_RULES if r not in ("phi", "phi-bounded"))
EVERYTHING = 10**7  # top-k larger than any space drawn here: the exhaustive search then keeps every plan


class IntervalAnalytic:
    """A stage predictor with a 90 % interval: the closed form's point prediction and the learned predictor's
    interval code (memx.learn.intervals.interval_columns) with fixed bands — memory bands on the dynamic part
    (above static memory), wider for one GPU type and, Mondrian-style, for full recompute with several micro
    batches in flight — so the upper-bound margin orders plans differently from the point margin. `nan_gpu`:
    a type it gives no interval for (NaN: the point peak stands there)."""

    name = "interval-analytic"

    def __init__(self, gpus: dict, *, wide_gpu: str, nan_gpu: str | None = None):
        self.base = AnalyticStageModel(gpus=gpus)
        dyn = dict(source="test bands", scale="dynamic")
        self.intervals = Intervals(
            bands={GLOBAL: {"memory": Band(low=0.9, high=1.15, **dyn), "time": Band(low=0.9, high=1.1, source="test")},
                   wide_gpu: {"memory": Band(low=0.85, high=1.4, **dyn)}},
            grouped={f"{GLOBAL}|memory|full,inflight>1": Band(low=0.8, high=1.6, **dyn)})
        self.nan_gpu = nan_gpu

    def predict_columns(self, sigs) -> dict[str, np.ndarray]:
        out = dict(self.base.predict_columns(sigs))
        gpu = np.asarray(sigs["gpu"]).astype(str)
        out |= interval_columns(self.intervals, gpu, out["time_ms"], out["peak_mem_mib"], out["static_mem_mib"],
                                memory_group(np.asarray(sigs["recompute"]), np.asarray(sigs["inflight"])))
        if self.nan_gpu is not None:
            out["peak_mem_mib_high"] = np.where(gpu == self.nan_gpu, np.nan, out["peak_mem_mib_high"])
        return out

    def predict(self, sigs):
        import pandas as pd

        return pd.DataFrame(self.predict_columns(sigs), index=sigs.index)


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
        balance_tolerance=draw(st.sampled_from((0.0, 0.02, 0.1))), weights=draw(st.sampled_from(("auto", "default"))),
        virtual_stages_options=draw(st.sampled_from(((1,), (1, 2)))),  # interleaved 1F1B too (issue #27)
        pipeline_assembly=draw(st.sampled_from(PIPELINE_ASSEMBLIES)),  # the 1F1B steady state (issues #22, #27)
        front_tolerance=draw(st.sampled_from((None, 0.0, 0.05, 0.10))))  # the front's window (issue #26)
    return cluster, model, space


def predictor_for(cluster, kind: str):
    """The closed form ("point"), or the interval predictor with the second GPU type's band wide ("interval") and
    also no interval for the first type ("interval-nan")."""
    gpus = {g.name: g for g in cluster.gpu_types}
    if kind == "point":
        return AnalyticStageModel(gpus=gpus)
    names = [n.gpu.name for n in cluster.nodes]
    return IntervalAnalytic(gpus, wide_gpu=names[-1], nan_gpu=names[0] if kind == "interval-nan" else None)


def _run(cluster, model, space, predictor, **kw):
    try:
        return search(cluster, model, space, predictor, **kw)
    except InfeasibleError as exc:
        return str(exc)


def floor_margin(r):
    """The margin the result's pick applies: upper-bound where the predictor gives it, else point."""
    return lambda m: r.margins_high.get(m.plan, m.min_margin)


def _metrics(m, mg):
    """What a pick is judged by (plans equal on all four are ties any rule may break either way)."""
    return (round(m.iteration_time_ms, 3), round(mg(m), 6), round(m.min_margin, 6), round(m.mem_variance_mib2, 1))


def _front(plans, window: float, mg, with_v: bool) -> list:
    """The (time, floor margin, V) front of the plans within the window, by time; without V the (time, floor
    margin) front, of equal points the least V."""
    pts = sorted({_metrics(m, mg) for m in plans if m.iteration_time_ms <= window})
    v = 3 if with_v else 0  # without V: compare time with itself, so V never decides dominance

    def beats(q, p):
        return q[0] <= p[0] and q[1] >= p[1] and q[v] <= p[v] and (q[0], q[1], q[v]) != (p[0], p[1], p[v])

    out = [p for p in pts if not any(beats(q, p) for q in pts)]
    if not with_v:  # of equal (time, margin) points the least V
        out = [p for p in out if not any(q[:2] == p[:2] and q[3] < p[3] for q in out)]
    return out


def front_window(space, plans, mg) -> float:
    """The window the front must be exact in, from every plan: max_time_ratio × the fastest, cut to (1 + the front
    tolerance, at least balance_tolerance) × the fastest plan that clears the floor (SearchSpace.front_tolerance)."""
    window = space.max_time_ratio * plans[0].iteration_time_ms if space.max_time_ratio > 0 else float("inf")
    safe = [m.iteration_time_ms for m in plans if mg(m) >= space.margin_floor]
    if space.front_tolerance is None or space.pick_rule in ("phi", "phi-bounded") or not safe:
        return window
    return min(window, (1 + max(space.front_tolerance, space.balance_tolerance)) * min(safe))


def check_against_enumeration(cluster, model, space, kind: str = "point", front_variance: bool = False) -> bool:
    """Asserts the fast search agrees with the full enumeration; True when the space was feasible. kind: the
    predictor (predictor_for); front_variance: the kept front with V (candidates.KEPT_FRONT_VARIANCE)."""
    saved, candidates.KEPT_FRONT_VARIANCE = candidates.KEPT_FRONT_VARIANCE, front_variance
    try:
        return _check(cluster, model, space, kind, front_variance)
    finally:
        candidates.KEPT_FRONT_VARIANCE = saved


def _check(cluster, model, space, kind: str, front_variance: bool) -> bool:
    pred = predictor_for(cluster, kind)
    fast = _run(cluster, model, space, pred, top_k=3)
    every = _run(cluster, model, space, pred, top_k=EVERYTHING, exhaustive=True)
    if isinstance(every, str):
        assert fast == every
        return False
    plans = every.top_time  # every feasible plan
    assert len(plans) == every.space.feasible
    mg_fast, mg_all = floor_margin(fast), floor_margin(every)
    if kind != "point" and every.margins_high:  # every plan has its upper-bound margin (none: no interval at all)
        assert all(m.plan in every.margins_high for m in plans)
    for rule in SAFE_RULES:
        kw = dict(rule=rule, margin_floor=space.margin_floor, balance_tolerance=space.balance_tolerance)
        got = choose(fast.top, [*fast.top_time, *fast.pareto, *fast.safe], margin=mg_fast, **kw)
        want = choose(plans, plans, margin=mg_all, **kw)
        assert _metrics(got.plan, mg_fast) == _metrics(want.plan, mg_all), rule
        assert got.warnings == want.warnings, rule  # "no plan clears the floor" (and its reason) iff true
    window = front_window(space, plans, mg_all)
    assert fast.pareto_window_ms == every.pareto_window_ms
    whole = space.max_time_ratio * plans[0].iteration_time_ms if space.max_time_ratio > 0 else float("inf")
    assert fast.pareto_window_ms == (pytest.approx(window, rel=1e-12) if window < whole else None)
    assert _front(fast.pareto, window, mg_fast, front_variance) == _front(plans, window, mg_all, front_variance)
    if front_variance:  # the reported front is the (T, margin, V) front of the kept plans: then the exact one
        assert sorted(_metrics(m, mg_fast) for m in fast.pareto if m.iteration_time_ms <= window) == \
            _front(plans, window, mg_all, True)
    want = choose(plans, plans, rule=space.pick_rule, margin_floor=space.margin_floor, margin=mg_all,
                  balance_tolerance=space.balance_tolerance, max_time_ratio=space.max_time_ratio).plan
    assert _metrics(fast.chosen, mg_fast) == _metrics(want, mg_all)
    return True


def _property(conf_root, examples: int, kinds=("point", "interval", "interval-nan"), fronts=(False, True)):
    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))
    @given(mixed_spaces(conf_root), st.sampled_from(kinds), st.sampled_from(fronts))
    def check(problem, kind, front_variance):
        check_against_enumeration(*problem, kind=kind, front_variance=front_variance)

    check()


def test_floor_pick_front_and_none_clears_equal_full_enumeration(conf_root):
    _property(conf_root, 4, kinds=("point",))


def test_floor_pick_on_upper_bound_margin_equals_full_enumeration(conf_root):
    _property(conf_root, 4, kinds=("interval", "interval-nan"))


def test_kept_front_with_variance_equals_full_enumeration(conf_root):
    _property(conf_root, 3, fronts=(True,))


def test_joint_bounds_on_every_box_equal_full_enumeration(conf_root, monkeypatch):
    """Issue #26: the keeper's joint tests tried on every box (not only large ones, joint.MIN_SPLITS), so they
    discard boxes of these small spaces too: still the answer of full enumeration."""
    from memx.planner import joint

    monkeypatch.setattr(joint, "MIN_SPLITS", 0)
    _property(conf_root, 3, kinds=("point", "interval"), fronts=(False,))


@pytest.mark.slow
def test_floor_pick_equals_full_enumeration_on_200_spaces(conf_root):
    _property(conf_root, 200)


@pytest.mark.slow
def test_learned_interval_predictor_floor_pick_equals_full_enumeration():
    """The learned predictor (profiled on the simulator, conformal intervals): the floor picks on its upper-bound
    margin equal full enumeration, and the search's upper-bound margins are estimate.upper_margins' (8 s)."""
    from memx.domain.catalog import load_cluster
    from memx.learn import fit_predictor
    from memx.planner.estimate import upper_margins
    from memx.profiling import profile

    cl, mo, sp = load_cluster("v100-t4-6"), load_model("llama-6l"), load_search("small")
    pred = fit_predictor(profile(cl, mo, sp, backend="simulated", seed=0).stage_runs,
                         {g.name: g for g in cl.gpu_types}, variant="hybrid-calibrated", seed=0)
    for floor in (0.1, 0.3):
        space = dataclasses.replace(sp, margin_floor=floor)
        fast, every = _run(cl, mo, space, pred, top_k=3), _run(cl, mo, space, pred, top_k=EVERYTHING, exhaustive=True)
        plans, mg_fast, mg_all = every.top_time, floor_margin(fast), floor_margin(every)
        assert len(every.margins_high) == len(plans) == every.space.feasible
        for rule in SAFE_RULES:
            kw = dict(rule=rule, margin_floor=floor, balance_tolerance=space.balance_tolerance)
            got = choose(fast.top, [*fast.top_time, *fast.pareto, *fast.safe], margin=mg_fast, **kw)
            assert _metrics(got.plan, mg_fast) == _metrics(choose(plans, plans, margin=mg_all, **kw).plan, mg_all)
        assert upper_margins(plans, mo, pred) == pytest.approx([mg_all(m) for m in plans], abs=1e-6)
