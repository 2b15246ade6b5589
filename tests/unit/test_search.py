"""The vectorised search against a per-plan Python loop over the same space, and its contracts."""

import dataclasses
import json

import numpy as np
import pytest

from memx.planner.cost import AnalyticStageModel
from memx.domain.catalog import load_cluster, load_model, load_search
from memx.domain.errors import InfeasibleError, InputError
from memx.planner.estimate import estimate_plans
from memx.planner.naive import evaluate_split
from memx.planner.network import achieved
from memx.planner.objective import parse_weights
from memx.planner.search import _chunks, _contexts, _prepare, search
from memx.planner.space import enumerate_layouts
from memx.planner.predictions import predict_tables
from memx.domain.plan import Recompute
from memx.planner.result import metrics_from_dict, search_result_to_dict


@pytest.fixture(scope="module")
def setup(conf_root):
    conf = conf_root
    cluster, model = load_cluster("three-vendor-20", conf), load_model("llama-6l", conf)
    space = dataclasses.replace(load_search("small", conf), weights="default", max_stage_slowdown=0.0)
    return cluster, model, space, AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})


def test_vectorised_search_equals_naive_loop(setup):
    cluster, model, space, pred = setup
    r = search(cluster, model, space, pred, top_k=5, workers=2)
    cluster = achieved(cluster, pred)  # the NICs as the search sees them (memx.planner.network)
    w = parse_weights("default")
    layouts = enumerate_layouts(cluster, model, space)
    pt = predict_tables(_contexts(layouts, model.layers), cluster, model, model.seq_len, space.recompute_levels,
                        space.reserve_gib, pred)
    best_score, best_t, n_feasible, n_eval = np.inf, np.inf, 0, 0
    for lay in layouts:
        prep = _prepare(lay, pt, cluster, model, model.seq_len, 0.0)
        if prep is None:
            continue
        for S in _chunks(prep, model.layers, 1 << 20):
            for split in S:
                n_eval += 1
                res = evaluate_split(prep.tables, tuple(int(x) for x in split), w, epsilon_mib2=space.epsilon_mib2,
                                     target_margin=space.target_margin)
                if res is not None:
                    n_feasible += 1
                    best_score = min(best_score, res.score)
                    best_t = min(best_t, res.time_ms)
    assert r.space.evaluated == n_eval and r.space.feasible == n_feasible
    assert r.fastest.iteration_time_ms == pytest.approx(best_t, rel=1e-5)
    got = w.w_time * np.log(r.best.iteration_time_ms) + w.w_mem * np.log(r.best.max_mem_mib) + w.w_var * np.log(
        r.best.mem_variance_mib2 + space.epsilon_mib2)
    assert got == pytest.approx(best_score, abs=1e-4)


def test_pick_agrees_with_direct_estimate_and_is_feasible(setup):
    cluster, model, space, pred = setup
    r = search(cluster, model, space, pred, top_k=3)
    for cand in (r.best, r.fastest):
        est = estimate_plans([cand.plan], cluster, model, pred, reserve_gib=space.reserve_gib)[0]
        assert est.feasible
        assert est.iteration_time_ms == pytest.approx(cand.iteration_time_ms, rel=1e-4)
        assert est.max_mem_mib == pytest.approx(cand.max_mem_mib, rel=1e-5)
        assert len(est.peak_mem_mib) == cand.plan.gpus_used == cluster.total_gpus
    assert r.best.phi <= min(c.phi for c in r.top)
    assert [c.iteration_time_ms for c in r.top_time] == sorted(c.iteration_time_ms for c in r.top_time)
    # Pareto front of (T, smallest margin, V): nobody in it is dominated by the pick, Φ's best or the fastest.
    for c in r.pareto:
        for o in (r.chosen, r.best, r.fastest):
            dominated = (o.iteration_time_ms <= c.iteration_time_ms and o.min_margin >= c.min_margin
                         and o.mem_variance_mib2 <= c.mem_variance_mib2 and
                         (o.iteration_time_ms, o.min_margin, o.mem_variance_mib2) !=
                         (c.iteration_time_ms, c.min_margin, c.mem_variance_mib2))
            assert not dominated


def test_max_time_ratio_bounds_the_pick(setup):
    cluster, model, space, pred = setup
    r = search(cluster, model, dataclasses.replace(space, max_time_ratio=1.1), pred)
    assert r.best.iteration_time_ms <= 1.1 * r.fastest.iteration_time_ms + 1e-6


def test_space_counts_are_consistent(setup):
    cluster, model, space, pred = setup
    r = search(cluster, model, space, pred)
    assert r.space.total >= r.space.splits_total >= r.space.evaluated >= r.space.feasible > 0


def test_no_room_for_the_model_says_why(conf_root):
    cluster, model = load_cluster("v100-t4-6", conf_root), load_model("llama2-70b", conf_root)
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})
    # usable: 4 × (16 − 226/1024 − 1) + 2 × (16 − 1475/1024 − 1) = 86.2 GiB (nominal less conf/runtime's driver
    # reserves, less the 1 GiB search reserve per GPU; 90 GiB before issue #27 counted the nominal memory)
    with pytest.raises(InfeasibleError, match=r"llama2-70b needs ≥ 1,15\d GiB .* cluster v100-t4-6 has 86 GiB usable"):
        search(cluster, model, load_search("small", conf_root), pred)


def test_batch_not_divisible_is_bad_input(conf_root):
    cluster, model = load_cluster("xy-2", conf_root), load_model("llama-6l", conf_root)
    space = dataclasses.replace(load_search("small", conf_root), global_batch=7, micro_batch_options=(2, 4))
    with pytest.raises(InputError, match="global_batch"):
        search(cluster, model, space, AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types}))


def test_sharding_and_mapper_do_not_change_the_result(setup):
    cluster, model, space, pred = setup
    ref = search(cluster, model, space, pred, top_k=5)
    serial = search(cluster, model, space, pred, top_k=5, shard_by="pp-order", mapper=lambda f, xs: [f(x) for x in reversed(xs)][::-1])
    assert [c.plan for c in serial.top] == [c.plan for c in ref.top]
    assert [c.plan for c in serial.top_time] == [c.plan for c in ref.top_time]
    assert [c.plan for c in serial.pareto] == [c.plan for c in ref.pareto]
    assert serial.refs == ref.refs and serial.space == ref.space


def test_json_object_decodes_back_to_plan_metrics(setup):
    cluster, model, space, pred = setup
    r = search(cluster, model, space, pred, top_k=3)
    obj = json.loads(json.dumps(search_result_to_dict(r, "analytic")))
    back = metrics_from_dict(obj)
    assert back.plan == r.chosen.plan and back.feasible and r.chosen.feasible
    assert back.iteration_time_ms == round(r.chosen.iteration_time_ms, 3)
    assert back.peak_mem_mib == tuple(round(x, 1) for x in r.chosen.peak_mem_mib)
    assert back.capacity_mib == r.chosen.capacity_mib and back.phi == round(r.chosen.phi, 5)
    assert [metrics_from_dict(e).plan for e in obj["top"]] == [c.plan for c in r.top]
    assert all(isinstance(st.recompute, Recompute) for c in r.top for st in c.plan.stages)


def test_estimate_is_unscored_and_uses_the_same_assembly(setup):
    cluster, model, space, pred = setup
    r = search(cluster, model, space, pred, top_k=3)
    ests = estimate_plans([c.plan for c in r.top], cluster, model, pred, reserve_gib=space.reserve_gib)
    for c, e in zip(r.top, ests):
        assert e.phi is None and c.phi is not None
        assert e.capacity_mib == c.capacity_mib and len(e.stage_time_ms) == c.plan.pp
        assert e.stage_peak_mib == pytest.approx(c.stage_peak_mib, rel=1e-6)
