"""Joint bounds of the keeper's box tests (issue #26; docs/planner.md §Joint bounds).

The corner test of a box (memx.planner.bounds.Corner) compares lower bounds of T, M, V, log Φ and an upper
bound of the margin that may come from different splits of the box. A joint bound asks instead which of the
box's plans could still enter a set — those faster than a kept point, or wider, or of lower log Φ — and
bounds the time of just those plans (`Corner.time_cut`: the box cut to the plans of margin ≥ μ and largest
peak ≤ M̄); when even they are too slow, no plan of the box can enter the set and the set does not need the
box. Each test returns the boxes it proves the set does not need; the keeper drops a box no set needs.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from memx.domain.specs import Weights
from memx.planner.bounds import SCORE_SLACK, SLACK, Corner

JOINT_STEPS = 32  # staircase steps the (T, margin) tests try at most (a subset of the steps stays valid)
SCORE_PASSES = 2  # rounds of the (T, M) cut of the log Φ tests (`score_covered`)
# Boxes of at most this many splits (Corner.splits_ub) skip the joint tests: scoring their few leaves costs less
# than the tests' T bounds (read by memx.planner.candidates.Keeper.needs; measured: docs/benchmarks.md §Issue #26:
# deep search (session 4)).
MIN_SPLITS = 1024


def front_covers_by_time(front: np.ndarray, window_ms: float, c: Corner, rows: np.ndarray,
                         margin_ub: np.ndarray) -> np.ndarray:
    """Boxes `rows` every plan of which a kept (T, margin) front point strictly dominates, by the joint (T, margin)
    bound (memx.planner.candidates.Keeper.needs): with the front's points (T, −margin, ·) by T,
    T_1 ≤ … ≤ T_F, and M_j the largest margin among the first j, a plan of T in (T_j, T_{j+1}] (T_{F+1}: the
    window's end, past which the front keeps nothing) is dominated (strictly faster, no wider) unless its margin
    is > M_j; so a box is covered when, for every j, its plans of margin > M_j are all slower than T_{j+1}
    (Corner.time_above: the T bound on the box cut to such margins), and none is faster than T_1. The corner
    test is the step that holds the box's T bound. `margin_ub`: the boxes' margin upper bounds (rows)."""
    f = front[np.argsort(front[:, 0], kind="stable")]
    t = c.time_ms[rows]
    if not len(f):
        return np.zeros(len(rows), dtype=bool)
    covered = t > f[0, 0]
    steps = _steps(len(f))
    ends = np.append(f[steps[1:], 0], window_ms)  # T_{j+1}: the next tested step's T, then the window's end
    best = np.maximum.accumulate(-f[:, 1])[steps]  # M_j
    for end, m in zip(ends, best):
        act = covered & (t <= end) & (margin_ub > m)
        if act.any():
            idx = np.nonzero(act)[0]
            covered[idx] = c.time_above(rows[idx], np.full(len(idx), m)) > end
    return covered


def stair_covers_by_time(stair_t: np.ndarray, stair_margin: np.ndarray, window_ms: float, floor: float, c: Corner,
                         rows: np.ndarray, time_lb: np.ndarray, margin_ub: np.ndarray) -> np.ndarray:
    """Boxes `rows` none of whose plans can enter the safe by-margin staircase (nor the safe front, whose test
    it is: memx.planner.candidates), by the joint (T, margin) bound. A safe plan p (margin ≥ floor, T ≤ the safe
    window) is beaten by a kept safe plan q no slower than it with a strictly larger margin. With the kept
    members by T, T_1 ≤ … ≤ T_F, and M_j the largest margin among the first j (`stair_margin`), a safe plan of T
    in [T_j, T_{j+1}) (T_{F+1}: just past the window's end) can enter only if its margin is ≥ max(M_j, floor),
    and one faster than T_1 only if its margin is ≥ floor; so a box is covered when its plans of margin
    ≥ max(M_j, floor) are all at least T_{j+1} (past the window for the last step), and those of margin ≥ floor
    no faster than T_1 (`time_lb`: their T bound, rows). Steps whose interval ends before `time_lb` hold no
    safe plan of the box; steps whose margin exceeds the box's margin bound `margin_ub` none either. A subset
    of the steps stays valid (each tested step then stands for the interval up to the next tested one)."""
    if not len(stair_t):
        return np.zeros(len(rows), dtype=bool)
    covered = time_lb >= stair_t[0]
    steps = _steps(len(stair_t))
    ends = np.append(stair_t[steps[1:]], window_ms)
    for j, (end, m) in enumerate(zip(ends, np.maximum(stair_margin[steps], floor))):
        last = j == len(steps) - 1
        act = covered & ((time_lb <= end) if last else (time_lb < end)) & (margin_ub >= m)
        if act.any():
            idx = np.nonzero(act)[0]
            t = c.time_above(rows[idx], np.full(len(idx), m))
            covered[idx] = (t > end) if last else (t >= end)
    return covered


def score_covered(c: Corner, rows: np.ndarray, score_lb: np.ndarray, time_lb: np.ndarray, w: Weights,
                  threshold: Callable[[np.ndarray], np.ndarray], window_ms: float, mu: float | None = None) -> np.ndarray:
    """Boxes `rows` none of whose plans can enter a log Φ staircase: a plan of time T enters only if its log Φ
    is ≤ threshold(T) (the k-th best kept log Φ among members no slower, non-increasing in T) and T ≤ window_ms.
    `time_lb`: a T bound of the plans that matter (rows; those of margin ≥ mu when mu is given — the safe
    staircase's plans), `score_lb`: the box's log Φ bound at the box's own T bound c.time_ms.

    A plan of T ≥ T̄ (T̄ a T bound of the plans still in question) has log Φ ≥ S̄ − SCORE_SLACK with S̄ =
    score_lb + wT·(log T̄ − log T_lb) (log Φ is non-decreasing in T, M, V; the box's M and V bounds hold
    for it), and it enters only if log Φ ≤ K = threshold(T̄). With its own peak M in place of the box's M bound
    M_lb, log Φ ≥ S̄ + wM·(log M − log M_lb) − SCORE_SLACK, so entering needs M ≤ M̄ = M_lb·exp((K + SCORE_SLACK
    − S̄)/wM): every stage's lowest reachable peak is ≤ M̄, and T̄ rises to the T bound of the box cut there
    (`Corner.time_cut`, with margin ≥ mu too). A box is covered once K < S̄ − SCORE_SLACK (the corner test at
    T̄) or T̄ > window_ms; SCORE_PASSES rounds, each K lower and S̄ higher."""
    covered = np.zeros(len(rows), dtype=bool)
    if w.w_mem <= 0 or c.time_cut is None:
        return covered
    t_bar = np.maximum(time_lb, c.time_ms[rows])
    for _ in range(SCORE_PASSES):
        live = np.nonzero(~covered)[0]
        if not live.size:
            break
        with np.errstate(divide="ignore"):
            s_bar = score_lb[rows[live]] + w.w_time * (np.log(t_bar[live]) - np.log(c.time_ms[rows[live]]))
        k = threshold(t_bar[live])
        with np.errstate(over="ignore", invalid="ignore"):
            m_bar = c.max_mib[rows[live]] * np.exp((k + SCORE_SLACK - s_bar) / w.w_mem) / (1 - SLACK)
        m_bar = np.where(np.isfinite(m_bar), m_bar, np.inf)
        t_cut = c.time_cut(rows[live], mu=None if mu is None else np.full(live.size, mu), peak_mib=m_bar)
        t_bar[live] = np.maximum(t_bar[live], t_cut)
        with np.errstate(divide="ignore"):
            s_bar = score_lb[rows[live]] + w.w_time * (np.log(t_bar[live]) - np.log(c.time_ms[rows[live]]))
        covered[live] = (t_bar[live] > window_ms) | (threshold(t_bar[live]) < s_bar - SCORE_SLACK)
    return covered


def _steps(n: int) -> np.ndarray:
    """The staircase steps tested: all, or JOINT_STEPS spread over them (first and last included)."""
    return np.arange(n) if n <= JOINT_STEPS else np.unique(np.linspace(0, n - 1, JOINT_STEPS).astype(np.int64))
