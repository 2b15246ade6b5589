"""`memx plan --format markdown` rendered by a real Markdown parser (markdown-it-py, GFM tables): every
table row has the header's columns, and no stage is lost from a stages cell."""

from __future__ import annotations

import pytest
from markdown_it import MarkdownIt

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.planner.cost import AnalyticStageModel
from memx.planner.search import search
from memx.report.table import to_json_obj, to_markdown


@pytest.fixture(scope="module")
def obj(conf_root):
    cluster, model = load_cluster("three-vendor-20", conf_root), load_model("llama-6l", conf_root)
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})
    return to_json_obj(search(cluster, model, load_search("small", conf_root), pred, top_k=5), "analytic")


def source_cells(line: str) -> int:
    """Cells of a GFM table row as its source spells them: split on `|` not escaped by `\\`, the
    optional outer pipes not counting (GitHub Flavored Markdown spec, §4.10 Tables)."""
    body = line.strip()
    body = body[1:] if body.startswith("|") else body
    body = body[:-1] if body.endswith("|") and not body.endswith("\\|") else body
    cells, escaped = 1, False
    for ch in body:
        cells += ch == "|" and not escaped
        escaped = ch == "\\" and not escaped
    return cells


def tables(md: str) -> list[dict]:
    """Per table: header cell count, and per body row its source line and rendered cell texts."""
    out, row = [], None
    for tok in MarkdownIt("commonmark").enable("table").parse(md):
        if tok.type == "table_open":
            out.append({"header": 0, "rows": []})
        elif tok.type == "th_open":
            out[-1]["header"] += 1
        elif tok.type == "tr_open" and tok.map and out[-1]["header"]:
            row = {"line": md.splitlines()[tok.map[0]], "cells": []}
        elif tok.type == "inline" and row is not None:
            row["cells"].append(tok.content)
        elif tok.type == "tr_close" and row is not None:
            out[-1]["rows"].append(row)
            row = None
    return out


def test_every_row_has_the_headers_columns_and_every_stage(obj):
    md = to_markdown(obj)
    found = tables(md)
    assert len(found) == 3  # the pick's stages, the top plans, the Pareto front
    for t in found:
        assert t["rows"]
        for r in t["rows"]:
            assert source_cells(r["line"]) == t["header"], r["line"]
    top_rows = found[1]["rows"]
    for e, r in zip(obj["top"], top_rows):
        stages_cell = r["cells"][-1]
        assert all(st["gpu"] in stages_cell for st in e["plan"]["stages"]), (stages_cell, e["plan"]["stages"])


def test_the_parser_sees_what_a_renderer_sees():
    """The checks above are not vacuous: GFM drops the excess cells of a row, an escaped pipe stays."""
    md = "| a | b |\n|---|---|\n| 1 | x | y |\n| 2 | p \\| q |\n"
    t = tables(md)[0]
    assert [source_cells(r["line"]) for r in t["rows"]] == [3, 2]
    assert [r["cells"] for r in t["rows"]] == [["1", "x"], ["2", "p | q"]]
