"""`report.html`: a self-contained page for a plan answer, plus its figures as PNG files.

Drawn from the `memx plan --format json` object (README, "memx plan --format json") only. The page
needs no network: no scripts, no external style sheets or fonts; the figures are inline base64 PNGs,
the same bytes as memory.png, pareto.png and timeline.png beside it (for CI summaries). Every string
from the object is HTML-escaped.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any, Callable, Mapping

from memx.domain.errors import InputError
from memx.domain.io import atomic_write_bytes
from memx.report.notation import (
    MARGIN_HIGH, MARGIN_POINT, compact_stages, dp_text, group_line, is_grouped, listed_plans, margin_columns,
    micro_batch_text, stage_rows,
)
from memx.report.plots import MIB_PER_GIB, micro_batches, report_pngs, std_gib

REPORT_NAME = "report.html"
REQUIRED = ("plan", "predicted", "stages", "fastest")

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1150px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 1.8em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.9em; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; white-space: nowrap; }
th { background: #f3f3f3; white-space: normal; vertical-align: bottom; }
td.text { text-align: left; } td.stages { white-space: normal; min-width: 18em; }
div.scroll { overflow-x: auto; }
tr.pick td { background: #fff1f0; font-weight: 600; } tr.fastest td { background: #f0fff0; }
figure { margin: 0.5em 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption, p.note { font-size: 0.85em; color: #555; } code { font-size: 0.95em; }
"""


@dataclass(frozen=True, kw_only=True)
class Column:
    header: str
    css: str  # the cell's class; tests read cells by it
    cell: Callable[[Mapping[str, Any], float], str]  # (entry, fastest time ms) → text


def _pred(key: str) -> Callable[[Mapping[str, Any]], float]:
    return lambda e: float(e["predicted"][key])


COLUMNS = (
    Column(header="time / iteration (ms)", css="time", cell=lambda e, tf: f"{_pred('iteration_time_ms')(e):,.1f}"),
    Column(header="vs fastest", css="slowdown", cell=lambda e, tf: f"{_pred('iteration_time_ms')(e) / tf - 1:+.1%}"),
    Column(header="max memory (GiB)", css="max-mem", cell=lambda e, tf: f"{_pred('max_mem_mib')(e) / MIB_PER_GIB:.2f}"),
    Column(header="memory std-dev (GiB)", css="std", cell=lambda e, tf: f"{std_gib(e['predicted']):.3f}"),
    Column(header=f"smallest {MARGIN_POINT}", css="margin", cell=lambda e, tf: f"{_pred('min_margin')(e):.1%}"),
    Column(header="Φ", css="phi", cell=lambda e, tf: f"{_pred('phi')(e):.4f}"),
    Column(header="dp", css="dp", cell=lambda e, tf: dp_text(e["plan"])),
    Column(header="micro batch", css="micro-batch", cell=lambda e, tf: micro_batch_text(e["plan"])),
    Column(header="stages (GPU×tp [layers] recompute)", css="text stages", cell=lambda e, tf: compact_stages(e["plan"])),
)


HIGH_COLUMN = Column(header=f"smallest {MARGIN_HIGH}", css="margin-high",
                     cell=lambda e, tf: f"{e['predicted']['min_margin_high']:.1%}" if "min_margin_high" in e["predicted"]
                     else "n/a")


def comparison_rows(obj: Mapping[str, Any]) -> list[tuple[str, str, Mapping[str, Any]]]:
    """(label, source in the object, entry): memx.report.notation.listed_plans — the pick first, labelled
    with its rule, as in the terminal and Markdown tables."""
    return listed_plans(obj)


def _columns(rows: list[tuple[str, str, Mapping[str, Any]]]) -> tuple[Column, ...]:
    """COLUMNS, with the upper-bound margin beside the point margin when an entry has one."""
    if len(margin_columns([e for _l, _s, e in rows])) == 1:
        return COLUMNS
    i = next(j for j, c in enumerate(COLUMNS) if c.css == "margin") + 1
    return (*COLUMNS[:i], HIGH_COLUMN, *COLUMNS[i:])


def _cell(tag: str, text: str, css: str = "") -> str:
    cls = f' class="{escape(css)}"' if css else ""
    return f"<{tag}{cls}>{escape(text)}</{tag}>"


def _tr(cells: list[str], *, tag: str = "td", attrs: str = "", classes: list[str] | None = None) -> str:
    return f"<tr{attrs}>" + "".join(_cell(tag, x, c) for x, c in zip(cells, classes or [""] * len(cells))) + "</tr>"


def comparison_table(obj: Mapping[str, Any]) -> str:
    t_fast = float(obj["fastest"]["predicted"]["iteration_time_ms"])
    rows = comparison_rows(obj)
    cols = _columns(rows)
    head = _tr(["plan", *(c.header for c in cols)], tag="th")
    body = [_tr([label, *(c.cell(e, t_fast) for c in cols)], classes=["text role", *(c.css for c in cols)],
                attrs=f' class="{escape(src.split(":")[0])}" data-source="{escape(src)}"')
            for label, src, e in rows]
    return f'<div class="scroll"><table id="comparison"><thead>{head}</thead><tbody>{"".join(body)}</tbody></table></div>'


def stage_table(obj: Mapping[str, Any]) -> str:
    plan = obj["plan"]
    head = _tr(["stage", "GPU", "GPUs (tp × dp)", "layers", "recompute", "time / micro batch (ms)", "peak (GiB)",
                "usable (GiB)", MARGIN_POINT], tag="th")
    rows = []
    for (g, s, st, dp), d in zip(stage_rows(plan), obj["stages"]):
        cap, peak = float(d["capacity_mib"]), float(d["peak_mib"])
        rc = st["recompute"] if st.get("recompute_layers") is None else f"full (first {st['recompute_layers']} layers)"
        rows.append(_tr([str(s) if g is None else f"group {g} stage {s}", st["gpu"], f"{st['tp']} × {dp}", str(st["layers"]), rc, f"{float(d['time_ms']):,.1f}",
                         f"{peak / MIB_PER_GIB:.2f}", f"{cap / MIB_PER_GIB:.1f}", f"{(cap - peak) / cap:.1%}"],
                        classes=["stage", "text gpu", "gpus", "layers", "text recompute", "time", "peak", "capacity", "margin"]))
    return f'<div class="scroll"><table id="stages"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table></div>'


def _window_note(obj: Mapping[str, Any]) -> str:
    """The window the Pareto set covers when the search's front tolerance cut it (`pareto_window`), else ''."""
    w = obj.get("pareto_window")
    return f"; the Pareto set covers plans up to {w['max_iteration_time_ms']:,.0f} ms" if w else ""


def _figure(png: bytes, alt: str, caption: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{escape(alt)}">'
            f"<figcaption>{escape(caption)}</figcaption></figure>")


def _pick_text(obj: Mapping[str, Any]) -> str:
    p, q = obj["plan"], obj["predicted"]
    if not is_grouped(p):
        return (f"Pick: dp {p['dp']}, {len(p['stages'])} pipeline stages, micro batch {p['micro_batch']} "
                f"({micro_batches(p)} per replica and iteration): {compact_stages(p)}.")
    sync = q.get("cross_group_sync_ms")
    return (f"Pick: {len(p['groups'])} replica groups (plan schema 2): "
            + "; ".join(group_line(p, g) for g in range(len(p["groups"])))
            + ("." if sync is None else f"; cross-group gradient sync {float(sync):,.1f} ms."))


def _summary(obj: Mapping[str, Any]) -> str:
    q, f = obj["predicted"], obj["fastest"]["predicted"]
    t, tf = float(q["iteration_time_ms"]), float(f["iteration_time_ms"])
    return (f"{_pick_text(obj)} Predicted iteration {t:,.1f} ms "
            f"({t / tf - 1:+.1%} vs the fastest plan, {tf:,.1f} ms), max memory {float(q['max_mem_mib']) / MIB_PER_GIB:.2f} GiB, "
            f"memory std-dev {std_gib(q):.3f} GiB, smallest margin {float(q['min_margin']):.1%}, Φ = {float(q['phi']):.4f}.")


def _search_note(obj: Mapping[str, Any]) -> str:
    parts = [f"Predictor {obj.get('predictor', '?')}."]
    if w := obj.get("weights"):
        parts.append(f"Weights {w.get('profile')} (wT, wM, wV) = {tuple(w.get('w', ()))}.")
    if sp := obj.get("space"):
        parts.append(f"Searched {sp.get('evaluated', 0):,} layer splits over {sp.get('layouts', 0)} layouts "
                     f"({sp.get('total', 0):,} plans counting per-stage recompute), {sp.get('feasible', 0):,} feasible")
        parts[-1] += f", in {float(obj['search_s']):.1f} s." if "search_s" in obj else "."
    return " ".join(parts)


def render_html(obj: Mapping[str, Any], pngs: Mapping[str, bytes]) -> str:
    """The page; `pngs` are `memx.report.plots.report_pngs(obj)`."""
    p = obj["plan"]
    title = f"MemX plan: {p['model']} on {p['cluster']}"
    sections = [
        f"<h1>{escape(title)}</h1>", f"<p>{escape(_summary(obj))}</p>", f'<p class="note">{escape(_search_note(obj))}</p>',
        "<h2>Pick, fastest plan and the other top plans</h2>", comparison_table(obj),
        '<p class="note">Φ: the weighted score of time, max memory and memory variance (lower is better; '
        "paper §3.1.2). Margin: free share of a GPU's memory at its peak; the smallest over all GPUs.</p>",
        "<h2>Memory per GPU</h2>",
        _figure(pngs["memory.png"], "peak memory per GPU against capacity",
                "Each bar is one GPU of the pick (every stage has tp × dp GPUs); grey: the GPU's memory, colour: "
                "the predicted peak."),
        stage_table(obj),
        "<h2>Trade-off</h2>",
        _figure(pngs["pareto.png"], "iteration time against smallest margin and memory std-dev",
                "Every plan in the report (the search's Pareto set and the top plans by Φ); filled: not dominated "
                "in time, smallest margin and memory std-dev together" + _window_note(obj) + "."),
        "<h2>One iteration</h2>",
        _figure(pngs["timeline.png"], "one 1F1B iteration of the pick",
                "Forward and backward of each micro batch per stage in the 1F1B order of Megatron-LM (Narayanan et "
                "al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM, §2.2); "
                "stage times split 1 : 2 between forward and backward; communication not drawn."),
    ]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f'<link rel="icon" href="data:,"><title>{escape(title)}</title><style>{STYLE}</style></head>\n'
            "<body>\n" + "\n".join(sections) + "\n</body></html>\n")




def write_report(obj: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """Write report.html and memory.png, pareto.png, timeline.png into out_dir (atomically, with the
    umask's permissions); returns their paths, report.html first."""
    if missing := [k for k in REQUIRED if k not in obj]:
        raise InputError(f"report: the plan answer lacks field(s) {', '.join(missing)}; expected the "
                         "`memx plan --format json` object (fields plan, predicted, stages, fastest, top, pareto)")
    out_dir = Path(out_dir)
    pngs = report_pngs(obj)
    written = [atomic_write_bytes(out_dir / REPORT_NAME, render_html(obj, pngs).encode("utf-8"))]
    return written + [atomic_write_bytes(out_dir / name, data) for name, data in pngs.items()]
