"""One story in every output (issue #22): the pick first and labelled with its rule in every table, named
margin columns, the floor pick beside a `phi` pick below the floor, the memory plot per stage row on large
clusters, and the pipeline-bubble warning."""

from __future__ import annotations

import dataclasses
import io

import pytest
from rich.console import Console

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.planner.cost import AnalyticStageModel
from memx.planner.pick import bubble_warning
from memx.planner.result import metrics_from_dict, search_result_to_dict
from memx.planner.search import search
from memx.report.html import comparison_table
from memx.report.notation import MARGIN_HIGH, MARGIN_POINT, listed_plans
from memx.report.plots import AGGREGATE_ABOVE, memory_figure
from memx.report.table import PLANS_TITLE, plan_rows, print_table, to_markdown


def _obj(cluster, model, **space):
    cl, mo = load_cluster(cluster), load_model(model)
    sp = dataclasses.replace(load_search("small"), **space)
    return search_result_to_dict(search(cl, mo, sp, AnalyticStageModel(gpus={g.name: g for g in cl.gpu_types}),
                                        top_k=4), "analytic")


@pytest.fixture(scope="module")
def phi_obj():
    # The paper's rule with a floor no plan of Φ's choice clears on this small space.
    return _obj("xy-2", "llama-6l", pick_rule="phi", margin_floor=0.5)


def test_the_pick_is_first_and_labelled_with_its_rule_in_every_table(phi_obj):
    rows = listed_plans(phi_obj)
    assert rows[0][1] == "pick" and rows[0][0].startswith("pick (phi)")
    assert len({str(e["plan"]) for _l, _s, e in rows}) == len(rows)  # each plan once
    head, cells = plan_rows(phi_obj)
    assert head[0] == "plan" and MARGIN_POINT in head and MARGIN_HIGH not in head  # the closed form: point only
    assert cells[0][0].startswith("pick (phi)")
    md = to_markdown(phi_obj)
    assert f"## {PLANS_TITLE}" in md and "| pick (phi)" in md and "(rule `phi`)" in md
    out = io.StringIO()
    print_table(phi_obj, Console(file=out, width=250))
    assert "pick (phi)" in out.getvalue() and MARGIN_POINT in out.getvalue()
    html = comparison_table(phi_obj)
    sources = [chunk.split('"')[0] for chunk in html.split('data-source="')[1:]]
    assert sources[0] == "pick" and len(sources) == len(rows) and "pick (phi)" in html


def test_a_phi_pick_below_the_floor_has_the_fastest_plan_that_clears_it_beside_it(phi_obj):
    q = phi_obj["predicted"]
    if q["min_margin"] >= 0.5:
        pytest.skip("the Φ pick clears the floor on this catalog")
    beside = phi_obj["floor_pick"]["predicted"]
    assert beside["min_margin"] >= 0.5
    assert [s for _l, s, _e in listed_plans(phi_obj)][:2] == ["pick", "floor_pick"]
    assert any("below the floor" in w for w in phi_obj["warnings"])


def test_memory_plot_aggregates_per_stage_row_on_large_clusters(phi_obj):
    small = memory_figure(phi_obj)
    assert len(small.axes[0].patches) == 2 * len(phi_obj["predicted"]["peak_mem_mib"])  # peak + capacity per GPU
    big = dict(phi_obj, plan=dict(phi_obj["plan"], dp=64))
    n_gpus = 64 * sum(s["tp"] for s in big["plan"]["stages"])
    big["predicted"] = dict(big["predicted"], peak_mem_mib=[1.0] * n_gpus)
    assert n_gpus > AGGREGATE_ABOVE
    fig = memory_figure(big)
    assert len(fig.axes[0].patches) == 2 * len(big["stages"])  # one bar (and outline) per stage row
    assert "per stage row" in fig._suptitle.get_text()


def test_a_bubble_over_a_quarter_warns_with_the_micro_batches_that_fix_it(phi_obj):
    m = metrics_from_dict(phi_obj)  # 2 stages, dp 1, micro batch 1
    assert len(m.plan.stages) == 2 and m.plan.dp == 1 and m.plan.micro_batch == 1
    few = dataclasses.replace(m, plan=dataclasses.replace(m.plan, global_batch=2))  # bubble 1 / (2 + 1) = 33 %
    w = bubble_warning(few)
    assert w is not None and "33 %" in w.replace("%", " %") and "3 or more micro batches" in w and "global batch ≥ 3" in w
    assert bubble_warning(dataclasses.replace(m, plan=dataclasses.replace(m.plan, global_batch=3))) is None  # 25 %
