"""Exact branch-and-bound over the layer splits of many layouts at once (docs/planner.md §Search).

A node is a box of splits of one layout (a_s ≤ n_s ≤ b_s, Σ n_s = L). Boxes are processed in rounds:
each round takes the pending boxes of least time bound, over all layouts (memx.planner.bounds.BoxBounds
bounds them in one numpy pass), checks their lower bounds against the kept decision sets
(memx.planner.candidates); a box none of the sets can use is discarded with all its splits; a small box
is a leaf, enumerated and — all the round's leaves together — scored by the vectorised engine (step 1
fit, step 2 refine, log Φ; memx.planner.tables.StackedTables); a large one is halved along its widest
stage. Stage-by-stage DP over splits is what Alpa (Zheng et al. 2022, §5.2) and Sailor use for time
alone; here three objectives and a k-staircase need bounds on boxes instead. Which boxes a round gets — the
seeding task, batches of least time bound, the growth cap — is memx.planner.distributed.explore_pool's, in one
process too (distributed.Inline; issue #26, docs/benchmarks.md §Issue #26: the deep search's order).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from memx.domain.specs import Weights
from memx.planner.bounds import BoxBounds
from memx.planner.candidates import Keeper, Scored
from memx.planner.space import splits_many

LEAF = 64  # a box with at most this many splits (an upper bound: Σ n = L fixes one stage) is enumerated; 512
# before issue #26 session 4: with the leaves enumerated together (splits_many) smaller leaves pay (405B pp 8:
# 1.59 M plans scored → 0.38 M, branch-and-bound CPU 9.9 → 6.7 s; docs/benchmarks.md §Issue #26: deep search)
BATCH = 1024  # boxes bounded at once (the least time bounds first)
POOL = 1 << 16  # pending boxes beyond which the smallest go first (their leaves are scored and leave the pool)
FLUSH = 1 << 15  # leaf splits scored at once
SHRINK = 16  # past POOL pending boxes a round takes 1/SHRINK of them (`take`), up to MAX_BATCH
MAX_BATCH = 16 * BATCH


@dataclass(kw_only=True)
class Work:
    """What one search did: plans scored (enumerated and assigned); the others were discarded by bound
    (or, for splits with a stage that fits at no level, skipped as infeasible)."""

    scored: int = 0

    def add(self, other: Work) -> None:
        self.scored += other.scored


Boxes = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # (a, b, layout, time bound) of pending boxes
Evaluate = Callable[[np.ndarray, np.ndarray], Scored | None]


def roots(bounds: BoxBounds, layouts: np.ndarray) -> Boxes:
    """The root box of each layout with its time bound."""
    a, b, li = bounds.root(layouts)
    return a, b, li, bounds.time_lb(a, b, li)


def advance(bounds: BoxBounds, keeper: Keeper, evaluate: Evaluate, weights: Weights | None, epsilon_mib2: float,
            boxes: Boxes, work: Work) -> Boxes:
    """One round: the best BATCH of `boxes` (`take`) are bounded, scored or halved; returns the pending boxes after it
    (the order of rounds: memx.planner.distributed.explore_pool, in one process too)."""
    batch, rest = take(bounds, keeper, boxes, BATCH)
    children = expand(bounds, keeper, evaluate, weights, epsilon_mib2, batch, work)
    return children if rest is None else concat(children, rest)


def take(bounds: BoxBounds, keeper: Keeper, boxes: Boxes, n: int) -> tuple[Boxes, Boxes | None]:
    """(the n boxes that go first, the rest) of the boxes the keeper's time thresholds do not rule out: the
    least time bounds; past POOL boxes the smallest boxes, so the pool shrinks (their leaves leave it), and
    1/SHRINK of the pool (at most MAX_BATCH boxes) instead of n: the pool's upkeep — its time filter, order and
    copies, O(pool) a round — is then spread over as many boxes (issue #26: it was 40 % of the 405B deep
    search's time, its pool holding millions of boxes)."""
    a, b, li, t = boxes
    keep = keeper.time_needed(t)
    if not keep.all():
        a, b, li, t = a[keep], b[keep], li[keep], t[keep]
    if len(a) <= n:
        return (a, b, li, t), None
    order = t
    if len(a) > POOL:
        n, order = min(max(n, len(a) // SHRINK), MAX_BATCH), bounds.leaf_size(a, b)
    first = np.zeros(len(a), dtype=bool)
    first[np.argpartition(order, n - 1)[:n]] = True
    return (a[first], b[first], li[first], t[first]), (a[~first], b[~first], li[~first], t[~first])


def concat(x: Boxes, y: Boxes) -> Boxes:
    return tuple(np.concatenate([u, v]) for u, v in zip(x, y))


def expand(bounds: BoxBounds, keeper: Keeper, evaluate: Evaluate, weights: Weights | None, epsilon_mib2: float,
           boxes: Boxes, work: Work) -> Boxes:
    """Bound a batch of boxes against the keeper; its leaves are enumerated, scored and offered to the keeper
    (work.scored counts them), the other boxes it still needs are halved: returns the children."""
    a, b, li, t = boxes
    if weights is not None and len(a):
        corner = bounds.corner(a, b, li, t)
        need = keeper.needs(corner, corner.score(weights, epsilon_mib2), weights)
        a, b, li, t = a[need], b[need], li[need], t[need]
    size = bounds.leaf_size(a, b)
    leaf = size <= LEAF
    _score_leaves(bounds, keeper, evaluate, a[leaf], b[leaf], li[leaf], size[leaf], work)
    a, b, li = _halve(bounds, a[~leaf], b[~leaf], li[~leaf])
    return a, b, li, bounds.time_lb(a, b, li)


def _score_leaves(bounds: BoxBounds, keeper: Keeper, evaluate: Evaluate, a: np.ndarray, b: np.ndarray,
                  li: np.ndarray, size: np.ndarray, work: Work) -> None:
    """Enumerate the leaf boxes (`space.splits_many`: groups of boxes of ≤ FLUSH splits by their upper bound
    `size`, one call a group — issue #26: one call per leaf was 31 % of the deep search), score them in batches
    of ≥ FLUSH splits and offer them to the keeper (padded stages have a = b = 0: their splits are 0 there)."""
    group = np.cumsum(size) // FLUSH  # consecutive boxes of ≤ FLUSH (+ one box's ≤ LEAF) splits a group
    cuts = np.flatnonzero(np.diff(group)) + 1
    parts: list[tuple[np.ndarray, np.ndarray]] = []
    pending = 0
    for lo, hi, own in zip(np.split(a, cuts), np.split(b, cuts), np.split(li, cuts)):
        S, box = splits_many(bounds.total, lo, hi)
        if len(S):
            parts.append((own[box], S))
            pending += len(S)
        if pending >= FLUSH:
            _flush(keeper, evaluate, parts, work)
            pending = 0
    _flush(keeper, evaluate, parts, work)


def _flush(keeper: Keeper, evaluate: Evaluate, parts: list[tuple[np.ndarray, np.ndarray]], work: Work) -> None:
    """Score the collected leaves' splits (their layouts, their splits) in one batch and offer them to the keeper."""
    if parts:
        owner = np.concatenate([o for o, _ in parts])
        S = np.concatenate([x for _, x in parts])
        work.scored += len(S)
        sc = evaluate(owner, S)
        if sc is not None:
            keeper.offer(sc)
    parts.clear()


def _halve(bounds: BoxBounds, a: np.ndarray, b: np.ndarray, li: np.ndarray) -> tuple[np.ndarray, ...]:
    """Halve every box along its widest stage (tightened)."""
    rows = np.arange(len(a))
    s = (b - a).argmax(axis=1)
    mid = (a[rows, s] + b[rows, s]) // 2
    a_hi, b_lo = a.copy(), b.copy()
    b_lo[rows, s] = mid
    a_hi[rows, s] = mid + 1
    return bounds.tighten(np.concatenate([a, a_hi]), np.concatenate([b_lo, b]), np.concatenate([li, li]))
