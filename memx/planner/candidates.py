"""Candidates kept while searching: medians for Φ's references, top-k by Φ and by time, and a pool
for the (T, M, V) Pareto front (docs/architecture.md §Search)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from memx.planner.metrics import PlanMetrics
from memx.planner.recompute import Assignment
from memx.planner.schedule import MemoryStats


@dataclass(frozen=True, kw_only=True)
class ChunkKeep:
    """What one evaluated chunk contributes: T, M, V of all its feasible plans (for the medians)
    and the few rows that can reach a top-k list or the Pareto pool."""

    time_ms: np.ndarray
    max_mib: np.ndarray
    variance_mib2: np.ndarray
    splits: np.ndarray  # (n_kept, pp)
    assignment: Assignment
    score: np.ndarray


def keep_chunk(S: np.ndarray, a: Assignment, score: np.ndarray, *, per_chunk: int, max_time_ratio: float) -> ChunkKeep:
    """Runs in the worker threads. A plan slower than max_time_ratio × this chunk's fastest can
    never be within max_time_ratio of the overall fastest, so it is dropped from Φ's candidates here."""
    st = a.stats
    eligible = score if max_time_ratio <= 0 else np.where(a.time_ms <= max_time_ratio * a.time_ms.min(), score, np.inf)
    keys = (eligible, a.time_ms, st.max_mib, st.variance_mib2)
    idx = np.unique(np.concatenate([_smallest(k, per_chunk) for k in keys]))
    return ChunkKeep(time_ms=a.time_ms, max_mib=st.max_mib, variance_mib2=st.variance_mib2, splits=S[idx],
                     assignment=a.take(idx), score=score[idx])


class CandidatePool:
    """Collects chunk contributions; answers top-k by Φ (optionally within max_time_ratio of the
    fastest), top-k by time, the Pareto pool and the medians."""

    def __init__(self, *, top_k: int, max_time_ratio: float = 0.0, pareto_per_chunk: int = 64):
        self.top_k = max(top_k, 1)
        self.per_chunk = max(pareto_per_chunk, self.top_k)
        self.max_time_ratio = max_time_ratio
        self.fastest_ms = np.inf
        self._stats: tuple[list[np.ndarray], ...] = ([], [], [])  # T, M, V of every feasible plan
        self._rows: list[tuple[int, np.ndarray, Assignment, np.ndarray]] = []

    def add(self, layout: int, kept: ChunkKeep) -> None:
        for store, values in zip(self._stats, (kept.time_ms, kept.max_mib, kept.variance_mib2)):
            store.append(values)
        self.fastest_ms = min(self.fastest_ms, float(kept.time_ms.min()))
        self._rows.append((layout, kept.splits, kept.assignment, kept.score))

    def _eligible_score(self, a: Assignment, score: np.ndarray) -> np.ndarray:
        """Φ's ranking key; +inf for plans slower than max_time_ratio × the fastest."""
        if self.max_time_ratio <= 0:
            return score
        return np.where(a.time_ms <= self.max_time_ratio * self.fastest_ms, score, np.inf)

    def medians(self) -> tuple[float, float, float]:
        """Medians of T, M and V over every feasible plan: Φ's reference values."""
        med = [float(np.median(np.concatenate(store))) for store in self._stats]
        return med[0], med[1], med[2]

    def _select(self, key_of, k: int):
        keyed = []
        for layout, S, a, score in self._rows:
            key = key_of(a, score)
            for i in _smallest(key, k):
                if not np.isfinite(key[i]):
                    continue
                keyed.append((float(key[i]), layout, S[i], a.take(np.array([i]))))
        # Ties broken by layout and split, so the answer does not depend on how layouts were sharded.
        keyed.sort(key=lambda x: (x[0], x[1], tuple(int(v) for v in x[2])))
        return [(layout, S, _squeeze(a)) for _, layout, S, a in keyed[:k]]

    def best_by_score(self):
        return self._select(self._eligible_score, self.top_k)

    def best_by_time(self):
        return self._select(lambda a, score: a.time_ms, self.top_k)

    def pareto_pool(self):
        """Rows not dominated in (T, M, V) among the kept rows."""
        rows = sorted(self._rows, key=lambda r: r[0])  # layout order, whatever the shard order
        arrs = [np.stack([a.time_ms, a.stats.max_mib, a.stats.variance_mib2], axis=1) for _, _, a, _ in rows]
        pts = np.concatenate(arrs)
        keep = _non_dominated(pts)
        out, offset = [], 0
        for layout, S, a, _ in rows:
            n = len(S)
            for i in np.nonzero(keep[offset:offset + n])[0]:
                out.append((layout, S[i], _squeeze(a.take(np.array([i])))))
            offset += n
        return out


def _smallest(key: np.ndarray, k: int) -> np.ndarray:
    if key.size <= k:
        return np.arange(key.size)
    return np.argpartition(key, k)[:k]


def _squeeze(a: Assignment) -> Assignment:
    """One-row assignment → scalars / 1-D rows."""
    return Assignment(level=a.level[:, 0], stage_ms=a.stage_ms[:, 0], stage_mib=a.stage_mib[:, 0], time_ms=a.time_ms[0],
                      stats=MemoryStats(max_mib=a.stats.max_mib[0], variance_mib2=a.stats.variance_mib2[0],
                                        min_margin=a.stats.min_margin[0]))


def _non_dominated(pts: np.ndarray) -> np.ndarray:
    """Mask of points no other point dominates in (T, M, V): sweep in order of T, keeping a
    staircase of the (M, V) front of the points seen so far (Kung et al. 1975, 3-D maxima)."""
    order = np.lexsort((pts[:, 2], pts[:, 1], pts[:, 0]))
    keep = np.zeros(len(pts), dtype=bool)
    stair_m: list[float] = []  # M ascending
    stair_v: list[float] = []  # V strictly descending
    for i in order:
        m, v = float(pts[i, 1]), float(pts[i, 2])
        j = bisect.bisect_right(stair_m, m) - 1
        if j >= 0 and stair_v[j] <= v:
            continue  # an earlier (faster or equal) point has M ≤ m and V ≤ v
        keep[i] = True
        k = bisect.bisect_left(stair_m, m)
        end = k
        while end < len(stair_m) and stair_v[end] >= v:
            end += 1
        stair_m[k:end] = [m]
        stair_v[k:end] = [v]
    return keep


def pareto_front(cands: list[PlanMetrics]) -> list[PlanMetrics]:
    """Deduplicate by plan and sort by time."""
    seen, out = set(), []
    for c in sorted(cands, key=lambda c: c.iteration_time_ms):
        key = (c.plan.stages, c.plan.dp, c.plan.micro_batch)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out
