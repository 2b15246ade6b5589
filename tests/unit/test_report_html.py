"""report.html and its PNGs, from a real (small) search: self-contained, every image decodable, every
number in the tables taken from the `memx plan --format json` object."""

from __future__ import annotations

import os
import base64
import copy
import io
import random
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from memx.domain.catalog import load_cluster, load_model, load_search
from memx.domain.errors import InputError
from memx.planner.cost import AnalyticStageModel
from memx.planner.search import search
from memx.report.html import comparison_rows, write_report
from memx.report.notation import compact_stages
from memx.report.plots import f1b_blocks, gpu_bars, non_dominated, png_bytes, timeline_figure, tradeoff_points
from memx.report.table import to_json_obj

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNGS = ("memory.png", "pareto.png", "timeline.png")


@pytest.fixture(scope="module")
def obj(conf_root):
    cluster, model = load_cluster("three-vendor-20", conf_root), load_model("llama-6l", conf_root)
    pred = AnalyticStageModel(gpus={g.name: g for g in cluster.gpu_types})
    return to_json_obj(search(cluster, model, load_search("small", conf_root), pred, top_k=5), "analytic")


@pytest.fixture(scope="module")
def report(obj, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    return out, write_report(obj, out)


class Page(HTMLParser):
    """Images, every URL-valued attribute, tags seen, and table rows (data-source, [(class, text)])."""

    def __init__(self):
        super().__init__()
        self.images, self.urls, self.tags, self.rows = [], [], set(), {}
        self._table, self._row, self._cell = None, None, None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.add(tag)
        self.urls += [v for k, v in attrs if k in ("src", "href", "action", "poster", "srcset") and v]
        if tag == "img":
            self.images.append(a.get("src", ""))
        elif tag == "table":
            self._table = a.get("id")
        elif tag == "tr":
            self._row = []
            self.rows.setdefault(self._table, []).append((a.get("data-source"), self._row))
        elif tag in ("td", "th"):
            self._cell = [a.get("class", ""), ""]

    def handle_data(self, data):
        if self._cell is not None:
            self._cell[1] += data

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._row.append(tuple(self._cell))
            self._cell = None


def parse(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def close_to(text: str, value: float, *, scale: float = 1.0) -> bool:
    """The shown number (with its rounding) is `value` × scale: within half a unit of its last digit."""
    shown = text.replace(",", "").replace("%", "").strip()
    decimals = len(shown.split(".")[1]) if "." in shown else 0
    return abs(float(shown) - value * scale) <= 0.5 * 10 ** -decimals + 1e-9


def test_files_written_atomically_with_normal_mode(report):
    out, paths = report
    assert [p.name for p in paths] == ["report.html", *PNGS]
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in paths)  # no temporary left over
    assert all(p.stat().st_mode & 0o777 == 0o644 for p in paths)


def test_images_inline_decodable_and_the_png_files(report):
    out, _ = report
    page = parse(out / "report.html")
    assert len(page.images) == len(PNGS)
    embedded = []
    for src in page.images:
        assert src.startswith("data:image/png;base64,")
        embedded.append(base64.b64decode(src.split(",", 1)[1], validate=True))
    assert all(data.startswith(PNG_SIGNATURE) for data in embedded)
    assert sorted(embedded) == sorted((out / name).read_bytes() for name in PNGS)


def test_no_network_no_scripts(report):
    out, _ = report
    page = parse(out / "report.html")
    assert all(u.startswith("data:") for u in page.urls), page.urls
    text = (out / "report.html").read_text(encoding="utf-8")
    assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/|@import|url\(", text, re.I)
    assert not page.tags & {"script", "iframe", "object", "embed"}


def test_pngs_are_real_pictures(report):
    out, _ = report
    for name in PNGS:
        data = (out / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000
        img = imread(io.BytesIO(data), format="png")
        assert img.shape[0] > 200 and img.shape[1] > 400 and float(img[..., :3].std()) > 0.05


def _entry(obj, source):
    if source == "pick":
        return obj
    if source == "fastest":
        return obj["fastest"]
    return obj["top"][int(source.split(":")[1])]


def test_comparison_numbers_come_from_the_json(obj, report):
    out, _ = report
    rows = [(src, dict(cells)) for src, cells in parse(out / "report.html").rows["comparison"] if src]
    assert [src for src, _ in rows] == [src for _, src, _ in comparison_rows(obj)]
    # The pick first; the fastest plan next unless the pick is the fastest (each plan listed once).
    fastest_row = 0 if obj["plan"] == obj["fastest"]["plan"] else 1
    assert rows[0][0] == "pick" and len(rows) >= 3
    assert fastest_row == 0 or rows[1][0] == "fastest"
    t_fast = obj["fastest"]["predicted"]["iteration_time_ms"]
    for src, cells in rows:
        e = _entry(obj, src)
        q = e["predicted"]
        assert close_to(cells["time"], q["iteration_time_ms"])
        assert close_to(cells["slowdown"], q["iteration_time_ms"] / t_fast - 1, scale=100)
        assert close_to(cells["max-mem"], q["max_mem_mib"] / 1024)
        assert close_to(cells["std"], q["mem_variance_mib2"] ** 0.5 / 1024)
        assert close_to(cells["margin"], q["min_margin"], scale=100)
        assert close_to(cells["phi"], q["phi"])
        assert int(cells["dp"]) == e["plan"]["dp"] and int(cells["micro-batch"]) == e["plan"]["micro_batch"]
        assert cells["text stages"] == compact_stages(e["plan"])
    # The pick and the fastest plan, spelled out.
    assert rows[0][1]["time"] == f"{obj['predicted']['iteration_time_ms']:,.1f}"
    assert rows[fastest_row][1]["time"] == f"{t_fast:,.1f}" and rows[fastest_row][1]["slowdown"] == "+0.0%"
    assert rows[0][1]["margin"] == f"{obj['predicted']['min_margin']:.1%}"


def test_stage_table_numbers_come_from_the_json(obj, report):
    out, _ = report
    rows = [dict(cells) for _, cells in parse(out / "report.html").rows["stages"][1:]]
    assert len(rows) == len(obj["stages"])
    for cells, st, d in zip(rows, obj["plan"]["stages"], obj["stages"]):
        assert cells["text gpu"] == st["gpu"] and int(cells["layers"]) == st["layers"]
        assert close_to(cells["time"], d["time_ms"]) and close_to(cells["peak"], d["peak_mib"] / 1024)
        assert close_to(cells["capacity"], d["capacity_mib"] / 1024)
        assert close_to(cells["margin"], 1 - d["peak_mib"] / d["capacity_mib"], scale=100)


def test_strings_are_escaped(obj, tmp_path):
    evil = copy.deepcopy(obj)
    evil["plan"]["cluster"] = '<script>alert("x")</script>'
    evil["predictor"] = "a&b <i>"
    (tmp_path / "r").mkdir()
    html = write_report(evil, tmp_path / "r")[0].read_text(encoding="utf-8")
    assert "<script" not in html and "<i>" not in html
    assert "&lt;script&gt;" in html and "a&amp;b &lt;i&gt;" in html


def test_missing_fields_are_bad_input(obj, tmp_path):
    with pytest.raises(InputError, match="stages"):
        write_report({k: v for k, v in obj.items() if k != "stages"}, tmp_path)


def test_one_bar_per_gpu_with_its_stage_capacity(obj):
    bars = gpu_bars(obj)
    assert [b.peak_mib for b in bars] == obj["predicted"]["peak_mem_mib"]
    assert len(bars) == obj["plan"]["dp"] * sum(st["tp"] for st in obj["plan"]["stages"])
    assert all(b.capacity_mib == obj["stages"][b.stage]["capacity_mib"] for b in bars)


def test_tradeoff_marks_the_fastest_on_the_front(obj):
    pts, front = tradeoff_points(obj)
    fastest = obj["fastest"]["predicted"]
    i = int(np.argmin(pts[:, 0]))
    assert pts[i, 0] == fastest["iteration_time_ms"] and front[i]
    assert non_dominated(np.array([[1.0, 1.0], [2.0, 2.0], [0.5, 3.0], [1.0, 1.0]])).tolist() == [True, False, True, True]


def test_1f1b_blocks_order_and_length():
    # Equal stages: the classic (m + pp − 1)·t (Narayanan et al. 2021, §2.2: bubble (pp − 1)/m).
    blocks = f1b_blocks([3.0] * 4, 8)
    assert max(b.end_ms for b in blocks) == pytest.approx(33.0)
    rng = random.Random(7)
    for _ in range(200):
        pp, m = rng.randint(1, 7), rng.randint(1, 20)
        t = [rng.uniform(1, 10) for _ in range(pp)]
        blocks = f1b_blocks(t, m)
        assert len(blocks) == 2 * pp * m
        end = {(b.backward, b.stage, b.micro_batch): b.end_ms for b in blocks}
        for b in blocks:  # inputs first: previous stage's forward, next stage's backward (or own forward)
            dep = ((False, b.stage - 1, b.micro_batch) if not b.backward else
                   (True, b.stage + 1, b.micro_batch) if b.stage < pp - 1 else (False, b.stage, b.micro_batch))
            assert b.start_ms >= end.get(dep, 0.0) - 1e-9
        for s in range(pp):  # one operation at a time per stage
            spans = sorted((b.start_ms, b.end_ms) for b in blocks if b.stage == s)
            assert all(a[1] <= c[0] + 1e-9 for a, c in zip(spans, spans[1:]))
        # Never longer than the planner's closed form (m − 1)·max t + Σ t (paper §3.1.2).
        assert max(b.end_ms for b in blocks) <= (m - 1) * max(t) + sum(t) + 1e-9


def test_png_bytes_are_deterministic(obj):
    assert png_bytes(timeline_figure(obj)) == png_bytes(timeline_figure(obj))


def test_atomic_writes_follow_the_umask(tmp_path):
    """memx.domain.io writes files as open() would (0666 & ~umask), executables 0777 & ~umask."""
    from memx.domain.io import atomic_write_text

    old = os.umask(0o022)
    try:
        plain = atomic_write_text(tmp_path / "plan.json", "{}")
        script = atomic_write_text(tmp_path / "megatron.sh", "#!/bin/sh\n", executable=True)
        os.umask(0o077)
        private = atomic_write_text(tmp_path / "secret.json", "{}")
    finally:
        os.umask(old)
    assert plain.stat().st_mode & 0o777 == 0o644
    assert script.stat().st_mode & 0o777 == 0o755
    assert private.stat().st_mode & 0o777 == 0o600
