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

import numpy as np

from memx.domain.precision import DEFAULT_PRECISION
from memx.domain.plan import SEARCH_BLOCK, Plan, Recompute, Stage
from memx.planner.interleave import inflight_chunks
from memx.planner.schedule import MemoryStats, Pipeline, inflight_micro_batches

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


def stage_contexts(stage_gpus: Sequence[str], stage_tp: Sequence[int], *, micro_batch: int,
                   micro_batches: int, distributed_optimizer: bool = False, dp: int = 1,
                   sequence_parallel: bool = False, virtual_stages: int = 1,
                   precision: str = DEFAULT_PRECISION) -> tuple[StageContext, ...]:
    """The context of every stage of a pipeline (a search layout or a given plan)."""
    pp, v = len(stage_gpus), virtual_stages
    chunks = [inflight_chunks(pp, s, micro_batches, v) if v > 1 else 0 for s in range(pp)]
    return tuple(StageContext(gpu=g, tp=t, micro_batch=micro_batch, first=s == 0, last=s == pp - 1,
                              inflight=chunks[s] // v if v > 1 else inflight_micro_batches(pp, s, micro_batches),
                              distributed_optimizer=distributed_optimizer, dp=dp if distributed_optimizer else 1,
                              sequence_parallel=sequence_parallel and t > 1, virtual_stages=v,
                              inflight_chunks=chunks[s], precision=precision)
                 for s, (g, t) in enumerate(zip(stage_gpus, stage_tp, strict=True)))


def plan_contexts(plan: Plan) -> tuple[StageContext, ...]:
    return stage_contexts([st.gpu for st in plan.stages], [st.tp for st in plan.stages],
                          micro_batch=plan.micro_batch, micro_batches=plan.micro_batches,
                          distributed_optimizer=plan.distributed_optimizer, dp=plan.dp,
                          sequence_parallel=plan.sequence_parallel, virtual_stages=plan.virtual_stages,
                          precision=plan.precision)


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


def ladders(times: np.ndarray, mems: np.ndarray, codes: np.ndarray,
            limit_mib: np.ndarray | float) -> tuple[np.ndarray, ...]:
    """The ladders of many (context, n) rows at once. times, mems, codes (..., K): each row's options, +inf
    time and memory where a row has fewer. Returns (time, peak, code) of the Pareto-sorted options — by
    time ascending (then memory, then option order: a stable sort), keeping each option whose memory is
    strictly below every earlier one's — padded with the top level (moving "up" into padding saves
    nothing, so it is never chosen), the ladder length (0: nothing predicted, never feasible; time and
    peak +inf, code NONE) and the first level whose peak ≤ limit_mib (broadcast over the rows; −1: none)."""
    order = np.lexsort((mems, times), axis=-1)
    t, m, c = (np.take_along_axis(x, order, axis=-1) for x in (times, mems, codes))
    before = np.concatenate([np.full(m.shape[:-1] + (1,), np.inf), np.minimum.accumulate(m, axis=-1)[..., :-1]],
                            axis=-1)
    keep = m < before
    length = keep.sum(axis=-1)
    kept = np.argsort(~keep, axis=-1, kind="stable")  # the kept options first, in ladder order
    top = np.maximum(length - 1, 0)[..., None]
    pad = np.arange(m.shape[-1]) >= length[..., None]
    kept = np.where(pad, np.take_along_axis(kept, top, axis=-1), kept)
    t, m, c = (np.take_along_axis(x, kept, axis=-1) for x in (t, m, c))
    empty = (length == 0)[..., None]
    t, m, c = np.where(empty, np.inf, t), np.where(empty, np.inf, m), np.where(empty, NONE, c).astype(np.int64)
    fits = (m <= np.asarray(limit_mib)[..., None]) & ~pad
    fit = np.where(fits.any(axis=-1), fits.argmax(axis=-1), -1)
    return t, m, c, length.astype(np.int64), fit.astype(np.int64)


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
        offs = np.arange(self.pp, dtype=np.int32)[:, None] * np.int32(self.rows)
        return offs + splits.T.astype(np.int32)

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


def _stacked_high(tables: list[StageTable]) -> np.ndarray | None:
    """The stages' upper-bound peaks as one float32 array (LayoutTables.high_mib); None without intervals."""
    if any(t.high_mib is None for t in tables):
        return None
    return np.concatenate([t.high_mib.ravel() for t in tables]).astype(np.float32)
