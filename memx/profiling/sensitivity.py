"""Single-parameter sweeps and the sensitivity table (paper, "Measure little": change one parameter at a
time on each GPU type, watch how much time and memory move, keep only the parameters that move them).

`sweep_points` builds the points (source `sweep:<param>`, the shared centre `sweep:default`);
`sensitivity_table` reads their measurements back by signature and ranks the parameters.
Sequence parallelism (issue #14) is swept off/on at the largest tp (its effect grows with tp: Korthikanti
et al. 2022 Table 2); every other point at tp > 1 carries the space's first listed value.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from memx.domain.plan import SEARCH_BLOCK, Recompute
from memx.domain.records import signature_key
from memx.domain.specs import ModelArch
from memx.profiling.design import GRID_PARAMS, GpuAxes, point

# Our choice: a parameter is selected when it moves stage time by ≥ 10 % (above the 2–4 % run-to-run
# noise of a single measurement, doubled for a max−min spread) or peak memory by ≥ 5 % (memory is
# nearly deterministic). The paper fixes query groups at a 0.8 % throughput change (Figure 3d).
TIME_THRESHOLD = 0.10
MEM_THRESHOLD = 0.05
SENSITIVITY_COLUMNS = ("gpu", "parameter", "values", "time_change", "mem_change", "sensitive", "searched",
                       "selected", "note")


def sweep_plan(ax: GpuAxes, model: ModelArch) -> dict[str, list[tuple[Any, dict[str, Any]]]]:
    """parameter → [(value, point)], every list starting with the shared centre point."""
    base = dict(tp=ax.default_tp, layers=ax.default_layers, micro_batch=ax.default_micro_batch, seq_len=ax.seq_len,
                sequence_parallel=ax.sequence_parallel)
    centre = point(ax.gpu, model, **base, source="sweep:default")

    def vary(param: str, values: list[Any], make) -> list[tuple[Any, dict[str, Any]]]:
        return [(v, make(v, f"sweep:{param}")) for v in dict.fromkeys(values)]

    fit = ax.max_layers_by_tp[ax.default_tp]
    half = max(1, ax.default_layers // 2)
    recompute = list(ax.recompute) + ([SEARCH_BLOCK] if ax.block and ax.default_layers >= 2 else [])
    plans = {
        "tp": vary("tp", list(ax.tps), lambda v, s: point(ax.gpu, model, **{**base, "tp": v}, source=s)),
        "micro_batch": vary("micro_batch", list(ax.micro_batches),
                            lambda v, s: point(ax.gpu, model, **{**base, "micro_batch": v}, source=s)),
        "recompute": vary("recompute", recompute, lambda v, s: point(
            ax.gpu, model, **base, recompute=Recompute.FULL if v == SEARCH_BLOCK else v,
            recompute_layers=half if v == SEARCH_BLOCK else None, source=s)),
        "layers": vary("layers", sorted({1, ax.default_layers, fit}),
                       lambda v, s: point(ax.gpu, model, **{**base, "layers": v}, source=s)),
        "inflight": vary("inflight", sorted({1, max(1, math.ceil(ax.max_inflight / 2)), ax.max_inflight}),
                         lambda v, s: point(ax.gpu, model, **base, inflight=v, source=s)),
        # swept around the searched length only to report its effect (it is not searched)
        "seq_len": vary("seq_len", [ax.seq_len // 2, ax.seq_len, ax.seq_len * 2],
                        lambda v, s: point(ax.gpu, model, **{**base, "seq_len": v}, source=s)),
        "position": vary("position", ["middle", "first", "last"], lambda v, s: point(
            ax.gpu, model, **base, first=v == "first", last=v == "last", source=s)),
    }
    top_tp = max(ax.tps, default=1)
    if top_tp > 1 and not ax.sp_fixed:  # the searched value first: the sweep's reference when the centre is not in it
        # (a MoE model has one value at tp > 1, memx.profiling.design.GpuAxes.sp_fixed: nothing to sweep)
        plans["sequence_parallel"] = vary("sequence_parallel", [ax.sequence_parallel, not ax.sequence_parallel],
                                          lambda v, s: point(ax.gpu, model, **{**base, "tp": top_tp,
                                                                                "sequence_parallel": v}, source=s))
    centre_key = signature_key(centre)
    for values in plans.values():  # the centre is measured once, under its own tag
        for i, (v, p) in enumerate(values):
            if signature_key(p) == centre_key:
                values[i] = (v, centre)
    return plans


def sweep_points(plans: dict[str, list[tuple[Any, dict[str, Any]]]]) -> list[dict[str, Any]]:
    seen: dict[str, dict[str, Any]] = {}
    for values in plans.values():
        for _, p in values:
            seen.setdefault(signature_key(p), p)
    centre = [p for p in seen.values() if p["source"] == "sweep:default"]
    return centre + [p for p in seen.values() if p["source"] != "sweep:default"]


def _change(values: np.ndarray, centre: float | None) -> float:
    """(max − min) / centre value over the ok measurements of one sweep; NaN with < 2 of them."""
    values = values[~np.isnan(values)]
    if len(values) < 2 or centre is None or not centre or math.isnan(centre):
        return math.nan
    return float((values.max() - values.min()) / centre)


def sensitivity_rows(gpu: str, plans: dict[str, list[tuple[Any, dict[str, Any]]]], runs: pd.DataFrame,
                     searched: set[str]) -> list[dict[str, Any]]:
    ok = runs[runs["status"] == "ok"]
    by_key = {signature_key(r): r for r in ok.to_dict("records")}
    rows = []
    for param, values in plans.items():
        measured = [by_key.get(signature_key(p)) for _, p in values]
        # the reference: the shared centre, or the sweep's first point when the centre is not in it
        # (sequence_parallel, swept at the largest tp)
        centre = next((m for (_, p), m in zip(values, measured) if p["source"] == "sweep:default"), measured[0])
        t = np.array([m["time_ms"] if m else np.nan for m in measured], dtype=float)
        mem = np.array([m["peak_mem_mib"] if m and m["peak_mem_mib"] is not None else np.nan for m in measured],
                       dtype=float)
        tc = _change(t, centre["time_ms"] if centre else None)
        mc = _change(mem, centre["peak_mem_mib"] if centre else None)
        unknown = math.isnan(tc) and math.isnan(mc)
        sensitive = unknown or (tc >= TIME_THRESHOLD if not math.isnan(tc) else False) or \
            (mc >= MEM_THRESHOLD if not math.isnan(mc) else False)
        in_search = param in searched
        note = "fewer than 2 ok measurements: kept (cannot tell)" if unknown else ""
        if not in_search:
            note = note or "not searched (one value): reported only"
        elif param == "sequence_parallel":
            note = note or "grid points at tp > 1 carry the first listed value; the other is this sweep's"
        elif param not in GRID_PARAMS:
            note = note or "always covered by its own points (inflight / first-last stages)"
        rows.append({"gpu": gpu, "parameter": param, "values": ",".join(str(v) for v, _ in values),
                     "time_change": tc, "mem_change": mc, "sensitive": bool(sensitive), "searched": in_search,
                     "selected": bool(sensitive and param in GRID_PARAMS), "note": note})
    return rows


def sensitivity_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=list(SENSITIVITY_COLUMNS))
    for col in ("time_change", "mem_change"):
        df[col] = df[col].astype("float64")
    for col in ("sensitive", "searched", "selected"):
        df[col] = df[col].astype(bool)
    return df


def sensitivity_markdown(df: pd.DataFrame) -> str:
    """The sensitivity report as a Markdown table (changes in percent)."""
    lines = ["# Sensitivity sweep", "",
             f"A parameter is sensitive when it moves stage time by ≥ {TIME_THRESHOLD:.0%} or peak memory by "
             f"≥ {MEM_THRESHOLD:.0%} ((max − min) / centre value); selected = sensitive and part of the grid.", "",
             "| gpu | parameter | values | time change | memory change | selected | note |",
             "|---|---|---|---|---|---|---|"]

    def pct(x: float) -> str:
        return "—" if math.isnan(x) else f"{x:.1%}"

    for r in df.to_dict("records"):
        lines.append(f"| {r['gpu']} | {r['parameter']} | {r['values']} | {pct(r['time_change'])} | "
                     f"{pct(r['mem_change'])} | {'yes' if r['selected'] else 'no'} | {r['note']} |")
    return "\n".join(lines) + "\n"
