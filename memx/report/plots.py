"""The report's figures, drawn from the `memx plan --format json` object (README, "memx plan --format json").

Three PNGs: per-GPU memory against capacity for the pick, the time / smallest-margin / memory
std-dev trade-off with the pick and the fastest plan marked, and one 1F1B iteration of the pick.
matplotlib through `Figure` and the Agg canvas directly: no pyplot, no global backend switch, so
importing this module changes nothing.
"""

from __future__ import annotations

import io
import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from memx.report.notation import compact_stages, dp_text, is_grouped, micro_batch_text, pick_label, stage_rows
from memx.simulator.schedule import one_f1b_order

MIB_PER_GIB = 1024.0
DPI = 100
# Backward ≈ 2× forward: the backward pass computes gradients of activations and of weights, each a
# forward's FLOPs (Narayanan et al. 2021, "Efficient large-scale language model training on GPU
# clusters using Megatron-LM", §5.1). Recomputation makes the real split heavier on the backward side.
FORWARD_SHARE = 1.0 / 3.0
FORWARD_COLOR, BACKWARD_COLOR = "#9ecae1", "#2171b5"
PICK_STYLE = {"marker": "*", "s": 220, "color": "#d62728", "zorder": 5, "edgecolors": "black", "linewidths": 0.6}
FASTEST_STYLE = {"marker": "^", "s": 110, "color": "#2ca02c", "zorder": 4, "edgecolors": "black", "linewidths": 0.6}


def micro_batches(plan: Mapping[str, Any]) -> int:
    """m = global_batch / (dp · micro_batch) (docs/architecture.md §Plan JSON); a schema-2 plan: the
    largest group's m."""
    if is_grouped(plan):
        return max(int(g["micro_batches"]) for g in plan["groups"])
    return int(plan["global_batch"]) // (int(plan["dp"]) * int(plan["micro_batch"]))


def std_gib(predicted: Mapping[str, Any]) -> float:
    """Memory standard deviation over GPUs, GiB: √V with V in MiB² (paper §3.2, the V of Φ)."""
    return float(predicted["mem_variance_mib2"]) ** 0.5 / MIB_PER_GIB


def png_bytes(fig: Figure) -> bytes:
    """The figure as PNG; no software/version metadata, so equal inputs give equal bytes."""
    buf = io.BytesIO()
    FigureCanvasAgg(fig).print_png(buf, metadata={"Software": None})
    return buf.getvalue()


# --- memory --------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class GpuBar:
    replica: int
    stage: int
    tp_rank: int
    peak_mib: float
    capacity_mib: float


def _gpu_slots(plan: Mapping[str, Any]) -> list[tuple[int, int, int]]:
    """(replica, stage row, tp rank) per GPU in `predicted.peak_mem_mib` order: replica, stage, tp rank
    (README); a schema-2 plan group after group, replicas numbered on across groups and stage rows
    indexing the report's `stages` (group order)."""
    rows = stage_rows(plan)
    groups = sorted({g for g, *_ in rows}, key=lambda g: -1 if g is None else g)
    slots, replica = [], 0
    for g in groups:
        mine = [(i, st, dp) for i, (gg, _s, st, dp) in enumerate(rows) if gg == g]
        for _r in range(mine[0][2]):
            slots += [(replica, i, t) for i, st, _dp in mine for t in range(int(st["tp"]))]
            replica += 1
    return slots


def gpu_bars(obj: Mapping[str, Any]) -> list[GpuBar]:
    """One bar per GPU of the pick, in `predicted.peak_mem_mib` order (replica, stage, tp rank;
    README). Each stage's capacity comes from `stages[s].capacity_mib`."""
    plan, stages = obj["plan"], obj["stages"]
    slots = _gpu_slots(plan)
    peaks = obj["predicted"]["peak_mem_mib"]
    if len(peaks) != len(slots):  # an object without per-GPU peaks: one bar per stage
        return [GpuBar(replica=0, stage=s, tp_rank=0, peak_mib=d["peak_mib"], capacity_mib=d["capacity_mib"])
                for s, d in enumerate(stages)]
    return [GpuBar(replica=r, stage=s, tp_rank=t, peak_mib=float(p), capacity_mib=float(stages[s]["capacity_mib"]))
            for (r, s, t), p in zip(slots, peaks)]


AGGREGATE_ABOVE = 48  # more GPUs than this: one bar per stage row (its tp × dp GPUs share the stage's peak)
LEGEND_STAGES = 16  # stage rows named in the legend at most
# Stage colours: tab10 without its grey (C7), so no stage looks like the capacity outline.
_PALETTE = ("C0", "C1", "C2", "C3", "C4", "C5", "C6", "C8", "C9")


def _stage_color(s: int):
    return _PALETTE[s % len(_PALETTE)]


def memory_figure(obj: Mapping[str, Any]) -> Figure:
    """Peak per GPU against capacity; beyond AGGREGATE_ABOVE GPUs one bar per stage row (labelled with its
    GPU count). Capacity is a black outline behind each bar, never a colour a stage can have."""
    bars, plan = gpu_bars(obj), obj["plan"]
    per_stage = len(bars) > AGGREGATE_ABOVE
    if per_stage:
        rows = stage_rows(plan)
        bars = [GpuBar(replica=0, stage=s, tp_rank=0, peak_mib=float(d["peak_mib"]),
                       capacity_mib=float(d["capacity_mib"])) for s, d in enumerate(obj["stages"])]
        labels = [f"s{s} ×{int(st['tp']) * dp}" for s, (_g, _k, st, dp) in enumerate(rows)]
    else:
        labels = [f"r{b.replica}s{b.stage}" for b in bars]
    x = np.arange(len(bars))
    fig = Figure(figsize=(min(14.0, max(9.0, 0.28 * len(bars) + 5)), 4.4), dpi=DPI)
    ax = fig.add_subplot()
    ax.bar(x, [b.peak_mib / MIB_PER_GIB for b in bars], width=0.8, color=[_stage_color(b.stage) for b in bars],
           zorder=2)
    ax.bar(x, [b.capacity_mib / MIB_PER_GIB for b in bars], width=0.8, facecolor="none", edgecolor="black",
           linewidth=1.0, zorder=3)
    handles = [Patch(facecolor="none", edgecolor="black", label="usable GPU memory (capacity)")]
    for s, ((g, k, st, _dp), d) in enumerate(zip(stage_rows(plan), obj["stages"])):
        if s == LEGEND_STAGES:
            handles.append(Patch(facecolor="white", label=f"… {len(obj['stages']) - s} more stage rows"))
            break
        margin = (d["capacity_mib"] - d["peak_mib"]) / d["capacity_mib"]
        name = f"stage {k}" if g is None else f"group {g} stage {k}"
        handles.append(Patch(color=_stage_color(s), label=f"{name}: {st['gpu']} tp {st['tp']}, "
                             f"{d['peak_mib'] / MIB_PER_GIB:.1f} GiB, margin {margin:.0%}"))
    if not per_stage:
        for i in range(1, len(bars)):
            if bars[i].replica != bars[i - 1].replica:
                ax.axvline(i - 0.5, color="black", lw=0.8, ls=":")
    ax.set_xticks(x)
    ax.set_xticklabels(labels, rotation=90, fontsize=7)
    ax.set_xlim(-0.6, len(bars) - 0.4)
    ax.set_ylabel("GiB per GPU")
    what = "per stage row (×GPUs)" if per_stage else "per GPU (r = replica, s = stage row)"
    fig.suptitle(f"Pick: peak memory {what} against capacity, dp {dp_text(plan)}", fontsize=10)
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    fig.tight_layout()
    return fig


# --- trade-off -----------------------------------------------------------------------------------

def _plan_key(entry: Mapping[str, Any]) -> tuple:
    p = entry["plan"]
    return dp_text(p), micro_batch_text(p), compact_stages(p)


def candidate_entries(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Every distinct plan the object carries (Pareto set, top by Φ, fastest), first occurrence kept."""
    seen, out = set(), []
    for e in [*obj.get("pareto", []), *obj.get("top", []), obj["fastest"]]:
        if (k := _plan_key(e)) not in seen:
            seen.add(k)
            out.append(e)
    return out


def non_dominated(points: np.ndarray) -> np.ndarray:
    """Mask of rows no other row beats in every column (all minimised) and strictly in one: the
    Pareto front (Deb 2001, "Multi-objective optimization using evolutionary algorithms", §2.4)."""
    le = (points[None, :, :] <= points[:, None, :]).all(axis=2)
    lt = (points[None, :, :] < points[:, None, :]).any(axis=2)
    return ~(le & lt).any(axis=1)


def tradeoff_points(obj: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(points, front): per distinct plan (time ms, smallest margin, std-dev GiB) and whether it is
    on the front (time and std-dev minimised, margin maximised)."""
    rows = [(e["predicted"]["iteration_time_ms"], e["predicted"]["min_margin"], std_gib(e["predicted"]))
            for e in candidate_entries(obj)]
    pts = np.array(rows, dtype=float).reshape(-1, 3)
    return pts, non_dominated(pts * np.array([1.0, -1.0, 1.0]))


def _mark(ax, entry: Mapping[str, Any], y: float, style: dict, label: str) -> None:
    ax.scatter([entry["predicted"]["iteration_time_ms"]], [y], label=label, **style)


def pareto_figure(obj: Mapping[str, Any]) -> Figure:
    pts, front = tradeoff_points(obj)
    pick, fastest = obj, obj["fastest"]
    fig = Figure(figsize=(10, 4.2), dpi=DPI)
    axes = fig.subplots(1, 2)
    for ax, col, ylabel, scale in ((axes[0], 1, "smallest memory margin, point (%)  ↑ better", 100.0),
                                   (axes[1], 2, "memory std-dev over GPUs (GiB)  ↓ better", 1.0)):
        ax.scatter(pts[~front, 0], pts[~front, col] * scale, s=30, facecolors="none", edgecolors="#888888",
                   label="other plans in the report")
        ax.scatter(pts[front, 0], pts[front, col] * scale, s=36, color="#1f77b4",
                   label="not dominated (time, margin, std-dev)")
        y_pick = pick["predicted"]["min_margin"] * 100 if col == 1 else std_gib(pick["predicted"])
        y_fast = fastest["predicted"]["min_margin"] * 100 if col == 1 else std_gib(fastest["predicted"])
        _mark(ax, pick, y_pick, PICK_STYLE, pick_label(obj))
        _mark(ax, fastest, y_fast, FASTEST_STYLE, "fastest plan")
        ax.set_xlabel("predicted iteration time (ms)  ← better")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="best")
    fig.suptitle("Trade-off: iteration time against memory safety and balance", fontsize=10)
    fig.tight_layout()
    return fig


# --- 1F1B timeline -------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Block:
    stage: int
    micro_batch: int
    backward: bool
    start_ms: float
    end_ms: float


def _input_ready(done: dict, s: int, pp: int, kind: int, j: int) -> float | None:
    """When the input of (kind, micro batch j) on stage s is there: forward needs stage s−1's forward,
    backward needs stage s+1's backward (the last stage: its own forward). None = not yet computed."""
    if kind == 0:
        return 0.0 if s == 0 else done.get((0, s - 1, j))
    return done.get((0, s, j)) if s == pp - 1 else done.get((1, s + 1, j))


def f1b_blocks(stage_ms: list[float], m: int, forward_share: float = FORWARD_SHARE) -> list[Block]:
    """Forward/backward blocks of one 1F1B iteration without communication: each stage runs its
    operations in Megatron-LM's 1F1B order (Narayanan et al. 2021, §2.2, Fig. 4; the order is
    memx.simulator.schedule.one_f1b_order), each as soon as the stage is free and its input is ready."""
    pp = len(stage_ms)
    orders = [one_f1b_order(pp, m, s) for s in range(pp)]
    ptr, free, done, blocks = [0] * pp, [0.0] * pp, {}, []
    while any(ptr[s] < len(orders[s]) for s in range(pp)):
        progressed = False
        for s in range(pp):
            while ptr[s] < len(orders[s]):
                kind, j = orders[s][ptr[s]]
                ready = _input_ready(done, s, pp, kind, j)
                if ready is None:
                    break
                dur = stage_ms[s] * (1.0 - forward_share if kind else forward_share)
                start = max(free[s], ready)
                free[s] = done[(kind, s, j)] = start + dur
                blocks.append(Block(stage=s, micro_batch=j, backward=bool(kind), start_ms=start, end_ms=start + dur))
                ptr[s] += 1
                progressed = True
        if not progressed:  # cannot happen for the 1F1B order; guards edits
            raise RuntimeError("1F1B schedule deadlocked")
    return blocks


def _pipelines(plan: Mapping[str, Any]) -> list[tuple[int, int, int]]:
    """(first stage row, stages, m) of each pipeline the timeline draws: one, or one per group."""
    if not is_grouped(plan):
        return [(0, len(plan["stages"]), micro_batches(plan))]
    out, first = [], 0
    for g in plan["groups"]:
        out.append((first, len(g["stages"]), int(g["micro_batches"])))
        first += len(g["stages"])
    return out


def timeline_figure(obj: Mapping[str, Any]) -> Figure:
    """The 1F1B of the pick's pipeline; a schema-2 plan's groups one under the other, each with its m."""
    plan = obj["plan"]
    stage_ms = [float(d["time_ms"]) for d in obj["stages"]]
    m, pp = micro_batches(plan), len(stage_ms)
    blocks = [dataclasses.replace(b, stage=b.stage + first) for first, n, mg in _pipelines(plan)
              for b in f1b_blocks(stage_ms[first:first + n], mg)]
    fig = Figure(figsize=(11, 1.2 + 0.55 * pp), dpi=DPI)
    ax = fig.add_subplot()
    for backward, color in ((False, FORWARD_COLOR), (True, BACKWARD_COLOR)):
        for s in range(pp):
            spans = [(b.start_ms, b.end_ms - b.start_ms) for b in blocks if b.stage == s and b.backward == backward]
            ax.broken_barh(spans, (s - 0.4, 0.8), facecolors=color, edgecolors="white", linewidth=0.4,
                           label=("backward" if backward else "forward") if s == 0 else None)
    if m <= 16:
        for b in blocks:
            ax.text((b.start_ms + b.end_ms) / 2, b.stage, str(b.micro_batch + 1), ha="center", va="center",
                    fontsize=6, color="white" if b.backward else "black")
    t_pred = float(obj["predicted"]["iteration_time_ms"])
    ax.axvline(t_pred, color="#d62728", ls="--", lw=1, label="predicted iteration (+ p2p, all-reduce, optimizer)")
    ax.set_yticks(range(pp))
    ax.set_yticklabels([f"{'' if g is None else f'group {g} '}stage {s}: {st['gpu']}×{st['tp']}"
                        for g, s, st, _dp in stage_rows(plan)], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, max(t_pred, max(b.end_ms for b in blocks)) * 1.01)
    ax.set_xlabel("ms")
    ax.set_title(f"Pick: one 1F1B iteration, {m} micro batches per replica (gaps: the stage waits for a neighbour)",
                 fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    fig.tight_layout()
    return fig


FIGURES = {"memory.png": memory_figure, "pareto.png": pareto_figure, "timeline.png": timeline_figure}


def report_pngs(obj: Mapping[str, Any]) -> dict[str, bytes]:
    """File name → PNG bytes for each of the report's figures."""
    return {name: png_bytes(draw(obj)) for name, draw in FIGURES.items()}
