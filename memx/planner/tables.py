"""Per-stage lookup tables built from one batch of stage predictions, and their per-layout stacks.

A *stage context* is everything about a stage but its layer count and recompute choice: GPU, tp,
micro batch, first/last, inflight. For each context and layer count n the recompute options form a
*ladder*: the Pareto-sorted options (time ascending, memory strictly descending), so "one level
up" always buys memory with time (docs/architecture.md §Recompute). Option codes: NONE = -2,
SELECTIVE = -1, k ≥ 1 = full recomputation of the first k layers (k = n is plain `full`; k < n is
Megatron's block method).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from memx.domain.precision import DEFAULT_PRECISION
from memx.domain.plan import SEARCH_BLOCK, Plan, Recompute, Stage
from memx.planner.interleave import inflight_chunks
from memx.planner.schedule import (MemoryStats, Pipeline, assemble_columns, drains, inflight_micro_batches,
                                   stage_tail_ms)

NONE, SELECTIVE = -2, -1


@dataclass(frozen=True, kw_only=True)
class StageContext:
    gpu: str
    tp: int
    micro_batch: int
    first: bool
    last: bool
    inflight: int
    # Job options in the stage signature (memx.domain.records.OPTION_DEFAULTS, canonical: dp 1 without
    # the distributed optimizer, sequence_parallel false at tp 1).
    distributed_optimizer: bool = False
    dp: int = 1
    sequence_parallel: bool = False
    precision: str = DEFAULT_PRECISION  # training precision (memx.domain.precision): peak and bytes per param
    # Interleaved 1F1B (issue #27, memx.planner.interleave): v model chunks per rank, k chunks held at the
    # peak; `inflight` is then ⌊k/v⌋ and the peak is interpolated towards ⌊k/v⌋ + 1. Plain 1F1B: 1 and 0.
    virtual_stages: int = 1
    inflight_chunks: int = 0
    # Context parallelism (issue #27, memx.planner.context_parallel): cp ranks share each sequence; the
    # signature is the rank's (seq_len s/cp, `dp` the dp·cp optimizer shards) and the ring over its link adds
    # its terms (add_ring_terms). 1: none.
    context_parallel: int = 1
    cp_gbps: float = 0.0
    cp_latency_ms: float = 0.0
    # Mixture of experts (issue #27, memx.planner.moe): ep, the expert data-parallel size dp / ep, and the link of
    # the stage's all-to-all (effective GB/s per rank, latency ms), the expert-dp rings' slowdown against the dp
    # ring's bandwidth (memx.planner.moe.a2a_links). A dense model's stages: 1, 1, 0, 0, 1.
    expert_parallel: int = 1
    expert_dp: int = 1
    a2a_gbps: float = 0.0
    a2a_latency_ms: float = 0.0
    expert_dp_slowdown: float = 1.0


def stage_contexts(stage_gpus: Sequence[str], stage_tp: Sequence[int], *, micro_batch: int,
                   micro_batches: int, distributed_optimizer: bool = False, dp: int = 1,
                   sequence_parallel: bool = False, virtual_stages: int = 1,
                   precision: str = DEFAULT_PRECISION, context_parallel: int = 1,
                   cp_links: tuple[Sequence[float], Sequence[float]] | None = None) -> tuple[StageContext, ...]:
    """The context of every stage of a pipeline (a search layout or a given plan); with context parallelism
    the optimizer shards over dp·cp ranks (memx.domain.context_parallel) and `cp_links` gives each stage's
    ring (GB/s, latency ms). Memoised (a search asks for every layout's contexts more than once, and
    replica-group searches ask for the same ones again)."""
    ring = None if cp_links is None else (tuple(cp_links[0]), tuple(cp_links[1]))
    return _stage_contexts(tuple(stage_gpus), tuple(stage_tp), micro_batch, micro_batches, distributed_optimizer,
                           dp, sequence_parallel, virtual_stages, precision, context_parallel, ring)


@lru_cache(maxsize=1 << 14)
def _stage_contexts(stage_gpus: tuple[str, ...], stage_tp: tuple[int, ...], micro_batch: int, micro_batches: int,
                    distributed_optimizer: bool, dp: int, sequence_parallel: bool, virtual_stages: int,
                    precision: str, context_parallel: int,
                    cp_links: tuple[tuple[float, ...], tuple[float, ...]] | None) -> tuple[StageContext, ...]:
    pp, v, cp = len(stage_gpus), virtual_stages, context_parallel
    ring = cp_links or ((0.0,) * pp, (0.0,) * pp)
    chunks = [inflight_chunks(pp, s, micro_batches, v) if v > 1 else 0 for s in range(pp)]
    return tuple(StageContext(gpu=g, tp=t, micro_batch=micro_batch, first=s == 0, last=s == pp - 1,
                              inflight=chunks[s] // v if v > 1 else inflight_micro_batches(pp, s, micro_batches),
                              distributed_optimizer=distributed_optimizer, dp=dp * cp if distributed_optimizer else 1,
                              sequence_parallel=sequence_parallel and t > 1, virtual_stages=v,
                              inflight_chunks=chunks[s], precision=precision, context_parallel=cp,
                              cp_gbps=ring[0][s] if cp > 1 else 0.0, cp_latency_ms=ring[1][s] if cp > 1 else 0.0)
                 for s, (g, t) in enumerate(zip(stage_gpus, stage_tp, strict=True)))


def plan_contexts(plan: Plan, cp_links=None) -> tuple[StageContext, ...]:
    """The stage contexts of a given plan; `cp_links` (memx.planner.context_parallel.cp_links) for cp > 1."""
    return stage_contexts([st.gpu for st in plan.stages], [st.tp for st in plan.stages],
                          micro_batch=plan.micro_batch, micro_batches=plan.micro_batches,
                          distributed_optimizer=plan.distributed_optimizer, dp=plan.dp,
                          sequence_parallel=plan.sequence_parallel, virtual_stages=plan.virtual_stages,
                          precision=plan.precision, context_parallel=plan.context_parallel, cp_links=cp_links)


def stage_options(n: int, levels: tuple[str, ...]) -> list[int]:
    """Recompute option codes searched for a stage of n layers (levels: Recompute values and SEARCH_BLOCK)."""
    opts: list[int] = []
    if Recompute.NONE in levels:
        opts.append(NONE)
    if Recompute.SELECTIVE in levels:
        opts.append(SELECTIVE)
    if SEARCH_BLOCK in levels:
        opts.extend(range(1, n))
    if Recompute.FULL in levels or SEARCH_BLOCK in levels:
        opts.append(n)
    return opts


def decode_option(code: int, n: int) -> tuple[Recompute, int | None]:
    """Option code → (recompute, recompute_layers) as in plan JSON."""
    if code == NONE:
        return (Recompute.NONE, None)
    if code == SELECTIVE:
        return (Recompute.SELECTIVE, None)
    return (Recompute.FULL, None if code >= n else int(code))


def option_code(stage: Stage) -> int:
    """A plan stage's recompute → option code (the inverse of decode_option)."""
    if stage.recompute == Recompute.NONE:
        return NONE
    if stage.recompute == Recompute.SELECTIVE:
        return SELECTIVE
    return stage.recomputed_layers


@dataclass(frozen=True, kw_only=True)
class StageTable:
    """Ladders of one context for n = 0..n_max (row 0 unused). Shapes (n_max+1, K) or (n_max+1,)."""

    time_ms: np.ndarray
    peak_mib: np.ndarray
    code: np.ndarray
    length: np.ndarray
    fit: np.ndarray  # first ladder index that fits capacity − reserve, −1 if none
    static_mib: np.ndarray
    params_per_rank: np.ndarray
    # Issue #22: the predictor's upper memory bound of each ladder level, max(peak_mem_mib_high, peak) (the
    # point peak where the interval is NaN); None for a predictor without intervals (the closed form).
    high_mib: np.ndarray | None = None

    @cached_property
    def fitted_ms(self) -> np.ndarray:
        """(n_max+1,) the fitted level's time in the float32 the search uses (as float64); +inf where nothing
        fits and at n = 0. Computed once per context, shared by every layout using it."""
        return fitted_columns([self])[0][0]

    @cached_property
    def fitted_envelope(self) -> np.ndarray:
        """The suffix minimum of fitted_ms over n (memx.planner.bounds.suffix_min), non-decreasing from n = 1:
        the largest n ≥ 1 with fitted_ms[n] ≤ x is the number of n ≥ 1 whose envelope is ≤ x (NaN-free rows)."""
        return fitted_columns([self])[1][0]

    @cached_property
    def fitted_summary(self) -> tuple[float | None, bool]:
        """(the largest finite fitted_ms, or None; whether fitted_ms holds a NaN): per context, for every layout."""
        _, _, most, nan = fitted_columns([self])
        return (None if most[0] == -np.inf else float(most[0])), bool(nan[0])


def fitted_columns(tables: Sequence[StageTable], stacked: tuple[np.ndarray, np.ndarray] | None = None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """StageTable.fitted_ms, fitted_envelope, the largest finite fitted time (−inf: none) and whether a NaN is
    there, of many tables of the same shape at once (rows: the tables). `stacked`: their time_ms and fit already
    stacked (row i: table i's own), so not copied again."""
    time_ms, fit = stacked if stacked is not None else (np.stack([t.time_ms for t in tables]),
                                                        np.stack([t.fit for t in tables]))
    n = np.arange(fit.shape[1])[None, :]
    ok = (fit >= 0) & (n > 0)
    level = np.take_along_axis(time_ms, np.maximum(fit, 0)[..., None], axis=2)[..., 0]
    fitted = np.where(ok, level.astype(np.float32).astype(np.float64), np.inf)  # float32 values, float64 array
    envelope = np.minimum.accumulate(fitted[:, ::-1], axis=1)[:, ::-1]
    most = np.where(np.isfinite(fitted), fitted, -np.inf).max(axis=1)
    return fitted, envelope, most, np.isnan(fitted).any(axis=1)


def set_fitted(tables: Sequence[StageTable], stacked: tuple[np.ndarray, np.ndarray] | None = None) -> None:
    """Fill the tables' fitted_ms, fitted_envelope and fitted_summary in one pass (`fitted_columns`, `stacked` as
    there): the values each would compute on first use (functools.cached_property keeps them in the instance dict)."""
    if not tables:
        return
    fitted, envelope, most, nan = fitted_columns(tables, stacked)
    for i, t in enumerate(tables):
        vars(t).update(fitted_ms=fitted[i], fitted_envelope=envelope[i],
                       fitted_summary=(None if most[i] == -np.inf else float(most[i]), bool(nan[i])))


def ladders(times: np.ndarray, mems: np.ndarray, codes: np.ndarray,
            limit_mib: np.ndarray | float) -> tuple[np.ndarray, ...]:
    """The ladders of many (context, n) rows at once. times, mems (..., K): each row's options, +inf
    time and memory where a row has fewer; codes: their option codes, (..., K) or any shape that broadcasts to
    it (one (n, K) table for every context). Returns (time, peak, code) of the Pareto-sorted options — by
    time ascending (then memory, then option order: a stable sort), keeping each option whose memory is
    strictly below every earlier one's — padded with the top level (moving "up" into padding saves
    nothing, so it is never chosen), the ladder length (0: nothing predicted, never feasible; time and
    peak +inf, code NONE) and the first level whose peak ≤ limit_mib (broadcast over the rows; −1: none)."""
    order = np.lexsort((mems, times), axis=-1)
    t, m, c = (_along(x, order) for x in (times, mems, codes))
    before = np.concatenate([np.full(m.shape[:-1] + (1,), np.inf), np.minimum.accumulate(m, axis=-1)[..., :-1]],
                            axis=-1)
    keep = m < before
    length = keep.sum(axis=-1)
    kept = np.argsort(~keep, axis=-1, kind="stable")  # the kept options first, in ladder order
    top = np.maximum(length - 1, 0)[..., None]
    pad = np.arange(m.shape[-1]) >= length[..., None]
    kept = np.where(pad, _along(kept, top), kept)
    t, m, c = (_along(x, kept) for x in (t, m, c))
    if (length == 0).any():
        empty = (length == 0)[..., None]
        t, m, c = np.where(empty, np.inf, t), np.where(empty, np.inf, m), np.where(empty, NONE, c)
    fits = (m <= np.asarray(limit_mib)[..., None]) & ~pad
    fit = np.where(fits.any(axis=-1), fits.argmax(axis=-1), -1)
    return t, m, c.astype(np.int64, copy=False), length.astype(np.int64), fit.astype(np.int64)


def _along(x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """np.take_along_axis(np.broadcast_to(x, idx.shape[:-1] + x.shape[-1:]), idx, axis=-1), the same values, by
    one flat take (no index arrays per axis, no copy of a broadcast x)."""
    x = np.ascontiguousarray(x)
    lead = idx.shape[:-1]
    xb = np.broadcast_to(x, lead + x.shape[-1:])
    off = np.zeros(lead + (1,), dtype=np.intp)
    for d, (size, stride) in enumerate(zip(lead, xb.strides[:-1])):
        if stride:
            shape = [1] * (len(lead) + 1)
            shape[d] = size
            off = off + (np.arange(size, dtype=np.intp) * (stride // x.itemsize)).reshape(shape)
    return x.reshape(-1).take(off + idx)


def stage_table(n_max: int, k_max: int, options_per_n: dict[int, list[int]], pred: dict[int, tuple],
                limit_mib: float, static_per_n: np.ndarray, params_per_n: np.ndarray) -> StageTable:
    """pred[n] = (times, mems) aligned with options_per_n[n]."""
    times, mems = np.full((n_max + 1, k_max), np.inf), np.full((n_max + 1, k_max), np.inf)
    codes = np.full((n_max + 1, k_max), NONE, dtype=np.int64)
    for n in range(1, n_max + 1):
        k = len(pred[n][0])
        times[n, :k], mems[n, :k], codes[n, :k] = pred[n][0], pred[n][1], options_per_n[n][:k]
    t, m, code, length, fit = ladders(times, mems, codes, limit_mib)
    return StageTable(time_ms=t, peak_mib=m, code=code, length=length, fit=fit, static_mib=static_per_n,
                      params_per_rank=params_per_n)


@dataclass(frozen=True, kw_only=True)
class LayoutTables:
    """The stage tables of one layout stacked into flat arrays for single-gather lookups."""

    pp: int
    rows: int  # n_max + 1
    k: int
    time_ms: np.ndarray  # (pp·rows·K,)
    peak_mib: np.ndarray
    code: np.ndarray
    length: np.ndarray  # (pp·rows,)
    fit: np.ndarray
    fit_time_ms: np.ndarray  # (pp·rows,) the fitted level's time; +inf when nothing fits
    fit_peak_mib: np.ndarray
    tail_ms: np.ndarray  # DP gradient all-reduce + optimizer step per (stage, n)
    pipeline: Pipeline
    high_mib: np.ndarray | None = None  # (pp·rows·K,) StageTable.high_mib stacked; None without intervals

    @property
    def capacity_mib(self) -> np.ndarray:  # (pp,)
        return self.pipeline.capacity_mib

    @cached_property
    def top_level(self) -> np.ndarray:  # (pp·rows,) int32: the last ladder index (length − 1), as refine moves up
        return (self.length - 1).astype(np.int32)

    @property
    def gpu_weight(self) -> np.ndarray:  # (pp,) GPUs per stage (tp)
        return self.pipeline.gpu_weight

    @property
    def micro_batches(self) -> int:
        return self.pipeline.micro_batches

    @property
    def fixed_ms(self) -> float:  # the per-plan constant of T: c·Σ 2·p2p + o (Pipeline.fixed_ms)
        return self.pipeline.fixed_ms

    @classmethod
    def stack(cls, tables: list[StageTable], pipe: Pipeline) -> LayoutTables:
        rows, k = tables[0].time_ms.shape
        fit_t, fit_m = [], []
        for t in tables:
            ok = t.fit >= 0
            lvl = np.where(ok, t.fit, 0)
            fit_t.append(np.where(ok, t.time_ms[np.arange(rows), lvl], np.inf))
            fit_m.append(np.where(ok, t.peak_mib[np.arange(rows), lvl], np.inf))
        tail = pipe.tail_ms(np.stack([t.static_mib for t in tables]), np.stack([t.params_per_rank for t in tables]))
        f32 = np.float32  # plan metrics in float32: half the memory traffic, ~7 significant digits
        return cls(
            pp=len(tables), rows=rows, k=k,
            time_ms=np.concatenate([t.time_ms.ravel() for t in tables]).astype(f32),
            peak_mib=np.concatenate([t.peak_mib.ravel() for t in tables]).astype(f32),
            code=np.concatenate([t.code.ravel() for t in tables]),
            length=np.concatenate([t.length for t in tables]),
            fit=np.concatenate([t.fit for t in tables]).astype(np.int32),
            tail_ms=tail.ravel().astype(f32),
            fit_time_ms=np.concatenate(fit_t).astype(f32), fit_peak_mib=np.concatenate(fit_m).astype(f32),
            pipeline=pipe, high_mib=_stacked_high(tables),
        )

    def base(self, splits: np.ndarray) -> np.ndarray:
        """(pp, N) index of each stage's (stage, n) entry in the per-n arrays; splits is (N, pp)."""
        offs = np.arange(self.pp, dtype=np.intp)[:, None] * self.rows
        return offs + splits.T  # intp: take() converts any other index dtype first (~40 % of a gather)

    def gather(self, base: np.ndarray, level: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        idx = base * np.int32(self.k) + level
        return self.time_ms.take(idx), self.peak_mib.take(idx)  # take(): ~3× faster than fancy indexing

    def high_margin(self, base: np.ndarray, level: np.ndarray) -> np.ndarray | None:
        """(N,) smallest margin at the upper memory bound of the plans at `level` (issue #22), computed as
        memx.planner.schedule.memory_stats computes the point margin; None without intervals."""
        if self.high_mib is None:
            return None
        high = self.high_mib.take(base * np.int32(self.k) + level)
        inv_cap = (1.0 / np.asarray(self.capacity_mib)).astype(high.dtype)
        return 1.0 - (high * inv_cap[:, None]).max(axis=0)

    def totals(self, base: np.ndarray, stage_ms: np.ndarray, stage_mib: np.ndarray) -> tuple[np.ndarray, MemoryStats]:
        return self.pipeline.assemble(stage_ms, stage_mib, self.tail_ms.take(base))

    def capacity_for(self, base: np.ndarray) -> np.ndarray:
        """Capacity (MiB) of each stage of the plans of `base`, broadcastable to its shape."""
        return self.capacity_mib[:, None]


@dataclass(frozen=True, kw_only=True)
class StackedTables:
    """The stage tables of many layouts at once, for scoring splits of different layouts in one batch (the
    branch-and-bound's leaves, the medians' sample) with LayoutTables' interface (memx.planner.recompute).
    Every layout is padded to `pp` stages with empty ones (n = 0: time, peak and tail 0, GPU weight 0), and
    a plan's index rows are (layout·pp + stage)·rows + n, so the layout of a column is base[0] // (pp·rows).
    Ladders are stored once per stage context (`ctx`: (layouts, pp) context of each stage, the last
    context the empty one) and scored in the same float32 arithmetic as LayoutTables (the same values)."""

    pp: int
    rows: int
    k: int
    stages: np.ndarray  # (layouts,) each layout's own pp
    ctx: np.ndarray  # (layouts, pp)
    ctx_time_ms: np.ndarray  # (contexts, rows, K) float32
    ctx_peak_mib: np.ndarray
    ctx_fit: np.ndarray  # (contexts, rows)
    ctx_length: np.ndarray
    row_ctx: np.ndarray  # (layouts·pp·rows,) → context row (context·rows + n)
    fit: np.ndarray  # (layouts·pp·rows,) as LayoutTables'
    length: np.ndarray
    fit_time_ms: np.ndarray
    fit_peak_mib: np.ndarray
    tail_ms: np.ndarray
    capacity: np.ndarray  # (layouts, pp) MiB (1 for an empty stage)
    gpu_weight: np.ndarray  # (layouts, pp) GPUs per stage / all (0 for an empty stage)
    weight32: np.ndarray  # the same in float32, as memory_stats uses it
    inv_capacity: np.ndarray  # (layouts, pp) float32
    micro_batches: np.ndarray  # (layouts,) float32
    virtual_stages: np.ndarray
    fixed_ms: np.ndarray
    ctx_high_mib: np.ndarray | None = None  # (contexts, rows, K) float32 StageTable.high_mib; None without intervals
    # (pp − 1, layouts) float32 Pipeline.loop_ms of each layout (0 past its own stages and where it has none); None:
    # every layout assembles as the paper (memx.planner.schedule.steady_period_ms)
    loop_ms: np.ndarray | None = None
    drain: np.ndarray | None = None  # (layouts,) bool: assembled with cycle-mean-drain (memx.planner.drain); None: none

    @classmethod
    def of(cls, layouts: Sequence[tuple[Sequence[StageTable], Pipeline]]) -> StackedTables:
        pp = max(len(st) for st, _ in layouts)
        index: dict[int, int] = {}
        tabs: list[StageTable] = []
        ctx = np.zeros((len(layouts), pp), dtype=np.int64)
        for li, (stages, _) in enumerate(layouts):
            for s, t in enumerate(stages):
                ctx[li, s] = index.setdefault(id(t), len(tabs))
                if ctx[li, s] == len(tabs):
                    tabs.append(t)
        real = np.arange(pp)[None, :] < np.array([len(st) for st, _ in layouts])[:, None]
        ctx[~real] = len(tabs)  # the empty context
        rows, k = tabs[0].time_ms.shape
        f32 = np.float32
        time_ms = np.zeros((len(tabs) + 1, rows, k), dtype=f32)
        peak = np.zeros((len(tabs) + 1, rows, k), dtype=f32)
        time_ms[:-1], peak[:-1] = np.stack([t.time_ms for t in tabs]), np.stack([t.peak_mib for t in tabs])
        fit = np.zeros((len(tabs) + 1, rows), dtype=np.int64)
        length = np.ones((len(tabs) + 1, rows), dtype=np.int64)
        fit[:-1], length[:-1] = np.stack([t.fit for t in tabs]), np.stack([t.length for t in tabs])
        lvl = np.maximum(fit, 0)[..., None]
        fit_t = np.where(fit >= 0, np.take_along_axis(time_ms, lvl, 2)[..., 0], f32(np.inf))
        fit_m = np.where(fit >= 0, np.take_along_axis(peak, lvl, 2)[..., 0], f32(np.inf))
        row_ctx = (ctx[:, :, None] * rows + np.arange(rows)).reshape(-1)
        tail = np.zeros((len(layouts), pp, rows), dtype=f32)
        static, params = np.stack([t.static_mib for t in tabs]), np.stack([t.params_per_rank for t in tabs])
        cap, weight = np.ones((len(layouts), pp)), np.zeros((len(layouts), pp))
        groups: dict = {}
        for li, (_, pipe) in enumerate(layouts):
            groups.setdefault(pipe.tail_key(), []).append(li)
        for key, members in groups.items():  # Pipeline.tail_ms of every layout of one key in one call
            where = real[members]
            c = ctx[members][where]
            mbw = np.concatenate([layouts[li][1].memory_bandwidth_gbps for li in members])
            dbw = np.concatenate([layouts[li][1].dp_gbps for li in members])
            coll = np.concatenate([layouts[li][1].stage_collectives_ms for li in members])
            sub = tail[members]
            sub[where] = stage_tail_ms(static[c], params[c], mbw, dbw, collectives_ms=coll, **key._asdict())
            tail[members] = sub
        for li, (stages, pipe) in enumerate(layouts):
            n = len(stages)
            cap[li, :n] = pipe.capacity_mib
            weight[li, :n] = pipe.gpu_weight / pipe.gpu_weight.sum()  # as memory_stats
        pipes = [pipe for _, pipe in layouts]
        high = None
        if all(t.high_mib is not None for t in tabs):  # issue #22: the upper-bound peaks (0 on the empty context)
            high = np.zeros((len(tabs) + 1, rows, k), dtype=f32)
            high[:-1] = np.stack([t.high_mib for t in tabs])
        return cls(pp=pp, rows=rows, k=k, ctx_high_mib=high, stages=real.sum(axis=1), ctx=ctx, ctx_time_ms=time_ms, ctx_peak_mib=peak,
                   ctx_fit=fit, ctx_length=length, row_ctx=row_ctx.astype(np.intp),
                   fit=fit.reshape(-1)[row_ctx].astype(np.int32), length=length.reshape(-1)[row_ctx],
                   fit_time_ms=fit_t.reshape(-1)[row_ctx], fit_peak_mib=fit_m.reshape(-1)[row_ctx],
                   tail_ms=tail.reshape(-1), capacity=cap, gpu_weight=weight, weight32=weight.astype(f32),
                   inv_capacity=(1.0 / cap).astype(f32),
                   micro_batches=np.array([p.micro_batches for p in pipes], dtype=f32),
                   virtual_stages=np.array([p.virtual_stages for p in pipes], dtype=f32),
                   fixed_ms=np.array([p.fixed_ms for p in pipes], dtype=f32), loop_ms=_stacked_loops(pipes, pp),
                   drain=_stacked_drain(pipes))

    def base(self, splits: np.ndarray, layout: np.ndarray) -> np.ndarray:
        """(pp, N) index rows of splits (N, pp, padded with 0) of the given layouts (N,)."""
        offs = (np.asarray(layout, dtype=np.intp)[None, :] * self.pp + np.arange(self.pp, dtype=np.intp)[:, None]) * self.rows
        return offs + splits.T  # intp, as LayoutTables.base

    def gather(self, base: np.ndarray, level: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        idx = self.row_ctx.take(base) * np.int32(self.k) + level
        return self.ctx_time_ms.reshape(-1).take(idx), self.ctx_peak_mib.reshape(-1).take(idx)

    def capacity_for(self, base: np.ndarray) -> np.ndarray:
        return self.row_capacity.take(base)

    @cached_property
    def row_capacity(self) -> np.ndarray:  # (layouts·pp·rows,) the capacity of each index row's stage (float64)
        return np.repeat(self.capacity.reshape(-1), self.rows)

    @cached_property
    def top_level(self) -> np.ndarray:  # (layouts·pp·rows,) int32: the last ladder index (length − 1)
        return (self.length - 1).astype(np.int32)

    @cached_property
    def _by_stage(self) -> tuple[np.ndarray, np.ndarray]:  # weight32 and inv_capacity as (pp, layouts), contiguous
        return np.ascontiguousarray(self.weight32.T), np.ascontiguousarray(self.inv_capacity.T)

    def high_margin(self, base: np.ndarray, level: np.ndarray) -> np.ndarray | None:
        """LayoutTables.high_margin for plans of many layouts (the same float32 values; an empty stage's 0)."""
        if self.ctx_high_mib is None:
            return None
        high = self.ctx_high_mib.reshape(-1).take(self.row_ctx.take(base) * np.int32(self.k) + level)
        inv_cap = self.inv_capacity.reshape(-1).take(base // np.int32(self.rows))
        return 1.0 - (high * inv_cap).max(axis=0)

    def totals(self, base: np.ndarray, stage_ms: np.ndarray, stage_mib: np.ndarray) -> tuple[np.ndarray, MemoryStats]:
        li = base[0] // np.int32(self.pp * self.rows)
        w, inv_cap = self._by_stage
        return assemble_columns(stage_ms, stage_mib, self.tail_ms.take(base), micro_batches=self.micro_batches[li],
                                virtual_stages=self.virtual_stages[li], fixed_ms=self.fixed_ms[li],
                                w=w.take(li, axis=1), inv_cap=inv_cap.take(li, axis=1),
                                loop_ms=None if self.loop_ms is None else self.loop_ms.take(li, axis=1),
                                drain=None if self.drain is None else self.drain[li])


def _stacked_drain(pipes: list[Pipeline]) -> np.ndarray | None:
    """StackedTables.drain: which layouts start each stage's tail at its own last backward; None when none does."""
    out = np.array([p.virtual_stages == 1 and drains(p.assembly) for p in pipes], dtype=bool)
    return out if out.any() else None


def _stacked_loops(pipes: list[Pipeline], pp: int) -> np.ndarray | None:
    """StackedTables.loop_ms: each layout's Pipeline.loop_ms in float32, the values LayoutTables' assembly uses
    (so a plan scores the same in either); None when no layout assembles with the cycle mean."""
    loops = [p.loop_ms(np.float32) for p in pipes]
    if all(x is None for x in loops):
        return None
    out = np.zeros((max(pp - 1, 0), len(pipes)), dtype=np.float32)
    for li, x in enumerate(loops):
        if x is not None:
            out[:len(x), li] = x[:, 0]
    return out

def _stacked_high(tables: list[StageTable]) -> np.ndarray | None:
    """The stages' upper-bound peaks as one float32 array (LayoutTables.high_mib); None without intervals."""
    if any(t.high_mib is None for t in tables):
        return None
    return np.concatenate([t.high_mib.ravel() for t in tables]).astype(np.float32)
