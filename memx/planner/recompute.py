"""Per-stage recomputation assignment (paper §3.1.1; docs/architecture.md §Recompute), vectorised over plans.

Step 1 (fit): a stage that does not fit even at the top of its ladder prunes the plan; otherwise
it takes the cheapest (fastest) level that fits — `none` whenever `none` fits.
Step 2 (refine): while a plan's smallest memory margin is below the target, compute each tight stage's
(margin below target) exchange rate r = Δtime_ms / Δmem_MiB (Eq. 1) for moving one level up its ladder, move the stage
with the lowest r, and keep the move only if it lowers Φ; stop at the first move that does not.
This is O(pp · ladder) candidates per split instead of (levels)^pp combinations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from memx.domain.specs import Weights
from memx.planner.objective import log_score
from memx.planner.schedule import MemoryStats
from memx.planner.tables import LayoutTables


@dataclass(kw_only=True)
class Assignment:
    """Recompute levels and the resulting plan metrics for N plans (rows)."""

    level: np.ndarray  # (pp, N) ladder index (stage-major, see memx.planner.schedule)
    stage_ms: np.ndarray
    stage_mib: np.ndarray
    time_ms: np.ndarray  # (N,)
    stats: MemoryStats

    def take(self, rows: np.ndarray) -> Assignment:
        return Assignment(level=self.level[:, rows], stage_ms=self.stage_ms[:, rows], stage_mib=self.stage_mib[:, rows],
                          time_ms=self.time_ms[rows], stats=self.stats.take(rows))


def fit(tables: LayoutTables, base: np.ndarray) -> tuple[np.ndarray, np.ndarray, Assignment]:
    """Step 1. Returns the feasible-plan mask, the feasible plans' base and their assignment.

    The fitted level depends only on (stage, layers), so its time and memory are looked up
    directly; a stage where nothing fits has time +inf, which makes the plan's T infinite.
    """
    stage_ms = tables.fit_time_ms.take(base)
    stage_mib = tables.fit_peak_mib.take(base)
    with np.errstate(invalid="ignore"):  # inf − inf in V for plans that are dropped below
        T, stats = tables.totals(base, stage_ms, stage_mib)
    ok = np.isfinite(T)
    if not ok.all():
        rows = np.flatnonzero(ok)  # take(): faster than a boolean mask along axis 1
        base, stage_ms, stage_mib = (x.take(rows, axis=1) for x in (base, stage_ms, stage_mib))
        T, stats = T.take(rows), stats.take(rows)
    level = tables.fit.take(base)
    return ok, base, Assignment(level=level, stage_ms=stage_ms, stage_mib=stage_mib, time_ms=T, stats=stats)


def refine(tables: LayoutTables, base: np.ndarray, a: Assignment, weights: Weights, *, epsilon_mib2: float,
           target_margin: float, max_moves: int = 64) -> Assignment:
    """Step 2, in place on `a` (rows aligned with `base`). Returns `a`."""
    active = np.nonzero(a.stats.min_margin < target_margin)[0]
    score = log_score(a.time_ms, a.stats.max_mib, a.stats.variance_mib2, weights, epsilon_mib2)
    for _ in range(max_moves):
        if active.size == 0:
            break
        b, lv = base.take(active, axis=1), a.level.take(active, axis=1)
        up = np.minimum(lv + 1, tables.top_level.take(b))
        t_up, m_up = tables.gather(b, up)
        cur_ms, cur_mib = a.stage_ms.take(active, axis=1), a.stage_mib.take(active, axis=1)
        d_mem = cur_mib - m_up
        # Only stages below the target margin are candidates: raising recompute elsewhere cannot
        # raise the smallest margin (small-memory GPUs recompute more, large ones stay at none).
        cap = tables.capacity_for(b)
        tight = (cap - cur_mib) / cap < target_margin
        d_mem = np.where(tight, d_mem, 0.0)
        rate = np.where(d_mem > 0, (t_up - cur_ms) / np.where(d_mem > 0, d_mem, 1.0), np.inf)
        s_star = rate.argmin(axis=0)
        cols = np.arange(active.size)
        movable = np.isfinite(rate[s_star, cols])
        if not movable.all():
            keep = np.flatnonzero(movable)  # take(): faster than a boolean mask along axis 1
            active, s_star = active.take(keep), s_star.take(keep)
            b, lv, up, t_up, m_up, cur_ms, cur_mib = (x.take(keep, axis=1) for x in (b, lv, up, t_up, m_up, cur_ms, cur_mib))
            cols = np.arange(active.size)
        # Only stage s* changes: patch its time and memory instead of gathering all stages again (lv, cur_ms,
        # cur_mib are this round's own copies: patched in place).
        new_level, new_ms, new_mib = lv, cur_ms, cur_mib
        new_level[s_star, cols] = up[s_star, cols]
        new_ms[s_star, cols] = t_up[s_star, cols]
        new_mib[s_star, cols] = m_up[s_star, cols]
        T, stats = tables.totals(b, new_ms, new_mib)
        new_score = log_score(T, stats.max_mib, stats.variance_mib2, weights, epsilon_mib2)
        accept = new_score < score[active]
        idx = active[accept]
        a.level[:, idx], a.stage_ms[:, idx], a.stage_mib[:, idx] = (
            new_level[:, accept], new_ms[:, accept], new_mib[:, accept])
        a.time_ms[idx] = T[accept]
        a.stats.max_mib[idx] = stats.max_mib[accept]
        a.stats.variance_mib2[idx] = stats.variance_mib2[accept]
        a.stats.min_margin[idx] = stats.min_margin[accept]
        score[idx] = new_score[accept]
        active = idx[stats.min_margin[accept] < target_margin]
    return a
