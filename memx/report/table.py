"""Render a plan answer. The `memx plan --format json` object (memx.planner.result) is the single
source: Markdown and the rich tables are drawn from it, whether the search ran in-process or in the
Prefect pipeline."""

from __future__ import annotations

from typing import Any

from memx.planner.result import search_result_to_dict
from memx.report.notation import (
    MARGIN_POINT, compact_stages, dp_text, group_line, is_grouped, listed_plans, margin_cells, margin_columns,
    micro_batch_text, pick_label, stage_rows,
)

GIB = 1024.0

# The pipeline's search step (memx.pipeline.steps) still imports the conversion under its old name;
# drop this alias once it imports memx.planner.result.search_result_to_dict.
to_json_obj = search_result_to_dict


def recompute_text(st: dict[str, Any], *, long: bool = False) -> str:
    """A plan-JSON stage's recompute: `full:N` (or `full (first N)`) for Megatron's block method."""
    n = st.get("recompute_layers")
    if n is None:
        return st["recompute"]
    return f"full (first {n})" if long else f"full:{n}"


def _m(plan: dict[str, Any]) -> int:
    return plan["global_batch"] // (plan["dp"] * plan["micro_batch"])


def _headline(obj: dict[str, Any]) -> str:
    sp, w = obj["space"], obj["weights"]
    return (f"Predictor `{obj['predictor']}`, weights `{w['profile']}` (wT, wM, wV) = {tuple(w['w'])}. "
            f"Searched {sp['evaluated']:,} layer splits over {sp['layouts']} layouts ({sp['total']:,} plans counting "
            f"per-stage recompute) {_search_time(obj)}; {sp['feasible']:,} feasible.")


def _search_time(obj: dict[str, Any]) -> str:
    """`in 1.2 s`, or for a stored search served again `reused (searched in 173 s on 2026-11-30 20:01 UTC)`."""
    reused = obj.get("reused")
    if not reused:
        return f"in {obj['search_s']:.1f} s"
    return f"reused (searched in {reused['search_s']:.0f} s on {reused['created_at'][:16].replace('T', ' ')} UTC)"


def _summary(obj: dict[str, Any]) -> str:
    b, f = obj["predicted"], obj["fastest"]["predicted"]
    high = f" ({b['min_margin_high']:.1%} at the upper memory bound)" if "min_margin_high" in b else ""
    return (f"Predicted iteration {b['iteration_time_ms']:,.0f} ms ({b['iteration_time_ms'] / f['iteration_time_ms'] - 1:+.1%} "
            f"vs the fastest plan, {f['iteration_time_ms']:,.0f} ms), max memory {b['max_mem_mib'] / GIB:.1f} GiB, memory "
            f"std-dev {b['mem_variance_mib2'] ** 0.5 / GIB:.2f} GiB, smallest margin {b['min_margin']:.1%} (point){high}, "
            f"Φ = {b['phi']:.3f}.")


def group_lines(obj: dict[str, Any]) -> list[str]:
    """A schema-2 pick: one line per replica group with its predicted time alone, then the cross-group
    gradient synchronisation (docs/architecture.md §Plan JSON, schema 2); [] for schema 1."""
    p, q = obj["plan"], obj["predicted"]
    if not is_grouped(p):
        return []
    times = [g.get("iteration_time_ms") for g in q.get("groups", [])]
    lines = [group_line(p, g) + (f": {times[g]:,.0f} ms alone" if g < len(times) and times[g] is not None else "")
             for g in range(len(p["groups"]))]
    sync = q.get("cross_group_sync_ms")
    if sync is not None:
        lines.append(f"cross-group gradient sync: {sync:,.0f} ms, added to the slowest group's time")
    return lines


def _pick_line(obj: dict[str, Any]) -> str:
    p, rule = obj["plan"], f" (rule `{(obj.get('pick') or {}).get('rule', 'phi')}`)"
    if is_grouped(p):
        return (f"**Pick**: {len(p['groups'])} replica groups (plan schema 2), {p['global_batch']} samples per iteration: "
                f"{compact_stages(p)}{rule}")
    return (f"**Pick**: dp={p['dp']}, pp={len(p['stages'])}, micro batch {p['micro_batch']} ({_m(p)} per iteration): "
            f"{compact_stages(p)}{rule}")


def _stage_table(obj: dict[str, Any]) -> list[str]:
    """The pick's stages; a schema-2 plan's rows carry their group and each pipeline's dp."""
    p = obj["plan"]
    grouped = is_grouped(p)
    lines = ([f"| group | stage | GPU | tp × dp | layers | recompute | time/µbatch ms | peak GiB | usable GiB | {MARGIN_POINT} |",
              "|---|---|---|---|---|---|---|---|---|---|"] if grouped else
             [f"| stage | GPU | tp | layers | recompute | time/µbatch ms | peak GiB | usable GiB | {MARGIN_POINT} |",
              "|---|---|---|---|---|---|---|---|---|"])
    for (g, s, st, dp), d in zip(stage_rows(p), obj["stages"]):
        cap = d["capacity_mib"]
        tp = f"{st['tp']} × {dp}" if grouped or "data_parallel" in st else st["tp"]  # issue #27: a stage's own dp
        head = f"| {g} | {s} | {st['gpu']} | {tp} |" if grouped else f"| {s} | {st['gpu']} | {tp} |"
        lines.append(f"{head} {st['layers']} | {recompute_text(st, long=True)} | {d['time_ms']:.1f} | "
                     f"{d['peak_mib'] / GIB:.1f} | {cap / GIB:.1f} | {(cap - d['peak_mib']) / cap:.1%} |")
    return lines


def to_markdown(obj: dict[str, Any]) -> str:
    p = obj["plan"]
    groups = group_lines(obj)
    lines = [f"# MemX plan: {p['model']} on {p['cluster']}", "", _headline(obj), "", _pick_line(obj), "",
             *([f"- {x}" for x in groups] + [""] if groups else []), _summary(obj), "", *_stage_table(obj)]
    head, rows = plan_rows(obj)
    lines += ["", f"## {PLANS_TITLE}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    head, rows = _pareto_rows(obj)
    if rows:
        lines += ["", f"## {pareto_title(obj)}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    if obj.get("explanation") or obj.get("warnings"):
        lines += ["", "## Why this plan", "", *[f"- {x}" for x in obj.get("explanation", [])],
                  *[f"- **warning**: {w}" for w in obj.get("warnings", [])]]
    return "\n".join(lines) + "\n"


def print_table(obj: dict[str, Any], console) -> None:
    from rich.table import Table  # rich only for the terminal table: `--format json` and Markdown never load it

    p, f = obj["plan"], obj["fastest"]
    console.print(f"[bold]MemX[/] {p['model']} on {p['cluster']} — {_headline(obj)}")
    head, rows = plan_rows(obj)
    top = Table(title=PLANS_TITLE)
    for col in head:
        top.add_column(col, justify="left" if col in ("plan", "stages") else "right")
    for i, r in enumerate(rows):
        top.add_row(*r, style="bold" if i == 0 else None)
    console.print(top)
    for line in group_lines(obj):
        console.print(f"  {line}")
    mem = Table(title="Pick: per-GPU memory against usable capacity (each row = tp × dp = the stage's GPUs)")
    for col in ("stage", "GPU", "GPUs", "layers", "recompute", "peak GiB", "usable GiB", MARGIN_POINT, ""):
        mem.add_column(col)
    for (g, s, st, dp), d in zip(stage_rows(p), obj["stages"]):
        cap, peak = d["capacity_mib"], d["peak_mib"]
        fill = round(20 * peak / cap)
        mem.add_row(str(s) if g is None else f"g{g} s{s}", st["gpu"], f"{st['tp']}×{dp}", str(st["layers"]), recompute_text(st), f"{peak / GIB:.1f}",
                    f"{cap / GIB:.1f}", f"{(cap - peak) / cap:.1%}", "█" * fill + "░" * (20 - fill))
    console.print(mem)
    _print_pareto(obj, console)
    q = f["predicted"]
    fp = f["plan"]
    console.print(f"Fastest plan: {q['iteration_time_ms']:,.0f} ms, M {q['max_mem_mib'] / GIB:.1f} GiB, std "
                  f"{q['mem_variance_mib2'] ** 0.5 / GIB:.2f} GiB, margin {q['min_margin']:.1%}, dp {dp_text(fp)}, "
                  f"µb {micro_batch_text(fp)}: {compact_stages(fp)}")
    if "explanation" in obj:
        console.print("[bold]Why this plan[/]")
        for line in obj["explanation"]:
            console.print(f"  • {line}")


PLANS_TITLE = "Plans: the pick first, then the top by Φ (lower is better)"
PARETO_TITLE = "Pareto front (time, smallest margin, memory std-dev), the pick first"


def pareto_title(obj: dict[str, Any]) -> str:
    """PARETO_TITLE, with the window the front covers when the search's front tolerance cut it (`pareto_window`)."""
    return PARETO_TITLE + (f", plans up to {w['max_iteration_time_ms']:,.0f} ms" if (w := obj.get("pareto_window")) else "")


def plan_rows(obj: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the plans table: memx.report.notation.listed_plans, the pick first and labelled."""
    listed = listed_plans(obj)
    cols = margin_columns([e for _l, _s, e in listed])
    t_fast = obj["fastest"]["predicted"]["iteration_time_ms"]
    head = ["plan", "Φ", "T ms", "vs fastest", "M GiB", "std GiB", *(h for h, _k in cols), "dp", "µb", "stages"]
    rows = []
    for label, _src, e in listed:
        q = e["predicted"]
        rows.append([label, f"{q['phi']:.3f}", f"{q['iteration_time_ms']:,.0f}", f"{q['iteration_time_ms'] / t_fast - 1:+.1%}",
                     f"{q['max_mem_mib'] / GIB:.1f}", f"{q['mem_variance_mib2'] ** 0.5 / GIB:.2f}", *margin_cells(e, cols),
                     dp_text(e["plan"]), micro_batch_text(e["plan"]), compact_stages(e["plan"])])
    return head, rows


def _pareto_rows(obj: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the Pareto front of (time, smallest margin, memory std-dev): the pick first (marked,
    also when it is not on the front), then the front by time."""
    front = obj.get("pareto", [])
    if not front:
        return [], []
    entries = [obj, *(e for e in front if e["plan"] != obj["plan"])]
    cols = margin_columns(entries)
    t_fast = obj["fastest"]["predicted"]["iteration_time_ms"]
    on_front = any(e["plan"] == obj["plan"] for e in front)
    head = ["T ms", "vs fastest", *(h for h, _k in cols), "std GiB", "dp", "µb", "stages", ""]
    rows = []
    for e in entries:
        q = e["predicted"]
        mark = (pick_label(obj) + ("" if on_front else ", not on the front")) if e is obj else (
            "fastest" if e["plan"] == obj["fastest"]["plan"] else "")
        rows.append([f"{q['iteration_time_ms']:,.0f}", f"{q['iteration_time_ms'] / t_fast - 1:+.1%}", *margin_cells(e, cols),
                     f"{q['mem_variance_mib2'] ** 0.5 / GIB:.2f}", dp_text(e["plan"]), micro_batch_text(e["plan"]),
                     compact_stages(e["plan"]), mark])
    return head, rows


def _print_pareto(obj: dict[str, Any], console) -> None:
    from rich.table import Table

    head, rows = _pareto_rows(obj)
    if not rows:
        return
    t = Table(title=pareto_title(obj))
    for col in head:
        t.add_column(col, justify="left" if col in ("stages", "") else "right")
    for i, r in enumerate(rows):
        t.add_row(*r, style="bold" if i == 0 else None)
    console.print(t)
