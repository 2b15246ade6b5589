"""The front's tolerance (issue #26, SearchSpace.front_tolerance): the kept and reported Pareto front covers
(1 + max(tolerance, balance_tolerance)) × the fastest plan that clears the floor; the pick, the safe set and the
top-k sets are those of the whole window's search, the front is the whole window's front cut to the new window, and
every output says which window it covers. tests/unit/test_pick_exact.py checks it against full enumeration."""

from __future__ import annotations

import dataclasses

import pytest

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.planner.cost import AnalyticStageModel
from memx.planner.pick import front_tolerance
from memx.planner.result import search_result_to_dict
from memx.planner.search import search
from memx.report.table import PARETO_TITLE, pareto_title, to_markdown


def _keys(ms) -> list:
    return [m.plan for m in ms]


@pytest.mark.parametrize("rule, tol, balance, want", [
    ("balanced-front", 0.10, 0.02, 0.10), ("balanced-front", 0.01, 0.05, 0.05), ("fastest-above-floor", 0.0, 0.0, 0.0),
    ("balanced-front", None, 0.02, None), ("phi", 0.10, 0.02, None), ("phi-bounded", 0.10, 0.02, None)])
def test_the_tolerance_in_effect(rule, tol, balance, want):
    space = dataclasses.replace(load_search("default"), pick_rule=rule, front_tolerance=tol, balance_tolerance=balance)
    assert front_tolerance(space) == want


@pytest.fixture(scope="module")
def both():
    cluster, model = load_cluster("three-vendor-20"), load_model("llama2-7b")
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})
    space = load_search("default")
    assert space.front_tolerance == 0.10  # the shipped default
    return (search(cluster, model, dataclasses.replace(space, front_tolerance=None), pred),
            search(cluster, model, space, pred), space)


def test_same_pick_safe_set_and_top_sets_and_the_front_cut_to_its_window(both):
    whole, cut, space = both
    assert whole.pareto_window_ms is None
    safe_fastest = min(m.iteration_time_ms for m in cut.safe)
    assert cut.pareto_window_ms == pytest.approx((1 + space.front_tolerance) * safe_fastest, rel=1e-9)
    assert cut.chosen.plan == whole.chosen.plan and _keys(cut.safe) == _keys(whole.safe)
    assert _keys(cut.top) == _keys(whole.top) and _keys(cut.top_time) == _keys(whole.top_time)
    inside = [m.plan for m in whole.pareto if m.iteration_time_ms <= cut.pareto_window_ms]
    assert _keys(cut.pareto) == inside and 0 < len(inside) < len(whole.pareto)  # the cut is real on this case
    assert cut.space.scored < whole.space.scored  # fewer boxes to open: what the tolerance is for


def test_every_output_names_the_window(both):
    whole, cut, _ = both
    obj, old = search_result_to_dict(cut, "analytic"), search_result_to_dict(whole, "analytic")
    assert obj["pareto_window"] == {"max_iteration_time_ms": round(cut.pareto_window_ms, 3)} and old["pareto_window"] is None
    assert pareto_title(old) == PARETO_TITLE
    title = f"{PARETO_TITLE}, plans up to {cut.pareto_window_ms:,.0f} ms"
    assert pareto_title(obj) == title and f"## {title}" in to_markdown(obj)


def test_the_html_caption_names_the_window(both):
    from memx.report.html import render_html

    whole, cut, _ = both
    pngs = {name: b"png" for name in ("memory.png", "pareto.png", "timeline.png")}
    note = f"the Pareto set covers plans up to {cut.pareto_window_ms:,.0f} ms"
    assert note in render_html(search_result_to_dict(cut, "analytic"), pngs)
    assert "the Pareto set covers" not in render_html(search_result_to_dict(whole, "analytic"), pngs)
