"""The minimal-set design (paper, "How do tens of thousands of configurations become affordable"):
per GPU type, a 3-point grid (min, mid, max) over the parameters the sensitivity sweep selected,
embedding/output-stage points, block-recompute points, `inflight` coverage for memory, and dense
points on one representative interval per parameter for the interpolation gate.

Points are dicts with the stage_runs signature columns plus `source`, which tags how the point was
chosen: `design:grid`, `design:inflight`, `design:dense:<param>` (sweep points: `sweep:<param>`).
Points at tp > 1 carry the search space's first listed `sequence_parallel` value (issue #14: the profile
measures what the search asks for), a mixture-of-experts model's always true (the only value Megatron-LM trains it
with at tp > 1, memx.domain.plan.moe_problems); the distributed optimizer stays analytic (docs/profiling.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np
import pandas as pd

from memx.domain.plan import SEARCH_BLOCK, Recompute
from memx.domain.precision import DEFAULT_PRECISION, resolve_precision
from memx.domain.records import tied_on_ends
from memx.domain.runtime import usable_capacity_mib
from memx.domain.specs import Cluster, GpuType, ModelArch, SearchSpace
from memx.planner.cost import AnalyticStageModel
from memx.planner.moe import dense_layers_model
from memx.planner.space import valid_tps
from memx.profiling.experts import ExpertDesign, expert_peak_delta, fits

GRID_PARAMS = ("tp", "micro_batch", "recompute", "layers")
DENSE_POINTS = 7  # the paper densely measures 5–7 points on one interval


@dataclass(frozen=True, kw_only=True)
class GpuAxes:
    """The values the search can ask for on one GPU type, and the sweep's centre point."""

    gpu: str
    tps: tuple[int, ...]
    micro_batches: tuple[int, ...]
    recompute: tuple[str, ...]  # stage levels among none/selective/full
    block: bool  # the search also asks for full recompute of the first N layers
    max_layers_by_tp: dict[int, int]  # layers that fit with the leanest setting (analytic estimate)
    fit: dict[tuple[int, int, str], int]  # (tp, micro batch, recompute) → layers that fit (≥ 1)
    model_layers: int
    max_inflight: int
    seq_len: int
    default_tp: int
    default_micro_batch: int
    default_layers: int
    sequence_parallel: bool = False  # what points at tp > 1 carry: the space's first listed value
    sp_options: tuple[bool, ...] = (False,)  # the sequence_parallel values the search lists
    sp_fixed: bool = False  # a MoE model: true at tp > 1 is the only value the runtime trains (module docstring)
    # issue #27: a MoE model's searched ep values (memx.profiling.experts; (1,) dense) and, per (tp, ep) other than
    # the design's own ep, the layers that fit; the searched context-parallel sizes (each a rank length s/cp)
    eps: tuple[int, ...] = (1,)
    ep_fit: dict[tuple[int, int], int] = field(default_factory=dict)
    cps: tuple[int, ...] = (1,)


def three(values: Iterable[Any]) -> tuple[Any, ...]:
    """min, mid, max of sorted values (the paper's 3-point grid), duplicates dropped."""
    v = list(values)
    return tuple(dict.fromkeys((v[0], v[(len(v) - 1) // 2], v[-1]))) if v else ()


def stage_levels(space: SearchSpace) -> tuple[tuple[str, ...], bool]:
    """The stage levels to measure (block recompute is measured as `full` with recompute_layers) and
    whether the search asks for block recompute."""
    block = SEARCH_BLOCK in space.recompute_levels
    stage = tuple(r.value for r in Recompute if r in space.recompute_levels or (r is Recompute.FULL and block))
    return stage, block


def point(gpu: str, model: ModelArch, *, tp: int, layers: int, micro_batch: int, seq_len: int,
          recompute: str = Recompute.NONE, recompute_layers: int | None = None, first: bool = False,
          last: bool = False, inflight: int = 1, sequence_parallel: bool = False, source: str) -> dict[str, Any]:
    """One stage signature; `sequence_parallel` holds only at tp > 1 (no effect at tp = 1, and the
    default keeps the signature key of older profiles)."""
    return {"gpu": gpu, "tp": int(tp), "layers": int(layers), "micro_batch": int(micro_batch),
            "seq_len": int(seq_len), "recompute": str(recompute), "recompute_layers": recompute_layers,
            "first": bool(first), "last": bool(last), "inflight": int(inflight), "hidden": model.hidden,
            "ffn_hidden": model.ffn_hidden, "heads": model.heads, "query_groups": model.query_groups,
            "vocab": model.vocab, "mlp": model.mlp, "sequence_parallel": bool(sequence_parallel and tp > 1),
            "tied_embeddings": bool(tied_on_ends(model.tied_embeddings, first, last)), "source": source}


# The analytic model leaves out the allocator's context and fragmentation; grid points are placed
# within this share of (usable capacity − reserve) so few of them OOM (our choice; usable = nominal − driver
# reserve, memx.domain.runtime.usable_capacity_mib: what the measured peaks are out of).
FIT_SHARE = 0.9


def fitting_layers(gpu: GpuType, model: ModelArch, space: SearchSpace, combos: list[tuple[int, int, str]],
                   seq_len: int, sequence_parallel: bool = False, experts: ExpertDesign | None = None,
                   ep: int | None = None) -> dict[tuple[int, int, str], int]:
    """Most layers a middle stage holds (analytic estimate, inflight 1) per (tp, micro batch, recompute);
    0 when not even one fits. Only used to place points, never as a measurement. A MoE model's stages (`experts`)
    carry the closed form's expert terms at `ep` (the GPU type's design ep by default)."""
    n = np.arange(1, model.layers + 1)
    sigs = pd.DataFrame([point(gpu.name, model, tp=tp, layers=k, micro_batch=mb, seq_len=seq_len, recompute=rc,
                               sequence_parallel=sequence_parallel, source="") for tp, mb, rc in combos for k in n])
    peak = AnalyticStageModel(gpus={gpu.name: gpu}, runtime="none").predict(sigs)["peak_mem_mib"].to_numpy()
    if experts is not None:
        peak = peak + expert_peak_delta(experts, sigs, ep)
    fits = peak.reshape(len(combos), len(n)) <= FIT_SHARE * (usable_capacity_mib(gpu) - space.reserve_gib * 1024.0)
    return {c: int(n[row].max()) if row.any() else 0 for c, row in zip(combos, fits)}


def gpu_axes(cluster: Cluster, model: ModelArch, space: SearchSpace, gpu: GpuType,
             experts: ExpertDesign | None = None) -> GpuAxes:
    """The axes of one GPU type; `experts`: a MoE model's (memx.profiling.experts; `model` is then its dense
    equivalent, the points' model columns)."""
    tps = tuple(valid_tps(model, cluster, gpu.name, space.tp_options))
    mbs = tuple(space.micro_batch_options)
    recompute, block = stage_levels(space)
    seq = space.seq_len or model.seq_len
    leanest = recompute[-1] if recompute else Recompute.NONE.value
    combos = [(t, b, r) for t in tps for b in mbs for r in dict.fromkeys(recompute + (Recompute.NONE.value,))]
    sp_options = (True,) if experts is not None else tuple(bool(v) for v in space.sequence_parallel)  # module docstring
    sp = sp_options[0]
    fit = fitting_layers(gpu, model, space, combos, seq, sp, experts if experts and experts.everywhere else None)
    tp_def, mb_def = three(tps)[len(three(tps)) // 2], three(mbs)[len(three(mbs)) // 2]
    fit_none = fit[(tp_def, mb_def, Recompute.NONE)]
    eps, ep_fit = (1,), {}
    if experts is not None:
        eps = experts.eps[gpu.name]
        for t in tps:  # every searched tp (not only the grid's three): bench/moe_learned.py, time on 5 of 6 sets
            own = experts.ep_for(gpu.name, t) if experts.everywhere else None  # "points": every ep
            for e in (e for e in eps if e != own and fits(experts, gpu.name, t, e)):
                one = fitting_layers(gpu, model, space, [(t, mb_def, Recompute.NONE.value)], seq, sp, experts, e)
                ep_fit[(t, e)] = next(iter(one.values()))
    cps = tuple(c for c in space.context_parallel_options if c == 1 or seq % (2 * c) == 0)
    return GpuAxes(gpu=gpu.name, tps=tps, micro_batches=mbs, recompute=recompute, block=block,
                   max_layers_by_tp={t: max(1, fit[(t, mbs[0], leanest)]) for t in tps},
                   fit={c: max(1, v) for c, v in fit.items()}, model_layers=model.layers,
                   max_inflight=max(1, space.max_pp),
                   seq_len=seq, default_tp=tp_def, default_micro_batch=mb_def,
                   default_layers=max(1, min(fit_none // 2, model.layers // 2)),
                   sequence_parallel=sp, sp_options=sp_options, sp_fixed=experts is not None,
                   eps=eps, ep_fit=ep_fit, cps=cps)


def layer_levels(top: int) -> tuple[int, ...]:
    """1, mid, max layers, max = what fits for that setting (the search prunes stages beyond it)."""
    return tuple(dict.fromkeys((1, (1 + top + 1) // 2, top)))


def _levels(ax: GpuAxes, selected: set[str]) -> tuple[tuple[int, ...], tuple[int, ...], tuple[str, ...]]:
    tps = three(ax.tps) if "tp" in selected else (ax.default_tp,)
    mbs = three(ax.micro_batches) if "micro_batch" in selected else (ax.default_micro_batch,)
    rcs = three(ax.recompute) if "recompute" in selected else (Recompute.NONE.value,)
    return tps, mbs, rcs


def grid_points(ax: GpuAxes, model: ModelArch, selected: set[str]) -> list[dict[str, Any]]:
    """3-point grid over the selected parameters (middle stages, inflight 1), plus embedding/output
    stages on a one-in-three fraction each (index sum mod 3, a 3^(k-1) fractional factorial: every
    level of every parameter appears), whole-model stages (first and last: pp = 1), block recompute
    at N = layers/2 and one point just past the fitting layer count (expected OOM: the boundary)."""
    tps, mbs, rcs = _levels(ax, selected)
    out: list[dict[str, Any]] = []
    kw = dict(seq_len=ax.seq_len, sequence_parallel=ax.sequence_parallel, source="design:grid")
    for i, tp in enumerate(tps):
        for j, mb in enumerate(mbs):
            for k, rc in enumerate(rcs):
                top = ax.fit[(tp, mb, rc)]
                layers = layer_levels(top) if "layers" in selected else (min(ax.default_layers, top),)
                for m, n in enumerate(layers):
                    base = dict(tp=tp, layers=n, micro_batch=mb, recompute=rc, **kw)
                    out.append(point(ax.gpu, model, **base))
                    s = (i + j + k + m) % 3
                    if s == 0:  # stage 0 of a pipeline holds up to max_pp micro batches
                        out.append(point(ax.gpu, model, first=True, inflight=ax.max_inflight, **base))
                    elif s == 1:
                        out.append(point(ax.gpu, model, last=True, **base))
                if top >= ax.model_layers:
                    out.append(point(ax.gpu, model, tp=tp, layers=ax.model_layers, micro_batch=mb, recompute=rc,
                                     first=True, last=True, **kw))
            top = ax.fit.get((tp, mb, Recompute.FULL), 1)
            if ax.block and top >= 2 and "layers" in selected:
                out.append(point(ax.gpu, model, tp=tp, layers=top, micro_batch=mb, recompute=Recompute.FULL,
                                 recompute_layers=top // 2, **kw))
        if ax.max_layers_by_tp[tp] < ax.model_layers:
            out.append(point(ax.gpu, model, tp=tp, layers=ax.max_layers_by_tp[tp] + 1, micro_batch=mbs[0],
                             recompute=rcs[-1], **kw))
    return out


def inflight_points(ax: GpuAxes, model: ModelArch, selected: set[str]) -> list[dict[str, Any]]:
    """Memory grows with the micro batches held: middle stages at inflight mid/max (alternating)
    over tp × micro batch × {none, full} × {mid, max layers}."""
    if ax.max_inflight < 2:
        return []
    tps, mbs, _ = _levels(ax, selected)
    rcs = tuple(r.value for r in (Recompute.NONE, Recompute.FULL) if r in ax.recompute) or (Recompute.NONE.value,)
    values = (max(2, math.ceil(ax.max_inflight / 2)), ax.max_inflight)
    out = []
    for i, tp in enumerate(tps):
        for j, mb in enumerate(mbs):
            for k, rc in enumerate(rcs):
                for m, n in enumerate(layer_levels(ax.fit[(tp, mb, rc)])[-2:]):
                    out.append(point(ax.gpu, model, tp=tp, layers=n, micro_batch=mb, recompute=rc, seq_len=ax.seq_len,
                                     sequence_parallel=ax.sequence_parallel, inflight=values[(i + j + k + m) % 2], source="design:inflight"))
    return out


# Off: four points of the other setting per GPU type taught the trees less than the closed form's ratio does
# (memory coverage of plans without it fell from ≥ 90 % to 83 % on v100-t4-6, tests/unit/test_interval_scale.py);
# the transfer stays, and its bands widen (memx.learn.transfer, intervals.widened).
MEASURE_OTHER_SEQUENCE_PARALLEL = False


def axis_points(ax: GpuAxes, model: ModelArch, selected: set[str]) -> list[dict[str, Any]]:
    """Cheap points (one layer and the default layer count, no recompute) that keep the records from holding a
    single value where predictions would otherwise rest on a transfer through the closed form (issue #23):
    - a second micro batch when the sensitivity sweep did not select micro batch (the grid then holds only the
      default one): the other end of the searched range, at the default tp. Time per sample falls as GEMMs grow
      (memx.learn.model: with one micro batch, other ones are transferred by the closed form's GEMM-efficiency
      ratio and say so);
    - sequence parallelism the other way round at each grid tp > 1 when the space lists one value: the search
      asks for one, but a plan evaluated without it (or with it) is then measured, not transferred
      (LearnedStagePredictor.sequence_parallel_seen); not for a MoE model, which no runtime trains without it."""
    out: list[dict[str, Any]] = []
    kw = dict(seq_len=ax.seq_len, recompute=Recompute.NONE.value)
    if "micro_batch" not in selected and len(ax.micro_batches) > 1:
        lo, hi = ax.micro_batches[0], ax.micro_batches[-1]
        mb = hi if ax.default_micro_batch != hi else lo
        top = ax.fit.get((ax.default_tp, mb, Recompute.NONE.value), 1)
        for n in dict.fromkeys((1, min(ax.default_layers, top))):
            out.append(point(ax.gpu, model, tp=ax.default_tp, layers=n, micro_batch=mb,
                             sequence_parallel=ax.sequence_parallel, source="design:micro_batch", **kw))
    if len(ax.sp_options) == 1 and MEASURE_OTHER_SEQUENCE_PARALLEL and not ax.sp_fixed:
        for tp in (t for t in three(ax.tps) if t > 1):
            top = ax.fit.get((tp, ax.default_micro_batch, Recompute.NONE.value), 1)
            for n in dict.fromkeys((1, min(ax.default_layers, top))):
                out.append(point(ax.gpu, model, tp=tp, layers=n, micro_batch=ax.default_micro_batch,
                                 sequence_parallel=not ax.sequence_parallel, source="design:option:sequence_parallel",
                                 **kw))
    return out


def ep_points(ax: GpuAxes, model: ModelArch, memory: bool = False) -> list[dict[str, Any]]:
    """A MoE model's cheap points at every searched ep besides the design's own (memx.profiling.experts; every ep
    when the design itself measures the dense equivalent): one layer and the default layer count (at most what
    fits at that ep), default micro batch, no recompute, at each searched tp whose ep group fits on the GPU type
    (`GpuAxes.ep_fit`); a group that fits on no node runs its all-to-all over the NICs, and the row records that
    link. `memory`: also the default layer count at the largest inflight, with no and with full recompute — what
    the experts' activations add per micro batch held, and what recomputation leaves of them."""
    out = []
    for (tp, ep), top in ax.ep_fit.items():
        kw = dict(tp=tp, micro_batch=ax.default_micro_batch, seq_len=ax.seq_len, sequence_parallel=ax.sequence_parallel,
                  source="design:experts")
        n = min(ax.default_layers, max(top, 1))
        pts = [point(ax.gpu, model, layers=k, **kw) for k in dict.fromkeys((1, n))]
        if memory and ax.max_inflight > 1:
            pts.append(point(ax.gpu, model, layers=n, inflight=ax.max_inflight, **kw))
            if Recompute.FULL.value in ax.recompute:
                pts.append(point(ax.gpu, model, layers=n, recompute=Recompute.FULL.value, inflight=ax.max_inflight, **kw))
        out += [p | {"expert_parallel": ep} for p in pts]
    return out


def dense_first_points(ax: GpuAxes, model: ModelArch) -> list[dict[str, Any]]:
    """A MoE model's first `moe_first_dense_layers` k layers measured as what they are — dense layers of its
    `ffn_hidden` (memx.planner.moe.dense_layers_model: no experts, no expert columns) — on the first stage, where the
    planner places them (memx.planner.moe.split_layers), rather than predicted from the MoE rows and moved by the
    closed form's MLP difference (issue #27 session 5). At each grid tp and micro batch: one layer, and k' = min(k,
    what fits) layers at the largest inflight with no, selective and full recompute (what a held micro batch and
    recomputation leave); at each tp the k' layers as a whole-model stage's first layers (first and last: pp = 1).
    [] for a dense model or one without dense-first layers. The planner reads them through the predictor's
    difference between these layers as dense layers and as the dense equivalent (memx.planner.moe.dense_layers_shift)."""
    k = model.moe_first_dense_layers if model.is_moe else 0
    if not k:
        return []
    dense = dense_layers_model(model)
    kw = dict(seq_len=ax.seq_len, sequence_parallel=ax.sequence_parallel, first=True, source="design:dense_first")
    rcs = [r.value for r in (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL) if r.value in ax.recompute]
    out: list[dict[str, Any]] = []
    for tp in three(ax.tps):
        for mb in three(ax.micro_batches):
            n = min(k, max(ax.fit.get((tp, mb, Recompute.NONE.value), 1), 1))
            out.append(point(ax.gpu, dense, tp=tp, layers=1, micro_batch=mb, **kw))
            out += [point(ax.gpu, dense, tp=tp, layers=n, micro_batch=mb, recompute=rc, inflight=ax.max_inflight, **kw)
                    for rc in rcs]
        n = min(k, max(ax.fit.get((tp, ax.default_micro_batch, Recompute.NONE.value), 1), 1))
        out.append(point(ax.gpu, dense, tp=tp, layers=n, micro_batch=ax.default_micro_batch, last=True, **kw))
    return list({tuple(sorted((a, str(b)) for a, b in p.items())): p for p in out}.values())


def context_points(ax: GpuAxes, model: ModelArch, selected: set[str]) -> list[dict[str, Any]]:
    """Cheap points at every searched context-parallel size cp > 1 (issue #27): a cp rank runs its stage on s/cp
    tokens (memx.planner.context_parallel), so each GPU type measures that length — one layer and the default
    layer count at each grid tp, the default micro batch, no recompute, and the default stage as embedding
    (first, max inflight) and as output stage (last) — rather than reaching it by a transfer through the closed
    form (memx.learn.transfer.seq_len_transfer: widened bands). The ring attention's own terms (the K/V exchange,
    the cp − 1 further blocks) stay the closed form's, added after any predictor."""
    tps, _, _ = _levels(ax, selected)
    out: list[dict[str, Any]] = []
    for cp in (c for c in ax.cps if c > 1):
        kw = dict(micro_batch=ax.default_micro_batch, seq_len=ax.seq_len // cp, sequence_parallel=ax.sequence_parallel,
                  source=f"design:context_parallel:{cp}")
        for tp in tps:
            top = ax.fit.get((tp, ax.default_micro_batch, Recompute.NONE.value), 1)
            out += [point(ax.gpu, model, tp=tp, layers=n, **kw) for n in dict.fromkeys((1, min(ax.default_layers, top)))]
        n = min(ax.default_layers, ax.fit.get((ax.default_tp, ax.default_micro_batch, Recompute.NONE.value), 1))
        out.append(point(ax.gpu, model, tp=ax.default_tp, layers=n, first=True, inflight=ax.max_inflight, **kw))
        out.append(point(ax.gpu, model, tp=ax.default_tp, layers=n, last=True, **kw))
    return out


def _spread(lo: int, hi: int, count: int, step: int = 1) -> list[int]:
    vals = np.unique(np.round(np.linspace(lo, hi, count) / step).astype(int) * step)
    return [int(v) for v in vals if v >= 1]


def dense_points(ax: GpuAxes, model: ModelArch) -> list[dict[str, Any]]:
    """5–7 points on one representative interval per parameter (paper: "densely measured at five to
    seven points", R² > 0.95 gate): layers (vs memory), micro batch and seq_len (vs time)."""
    base = dict(tp=ax.default_tp, micro_batch=ax.default_micro_batch, seq_len=ax.seq_len, layers=ax.default_layers)
    top = ax.max_layers_by_tp[ax.default_tp]
    lo_mb = ax.micro_batches[0]
    series = {
        "layers": _spread(1, top, DENSE_POINTS),
        "micro_batch": _spread(lo_mb, max(ax.micro_batches[-1], lo_mb + 4), 5),
        # seq_len: half to twice the searched length (our choice), multiples of 128
        "seq_len": _spread(ax.seq_len // 2, ax.seq_len * 2, 5, step=128),
    }
    out = []
    for param, values in series.items():
        for v in values:
            out.append(point(ax.gpu, model, **{**base, param: v}, sequence_parallel=ax.sequence_parallel,
                             source=f"design:dense:{param}"))
    return out


def profile_precision(cluster: Cluster, space: SearchSpace) -> str:
    """The precision the profile measures in: the space's, resolved over every GPU type of the cluster (auto: bf16
    where all have it, else fp16 — a V100 + A100 cluster trains, so profiles, in fp16; memx.domain.precision).
    Records carry no precision column: a profile is of one precision (docs/profiling.md)."""
    return resolve_precision(space.precision, cluster.gpu_types, f"search space {space.name}")


def with_precision(points: list[dict[str, Any]], precision: str) -> list[dict[str, Any]]:
    """The points with the precision the backend runs them in (the simulated backend reads it; bf16 is the
    signatures' default and is not written, so earlier points stay as they were)."""
    return points if precision == DEFAULT_PRECISION else [{**p, "precision": precision} for p in points]


def representative_gpu(cluster: Cluster) -> GpuType:
    """The dense intervals are measured on one GPU type: the one with the most memory (fewest OOMs;
    our choice), ties broken by cluster order."""
    return max(cluster.gpu_types, key=lambda g: g.memory_gib)


def full_grid_size(ax: GpuAxes) -> int:
    """Points of the full grid over every value the search can ask for on this GPU type:
    tp (× the sequence_parallel values listed, at tp > 1) × micro batch × inflight (1..max_pp) × ep (a MoE
    model's searched values) × cp (the searched context-parallel sizes: one rank length each) ×
    Σ_{n=1..L} positions(n) × recompute options(n), with positions = middle/first/last (+ first-and-last at n = L) and options = levels (+ N = 1..n−1 when
    block recompute is searched)."""
    total = 0
    for n in range(1, ax.model_layers + 1):
        positions = 3 + (1 if n == ax.model_layers else 0)
        options = len(ax.recompute) + ((n - 1) if ax.block else 0)
        total += positions * options
    tps = sum(1 if t == 1 else len(ax.sp_options) for t in ax.tps)
    return tps * len(ax.micro_batches) * ax.max_inflight * total * len(ax.eps) * len(ax.cps)
