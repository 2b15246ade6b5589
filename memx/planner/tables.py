"""Per-stage lookup tables built from one batch of stage predictions, and their per-layout stacks.

A *stage context* is everything about a stage but its layer count and recompute choice: GPU, tp,
micro batch, first/last, inflight. For each context and layer count n the recompute options form a
*ladder*: the Pareto-sorted options (time ascending, memory strictly descending), so "one level
up" always buys memory with time. Option codes: NONE = -2, SELECTIVE = -1, k ≥ 1 = full
recomputation of the first k layers (k = n is plain `full`; k < n is Megatron's block method).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from memx.planner.schedule import MemoryStats, dp_allreduce_ms, iteration_time_ms, memory_stats, optimizer_ms

NONE, SELECTIVE = -2, -1


@dataclass(frozen=True, kw_only=True)
class StageContext:
    gpu: str
    tp: int
    micro_batch: int
    first: bool
    last: bool
    inflight: int


def stage_options(n: int, levels: tuple[str, ...]) -> list[int]:
    """Recompute option codes searched for a stage of n layers."""
    opts: list[int] = []
    if "none" in levels:
        opts.append(NONE)
    if "selective" in levels:
        opts.append(SELECTIVE)
    if "block" in levels:
        opts.extend(range(1, n))
    if "full" in levels or "block" in levels:
        opts.append(n)
    return opts


def decode_option(code: int, n: int) -> tuple[str, int | None]:
    """Option code → (recompute, recompute_layers) as in plan JSON."""
    if code == NONE:
        return ("none", None)
    if code == SELECTIVE:
        return ("selective", None)
    return ("full", None if code >= n else int(code))


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


def build_ladder(times: np.ndarray, mems: np.ndarray) -> np.ndarray:
    """Indices of the Pareto-sorted options: by time ascending, keeping strictly decreasing memory."""
    order = np.lexsort((mems, times))
    keep, best = [], np.inf
    for i in order:
        if mems[i] < best:
            keep.append(i)
            best = mems[i]
    return np.array(keep, dtype=np.int64)


def stage_table(n_max: int, k_max: int, options_per_n: dict[int, list[int]], pred: dict[int, tuple],
                limit_mib: float, static_per_n: np.ndarray, params_per_n: np.ndarray) -> StageTable:
    """pred[n] = (times, mems) aligned with options_per_n[n]."""
    t = np.full((n_max + 1, k_max), np.inf)
    m = np.full((n_max + 1, k_max), np.inf)
    code = np.full((n_max + 1, k_max), NONE, dtype=np.int64)
    length = np.zeros(n_max + 1, dtype=np.int64)
    fit = np.full(n_max + 1, -1, dtype=np.int64)
    for n in range(1, n_max + 1):
        times, mems = pred[n]
        idx = build_ladder(times, mems)
        k = len(idx)
        length[n] = k
        if k == 0:  # nothing predicted for n layers (beyond the static bound): never feasible
            continue
        t[n, :k], m[n, :k] = times[idx], mems[idx]
        code[n, :k] = np.asarray(options_per_n[n])[idx]
        # Pad with the top level: moving "up" into padding saves nothing, so it is never chosen.
        t[n, k:], m[n, k:], code[n, k:] = t[n, k - 1], m[n, k - 1], code[n, k - 1]
        fits = np.nonzero(m[n, :k] <= limit_mib)[0]
        fit[n] = fits[0] if len(fits) else -1
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
    capacity_mib: np.ndarray  # (pp,)
    gpu_weight: np.ndarray  # (pp,) GPUs per stage (tp)
    micro_batches: int
    p2p_total_ms: float

    @classmethod
    def stack(cls, tables: list[StageTable], *, capacity_mib, membw_gbps, tp, dp, dp_gbps, micro_batches,
              p2p_total_ms) -> LayoutTables:
        rows, k = tables[0].time_ms.shape
        fit_t, fit_m = [], []
        for t in tables:
            ok = t.fit >= 0
            lvl = np.where(ok, t.fit, 0)
            fit_t.append(np.where(ok, t.time_ms[np.arange(rows), lvl], np.inf))
            fit_m.append(np.where(ok, t.peak_mib[np.arange(rows), lvl], np.inf))
        tail = [optimizer_ms(t.static_mib, mbw) + dp_allreduce_ms(t.params_per_rank, dp, dbw)
                for t, mbw, dbw in zip(tables, membw_gbps, dp_gbps)]
        f32 = np.float32  # plan metrics in float32: half the memory traffic, ~7 significant digits
        return cls(
            pp=len(tables), rows=rows, k=k,
            time_ms=np.concatenate([t.time_ms.ravel() for t in tables]).astype(f32),
            peak_mib=np.concatenate([t.peak_mib.ravel() for t in tables]).astype(f32),
            code=np.concatenate([t.code.ravel() for t in tables]),
            length=np.concatenate([t.length for t in tables]),
            fit=np.concatenate([t.fit for t in tables]).astype(np.int32),
            tail_ms=np.concatenate(tail).astype(f32),
            fit_time_ms=np.concatenate(fit_t).astype(f32), fit_peak_mib=np.concatenate(fit_m).astype(f32),
            capacity_mib=np.asarray(capacity_mib, dtype=np.float64),
            gpu_weight=np.asarray(tp, dtype=np.float64),
            micro_batches=micro_batches, p2p_total_ms=p2p_total_ms,
        )

    def base(self, splits: np.ndarray) -> np.ndarray:
        """(pp, N) index of each stage's (stage, n) entry in the per-n arrays; splits is (N, pp)."""
        offs = np.arange(self.pp, dtype=np.int32)[:, None] * np.int32(self.rows)
        return offs + splits.T.astype(np.int32)

    def gather(self, base: np.ndarray, level: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        idx = base * np.int32(self.k) + level
        return self.time_ms.take(idx), self.peak_mib.take(idx)  # take(): ~3× faster than fancy indexing

    def totals(self, base: np.ndarray, stage_ms: np.ndarray, stage_mib: np.ndarray) -> tuple[np.ndarray, MemoryStats]:
        T = iteration_time_ms(stage_ms, self.micro_batches, self.p2p_total_ms, self.tail_ms.take(base))
        return T, memory_stats(stage_mib, self.gpu_weight, self.capacity_mib)
