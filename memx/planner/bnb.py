"""Exact branch-and-bound over the layer splits of one layout (docs/planner.md §Search).

A node is a box of splits (a_s ≤ n_s ≤ b_s, Σ n_s = L). Boxes are processed in batches: their lower
bounds (memx.planner.bounds) are checked against the kept decision sets (memx.planner.candidates);
a box none of the sets can use is discarded with all its splits; a small box is a leaf, enumerated
and scored by the vectorised engine (step 1 fit, step 2 refine, log Φ); a large one is halved along
its widest stage. Depth-first, so the pending boxes stay few; the most promising half goes first.
Stage-by-stage DP over splits is what Alpa (Zheng et al. 2022, §5.2) and Sailor use for time alone;
here three objectives and a k-staircase need bounds on boxes instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from memx.domain.specs import Weights
from memx.planner.bounds import LayoutBounds
from memx.planner.candidates import Keeper, Scored
from memx.planner.space import splits

LEAF = 512  # a box with at most this many splits (an upper bound: Σ n = L fixes one stage) is enumerated
BATCH = 1024  # boxes bounded at once
FLUSH = 1 << 15  # leaf splits scored at once


@dataclass(kw_only=True)
class Work:
    """What one search did: plans scored (enumerated and assigned); the others were discarded by bound
    (or, for splits with a stage that fits at no level, skipped as infeasible)."""

    scored: int = 0

    def add(self, other: Work) -> None:
        self.scored += other.scored


def explore(bounds: LayoutBounds, keeper: Keeper, evaluate: Callable[[np.ndarray], Scored | None],
            weights: Weights | None, epsilon_mib2: float) -> Work:
    """Find every split of the layout that can enter the keeper's sets; offers them to the keeper."""
    work = Work()
    a, b = bounds.root()
    stack = [(a, b)] if len(a) else []
    leaves: list[np.ndarray] = []
    pending = 0

    def flush() -> None:
        nonlocal leaves, pending
        if leaves:
            S = np.concatenate(leaves)
            work.scored += len(S)
            sc = evaluate(S)
            if sc is not None:
                keeper.offer(sc)
        leaves, pending = [], 0

    while stack:
        a, b = stack.pop()
        t_lb = bounds.time_lb(a, b)
        need = keeper.time_needed(t_lb)
        if need.any() and weights is not None:
            corner = bounds.corner(a[need], b[need], t_lb[need])
            need[need] = keeper.needs(corner, corner.score(weights, epsilon_mib2))
        a, b, t_lb = a[need], b[need], t_lb[need]
        leaf = bounds.leaf_size(a, b) <= LEAF
        for i in np.nonzero(leaf)[0]:
            S = splits(bounds.total, a[i], b[i])
            leaves.append(S)
            pending += len(S)
            if pending >= FLUSH:
                flush()
        a, b, t_lb = a[~leaf], b[~leaf], t_lb[~leaf]
        if len(a):
            stack.extend(_halve(bounds, a, b, t_lb))
        elif not stack or pending >= FLUSH // 4:
            flush()
    flush()
    return work


def _halve(bounds: LayoutBounds, a: np.ndarray, b: np.ndarray, t_lb: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Halve every box along its widest stage; batches ordered so the fastest-looking comes off the stack first."""
    rows = np.arange(len(a))
    s = (b - a).argmax(axis=1)
    mid = (a[rows, s] + b[rows, s]) // 2
    a_hi, b_lo = a.copy(), b.copy()
    b_lo[rows, s] = mid
    a_hi[rows, s] = mid + 1
    ca = np.concatenate([a, a_hi])
    cb = np.concatenate([b_lo, b])
    order = np.argsort(np.concatenate([t_lb, t_lb]), kind="stable")[::-1]  # worst first: popped last
    ca, cb = bounds.tighten(ca[order], cb[order])
    return [(ca[i:i + BATCH], cb[i:i + BATCH]) for i in range(0, len(ca), BATCH)]
