"""Render a search result: the `memx plan` JSON contract, Markdown, and rich tables."""

from __future__ import annotations

from typing import Any

from memx.candidates import Candidate
from memx.plan import plan_to_dict
from memx.search import SearchResult

GIB = 1024.0


def predicted(c: Candidate) -> dict[str, Any]:
    return {
        "iteration_time_ms": round(c.iteration_time_ms, 3),
        "peak_mem_mib": [round(x, 1) for x in c.peak_mem_mib],
        "max_mem_mib": round(c.max_mem_mib, 1),
        "mem_variance_mib2": round(c.mem_variance_mib2, 1),
        "min_margin": round(c.min_margin, 4),
        "phi": round(c.phi, 5),
    }


def _entry(c: Candidate) -> dict[str, Any]:
    return {"plan": plan_to_dict(c.plan), "predicted": predicted(c)}


def to_json_obj(r: SearchResult, predictor: str) -> dict[str, Any]:
    """The `memx plan --format json` object (README: output contract)."""
    return {
        "plan": plan_to_dict(r.best.plan),
        "predicted": predicted(r.best),
        "weights": {"profile": r.weights.profile, "w": list(r.weights.as_tuple())},
        "space": {"total": r.space.total, "feasible": r.space.feasible, "layouts": r.space.layouts,
                  "splits": r.space.splits_total, "evaluated": r.space.evaluated},
        "search_s": round(r.search_s, 3),
        "predictor": predictor,
        "references": {"time_ms": r.refs[0], "max_mem_mib": r.refs[1], "mem_variance_mib2": r.refs[2],
                       "epsilon_mib2": r.epsilon_mib2},
        "top": [_entry(c) for c in r.top],
        "fastest": _entry(r.fastest),
        "pareto": [_entry(c) for c in r.pareto],
    }


def stages_text(c: Candidate) -> str:
    out = []
    for st in c.plan.stages:
        rc = st.recompute if st.recompute != "full" or st.recompute_layers is None else f"full:{st.recompute_layers}"
        out.append(f"{st.gpu}×{st.tp} {st.layers}L {rc}")
    return " | ".join(out)


def to_markdown(r: SearchResult, predictor: str) -> str:
    b, f = r.best, r.fastest
    slower = b.iteration_time_ms / f.iteration_time_ms - 1.0
    lines = [
        f"# MemX plan: {b.plan.model} on {b.plan.cluster}",
        "",
        f"Predictor `{predictor}`, weights `{r.weights.profile}` (wT, wM, wV) = {r.weights.as_tuple()}. "
        f"Searched {r.space.evaluated:,} layer splits over {r.space.layouts} layouts "
        f"({r.space.total:,} plans counting per-stage recompute) in {r.search_s:.1f} s; {r.space.feasible:,} feasible.",
        "",
        f"**Pick**: dp={b.plan.dp}, pp={b.plan.pp}, micro batch {b.plan.micro_batch} "
        f"({b.plan.micro_batches} per iteration): {stages_text(b)}",
        "",
        f"Predicted iteration {b.iteration_time_ms:,.0f} ms ({slower:+.1%} vs the fastest plan, "
        f"{f.iteration_time_ms:,.0f} ms), max memory {b.max_mem_mib / GIB:.1f} GiB, memory std-dev "
        f"{b.mem_variance_mib2 ** 0.5 / GIB:.2f} GiB, smallest margin {b.min_margin:.1%}, Φ = {b.phi:.3f}.",
        "",
        "| stage | GPU | tp | layers | recompute | time/µbatch ms | peak GiB | capacity GiB | margin |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s, st in enumerate(b.plan.stages):
        rc = st.recompute if st.recompute_layers is None else f"full (first {st.recompute_layers})"
        cap = b.capacity_mib[s]
        lines.append(f"| {s} | {st.gpu} | {st.tp} | {st.layers} | {rc} | {b.stage_time_ms[s]:.1f} | "
                     f"{b.stage_peak_mib[s] / GIB:.1f} | {cap / GIB:.0f} | {(cap - b.stage_peak_mib[s]) / cap:.1%} |")
    lines += ["", "## Top plans by Φ", "", "| # | Φ | T ms | M GiB | std GiB | margin | dp | µb | stages |",
              "|---|---|---|---|---|---|---|---|---|"]
    for i, c in enumerate(r.top, 1):
        lines.append(f"| {i} | {c.phi:.3f} | {c.iteration_time_ms:,.0f} | {c.max_mem_mib / GIB:.1f} | "
                     f"{c.mem_variance_mib2 ** 0.5 / GIB:.2f} | {c.min_margin:.1%} | {c.plan.dp} | {c.plan.micro_batch} | "
                     f"{stages_text(c)} |")
    return "\n".join(lines) + "\n"


def print_table(r: SearchResult, predictor: str, console) -> None:
    from rich.table import Table

    b, f = r.best, r.fastest
    console.print(f"[bold]MemX[/] {b.plan.model} on {b.plan.cluster} — predictor {predictor}, weights "
                  f"{r.weights.profile} {r.weights.as_tuple()}; {r.space.evaluated:,} splits / {r.space.layouts} "
                  f"layouts ({r.space.total:,} plans with per-stage recompute), {r.space.feasible:,} feasible, "
                  f"{r.search_s:.1f} s")
    top = Table(title="Top plans by Φ (lower is better)")
    for col in ("#", "Φ", "T ms", "vs fastest", "M GiB", "std GiB", "margin", "dp", "µb", "stages"):
        top.add_column(col, justify="right" if col not in ("stages",) else "left")
    for i, c in enumerate(r.top, 1):
        top.add_row(str(i), f"{c.phi:.3f}", f"{c.iteration_time_ms:,.0f}",
                    f"{c.iteration_time_ms / f.iteration_time_ms - 1:+.1%}", f"{c.max_mem_mib / GIB:.1f}",
                    f"{c.mem_variance_mib2 ** 0.5 / GIB:.2f}", f"{c.min_margin:.1%}", str(c.plan.dp),
                    str(c.plan.micro_batch), stages_text(c))
    console.print(top)
    mem = Table(title=f"Pick: per-GPU memory against capacity (each row = tp × dp = the stage's GPUs)")
    for col in ("stage", "GPU", "GPUs", "layers", "recompute", "peak GiB", "capacity GiB", "margin", ""):
        mem.add_column(col)
    for s, st in enumerate(b.plan.stages):
        cap, peak = b.capacity_mib[s], b.stage_peak_mib[s]
        bar = "█" * round(20 * peak / cap) + "░" * (20 - round(20 * peak / cap))
        rc = st.recompute if st.recompute_layers is None else f"full:{st.recompute_layers}"
        mem.add_row(str(s), st.gpu, f"{st.tp}×{b.plan.dp}", str(st.layers), rc, f"{peak / GIB:.1f}",
                    f"{cap / GIB:.0f}", f"{(cap - peak) / cap:.1%}", bar)
    console.print(mem)
    console.print(f"Fastest plan: {f.iteration_time_ms:,.0f} ms, M {f.max_mem_mib / GIB:.1f} GiB, std "
                  f"{f.mem_variance_mib2 ** 0.5 / GIB:.2f} GiB, margin {f.min_margin:.1%}: {stages_text(f)}")
