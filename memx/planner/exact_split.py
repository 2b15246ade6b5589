"""The exact split of one per-stage-dp layout under the cycle-mean assemblies (issue #27; docs/planner.md §Data
parallel per stage, "The split under the cycle mean and the drain").

The layout's ε-constraint walk (memx.planner.stage_dp_search._layout_best) is exact for the paper's
T = (m − 1)·max_s t_s + Σ_s t_s + fixed + max_s tail_s. Under `pipeline_assembly: cycle-mean` the bottleneck is the
maximum cycle mean c* (memx.planner.schedule.steady_period_ms) and under the default `cycle-mean-drain` the tail
term is max_s (tail_s − D_s), D_s = Σ_{s'<s} (2/3·t_{s'} + loop_{s'}/2) (memx.planner.drain): the walk ranks splits
by the paper's C and steps by the largest tail, so it can pass over the best split. This module searches the
split exactly, given an incumbent (the walk's plan): a depth-first branch-and-bound over the stages in order,
stage s choosing its layer count n_s and one of its eligible rows at n_s.

Only rows no other row at the same n beats on both time and tail are branched on: T grows with every t_s (by at
least (1 − 2/3)·δ, the Σ term's δ less the drain's 2/3·δ; c* is non-decreasing in each t_s) and with every
tail_s.
A node (stages 0..s chosen, l layers used, r = L − l left for the k = pp − 1 − s stages after it) is cut when
  (m − 1)·max(c_part, τ_rest) + Σ_chosen t + LS_rest(r) + fixed + tail_lb ≥ best,
where c_part is the largest cycle mean over windows inside the chosen stages (every window's mean is a lower bound
of c* ≥ max_s t_s); τ_rest is a lower bound on the remaining stages' bottleneck (each at least its fastest, and at
least the r-th smallest g_{s'}(n) = min_{n' ≥ n} t[s', n'] over them, as stage_dp_search._lower_bounds argues);
LS_rest(r) the least Σ t of the remaining stages holding r layers (a min-plus programme); tail_lb the drained term
of the chosen stages and of the next one at its least tail (its D is known), or, without the drain, the largest of
the chosen tails and of the remaining stages' least tails. Every bound is a valid lower bound of T on every split
below the node, so the search misses no split faster than the incumbent.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from memx.planner.drain import BACKWARD_SHARE


@dataclasses.dataclass(frozen=True, kw_only=True)
class SplitProblem:
    """One layout's split problem: per stage s, its candidate rows (n, t_ms, tail_ms, row) — Pareto per n —,
    the micro batches m, the layer total, the fixed term, the loops 2·c·p2p per boundary (None: the paper's
    max_s t_s) and whether the tail term is drained."""

    candidates: tuple[tuple[tuple[int, float, float, int], ...], ...]
    micro_batches: int
    total_layers: int
    fixed_ms: float
    loop_ms: tuple[float, ...] | None
    drain: bool


def pareto_rows(layers: np.ndarray, time_ms: np.ndarray, tail_ms: np.ndarray, ok: np.ndarray
                ) -> tuple[tuple[int, float, float, int], ...]:
    """The eligible rows of one stage as (n, t, tail, row), per n only those no faster-or-equal row beats on tail."""
    r = np.flatnonzero(ok)
    r = r[np.lexsort((tail_ms[r], time_ms[r], layers[r]))]
    out, last_n, best_tail = [], -1, np.inf
    for j in r:
        n = int(layers[j])
        if n != last_n:
            last_n, best_tail = n, np.inf
        if tail_ms[j] < best_tail:
            out.append((n, float(time_ms[j]), float(tail_ms[j]), int(j)))
            best_tail = float(tail_ms[j])
    return tuple(out)


@functools.lru_cache(maxsize=8)
def min_plus_shifts(total: int) -> tuple[np.ndarray, np.ndarray]:
    """For every (l, n): the index l − n and 0 where n ≤ l, else 0 and inf (a min-plus step's gather)."""
    l, n = np.arange(total + 1)[:, None], np.arange(total + 1)[None, :]
    return np.where(n <= l, l - n, 0), np.where(n <= l, 0.0, np.inf)


def least_sums(t: np.ndarray, total: int) -> np.ndarray:
    """(pp + 1, total + 1): the least Σ_{s' ≥ s} t[s', n_s'] over splits of r layers among stages s.. (n ≥ 1 each;
    t: (pp, total + 1), inf where a stage cannot hold n), one min-plus pass per stage from the last; [0, total] is a
    lower bound on the Σ term of any split of the layout."""
    pp = t.shape[0]
    src, blocked = min_plus_shifts(total)
    least = np.full((pp + 1, total + 1), np.inf)
    least[pp, 0] = 0.0
    for s in range(pp - 1, -1, -1):  # least[s, r] = min_{n ≥ 1} t[s, n] + least[s + 1, r − n]
        row = t[s].copy()
        row[0] = np.inf
        least[s] = (least[s + 1][src] + blocked + row[None, :]).min(axis=1)
    return least


def _tables(p: SplitProblem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(least Σ t of stages s.. holding r layers (pp + 1, L + 1), τ_rest (pp + 1, L + 1), least tail per stage)."""
    pp, total = len(p.candidates), p.total_layers
    tmin = np.full((pp, total + 1), np.inf)
    tail_min = np.full(pp, np.inf)
    for s, cands in enumerate(p.candidates):
        for n, t, tail, _ in cands:
            tmin[s, n] = min(tmin[s, n], t)
            tail_min[s] = min(tail_min[s], tail)
    least = least_sums(tmin, total)
    g = np.minimum.accumulate(tmin[:, :0:-1], axis=1)[:, ::-1]  # g[s, n − 1] = min_{n' ≥ n} tmin[s, n']
    tau = np.zeros((pp + 1, total + 1))
    for s in range(pp):
        merged = np.sort(g[s:].ravel())
        floor = tmin[s:, 1:].min(axis=1).max()
        r = np.arange(1, total + 1)
        tau[s, 1:] = np.maximum(np.where(r <= merged.size, merged[np.minimum(r, merged.size) - 1], np.inf), floor)
    return least, tau, tail_min


def solve(p: SplitProblem, best_ms: float) -> tuple[float, tuple[int, ...], tuple[int, ...]] | None:
    """(T, split, rows) of the fastest split whose T is below `best_ms`, or None when none is (module docstring)."""
    pp, total, m = len(p.candidates), p.total_layers, p.micro_batches
    if pp == 0 or any(not c for c in p.candidates):
        return None
    least_np, tau_np, tail_np = _tables(p)
    rest_tail = np.maximum.accumulate(tail_np[::-1])[::-1].tolist() + [-np.inf]  # max least tail of stages s..
    least, tau, tail_min = least_np.tolist(), tau_np.tolist(), tail_np.tolist()  # Python floats: a fast inner loop
    loop = p.loop_ms
    found: list = [None]
    bound = [best_ms]
    split, rows = [0] * pp, [0] * pp

    def visit(s: int, used: int, tsum: float, c_part: float, windows: list[float], tail_part: float, lead: float):
        left_stages = pp - 1 - s
        for n, t, tail, j in p.candidates[s]:
            r = total - used - n
            if r < left_stages or (left_stages == 0 and r != 0) or least[s + 1][r] == np.inf:
                continue
            # windows a..s of Σ t + Σ loop (steady_period_ms), each mean a lower bound of c*
            grown = [w + loop[s - 1] + t for w in windows] + [t] if loop is not None and s else [t]
            c_new = max(c_part, max(w / (len(grown) - a) for a, w in enumerate(grown))) if loop is not None \
                else max(c_part, t)
            if p.drain:
                tail_new = max(tail_part, tail - lead)
                nxt = lead + t * BACKWARD_SHARE + (loop[s] / 2.0 if loop is not None and s < pp - 1 else 0.0)
                tail_lb = max(tail_new, tail_min[s + 1] - nxt) if left_stages else tail_new
            else:
                tail_new, nxt = max(tail_part, tail), lead
                tail_lb = max(tail_new, rest_tail[s + 1])
            low = (m - 1) * max(c_new, tau[s + 1][r]) + (tsum + t) + least[s + 1][r] + p.fixed_ms + tail_lb
            if not low < bound[0]:
                continue
            split[s], rows[s] = n, j
            if left_stages == 0:  # a leaf: low is its T (c_new is c*: every window ends here or before)
                found[0], bound[0] = (low, tuple(split), tuple(rows)), low
            else:
                visit(s + 1, used + n, tsum + t, c_new, grown, tail_new, nxt)

    visit(0, 0, 0.0, 0.0, [], -np.inf, 0.0)
    return found[0]
