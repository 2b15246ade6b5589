"""Rendering a schema-2 pick (issue #15): the JSON report (memx.planner.result) of a plan with two replica
groups drawn as Markdown (parsed by markdown-it), rich tables, report.html and its PNGs, and the why."""

from __future__ import annotations

import dataclasses
import io

import pytest
from rich.console import Console

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.domain.groups import GroupedPlan, ReplicaGroup
from memx.domain.plan import Stage
from memx.planner.cost import AnalyticStageModel
from memx.planner.replicas import estimate_any_plans
from memx.planner.search import search
from memx.report.html import render_html
from memx.report.plots import gpu_bars, report_pngs
from memx.report.table import print_table, to_json_obj, to_markdown
from memx.report.why import annotate
from tests.unit.test_report_markdown import source_cells, tables

GIB = 1024.0


@pytest.fixture(scope="module")
def parts(conf_root):
    """A one-group search result and a two-group plan estimated on the same cluster."""
    cluster, model = load_cluster("three-vendor-20", conf_root), load_model("llama-6l", conf_root)
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})
    res = search(cluster, model, load_search("small", conf_root), pred, top_k=3)
    grouped = GroupedPlan(model="llama-6l", cluster="three-vendor-20", global_batch=16, seq_len=2048, groups=(
        ReplicaGroup(dp=1, micro_batch=2, micro_batches=4, stages=(Stage(gpu="a100-80g", tp=4, layers=6),)),
        ReplicaGroup(dp=2, micro_batch=1, micro_batches=4,
                     stages=(Stage(gpu="vendor-b-32g", tp=4, layers=3, recompute="selective"),
                             Stage(gpu="vendor-c-32g", tp=4, layers=3, recompute="full")))))
    (m,) = estimate_any_plans([grouped], cluster, model, pred)
    m = dataclasses.replace(m, phi=1.0)  # estimate_any_plans does not score; the search would
    return res, m


@pytest.fixture(scope="module")
def obj(parts):
    res, m = parts
    return annotate(to_json_obj(dataclasses.replace(res, pick=m, top=[*res.top, m]), "analytic"))


def test_a_one_group_pick_has_the_best_grouped_plan_beside_it_in_every_table(parts):
    """max_replica_groups > 1 and a one-group pick (memx.planner.replica_search): the grouped plan is listed
    second in the terminal, Markdown and HTML tables, under its own label (issue #22)."""
    from memx.report.html import comparison_table
    from memx.report.notation import listed_plans

    res, m = parts
    one = annotate(to_json_obj(dataclasses.replace(res, best_grouped=m), "analytic"))
    rows = listed_plans(one)
    assert [s for _l, s, _e in rows][:2] == ["pick", "best_grouped"] and rows[1][0] == "best with replica groups"
    assert "best with replica groups" in to_markdown(one)
    out = io.StringIO()
    print_table(one, Console(file=out, width=250))
    assert "best with replica groups" in out.getvalue()
    html = comparison_table(one)
    assert [c.split('"')[0] for c in html.split('data-source="')[1:]][:2] == ["pick", "best_grouped"]


def test_markdown_shows_one_block_per_group_and_the_cross_group_sync(obj):
    md = to_markdown(obj)
    q = obj["predicted"]
    assert "**Pick**: 2 replica groups (plan schema 2), 16 samples per iteration: " in md
    g0 = q["groups"][0]["iteration_time_ms"]
    assert f"- group 0: dp 1 × a100-80g×4 [6], micro batch 2 × 4 = 8 samples: {g0:,.0f} ms alone" in md
    assert "- group 1: dp 2 × vendor-b-32g×4 [3] sel → vendor-c-32g×4 [3] full, micro batch 1 × 4 = 8 samples" in md
    assert f"- cross-group gradient sync: {q['cross_group_sync_ms']:,.0f} ms" in md
    found = tables(md)
    for t in found:
        for r in t["rows"]:
            assert source_cells(r["line"]) == t["header"], r["line"]
    stage_cells = [r["cells"] for r in found[0]["rows"]]
    assert [c[:4] for c in stage_cells] == [["0", "0", "a100-80g", "4 × 1"], ["1", "0", "vendor-b-32g", "4 × 2"],
                                             ["1", "1", "vendor-c-32g", "4 × 2"]]
    assert [float(c[7]) for c in stage_cells] == [round(d["peak_mib"] / GIB, 1) for d in obj["stages"]]
    grouped = [r["cells"] for r in found[1]["rows"] if "‖" in r["cells"][-1]]  # the plans table lists it once
    assert [c[-3:] for c in grouped] == [["1+2", "2/1", "a100-80g×4 [6] ‖ vendor-b-32g×4 [3] sel → vendor-c-32g×4 [3] full"]]


def test_rich_table_html_and_pngs_render_the_groups(obj):
    out = io.StringIO()
    print_table(obj, Console(file=out, width=200))
    text = out.getvalue()
    assert "group 1: dp 2 × vendor-b-32g×4 [3] sel" in text and "g1 s1" in text and "cross-group gradient sync" in text
    bars = gpu_bars(obj)
    assert len(bars) == 4 + 2 * 8 == len(obj["predicted"]["peak_mem_mib"])
    assert [b.replica for b in bars] == [0] * 4 + [1] * 8 + [2] * 8  # replicas numbered on across groups
    assert [b.stage for b in bars[4:12]] == [1] * 4 + [2] * 4
    pngs = report_pngs(obj)
    assert all(v.startswith(b"\x89PNG") for v in pngs.values())
    page = render_html(obj, pngs)
    assert "2 replica groups (plan schema 2)" in page and "group 1 stage 1" in page
    assert "cross-group gradient sync" in page


def test_why_names_the_group_of_a_recomputing_stage(obj):
    assert any(line.startswith("group 1 stage 0 (vendor-b-32g, 3 layers) recomputes selective")
               for line in obj["explanation"]), obj["explanation"]
