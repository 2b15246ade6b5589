"""What a search keeps while scoring plans: the exact decision sets, in memory independent of the space.

Every plan has a key (layout index, split) that breaks ties, so each set below is defined exactly
and does not depend on the order plans are scored in, the batches, the shards or the pruning:
* top-k by time: the k smallest (T, key);
* Φ's candidates: with max_time_ratio r > 0, the plans that fewer than k plans beat in (log Φ, key)
  while being no slower ("k-staircase"): every plan of the final top-k by Φ among the plans within
  r × the fastest is one of them, whatever the fastest turns out to be (a plan q no slower than an
  eligible plan p is eligible too); with r = 0, simply the k smallest (log Φ, key);
* the Pareto front of (T, −margin) (time, smallest relative margin — the floor margin, upper-bound where the
  predictor gives intervals; issue #22): plans no other plan dominates (≤ in both, < in one); of equal points the
  least V, then the smallest key; restricted to `Keeper.front_window_ms` (r × the fastest; with a front tolerance,
  issue #26, also (1 + it) × the fastest safe plan): a plan that dominates one inside is inside, so this is the
  window's front. With KEPT_FRONT_VARIANCE the exact (T, −margin, V) front (a joint (margin, V) bound,
  `Keeper._front_covers`; off for its cost). Reported: the (T, margin, V) front of the kept plans in the window;
* with a margin floor f (issue #22): the *safe* staircases — plans whose smallest margin ≥ f that no safe
  plan beats while being no slower, once by (log Φ, key) and once by (−margin, key) — restricted to
  (1 + balance_tolerance) × the fastest safe plan: the fastest safe plan and the best-by-Φ and
  best-by-margin safe plans within the tolerance of it are among them, whatever the fastest safe plan
  turns out to be, and they do not depend on r (the safe pick may lie outside the Φ window); and the
  *safe front* (issue #22, session 3): their (T, −margin) front, of equal points the least log Φ (a plan that
  dominates a safe one is safe and no slower: the `balanced-front` pick is exact), pruned by the by-margin
  staircase's test (the two have the same prefix-best margins);
* the widest plan (largest smallest margin, then (T, key)): the answer when no plan clears the floor.
Log Φ up to the median constant (memx.planner.objective.log_score) ranks plans, so no set needs the
medians. `Keeper.needs` is the pruning test of the branch-and-bound search on a box's lower bounds: the corner
tests, then each set's joint test (memx.planner.joint; docs/planner.md §Joint bounds).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from memx.domain.specs import Weights
from memx.planner.bounds import SCORE_SLACK, Corner
from memx.planner.front import FrontIndex, dominated_by, front_point, non_dominated
from memx.planner import joint
from memx.planner.joint import front_covers_by_time, score_covered, stair_covers_by_time
from memx.planner.metrics import PlanMetrics
from memx.planner.recompute import Assignment

BLOCK = 4096  # rows checked against the kept sets at once (the sets tighten between blocks)
FIRST_BLOCK = 64  # the first block of an offer (then doubling up to BLOCK)
JOINT_GRID = 8  # margins on the chain of the joint (margin, V) front bound (Keeper._front_covers)
# The kept front's third dimension (issue #22): False keeps the exact (T, floor margin) front (of equal points
# the least V); True the exact (T, floor margin, V) front. Off by default: on mixed-1024 / llama3-405b the
# third dimension makes the search score 26.8 M plans instead of 3.1 M (8.5×, docs/benchmarks.md §Issue #22:
# exact pick), the joint bound below notwithstanding. Read when a Keeper is made.
KEPT_FRONT_VARIANCE = False


@dataclass(frozen=True, kw_only=True)
class Scored:
    """Plans of one layout after the recompute assignment: splits (N, pp), assignment, log Φ (or None)."""

    layout: int | np.ndarray  # one layout, or each row's (N,) (memx.planner.prepared.score_rows)
    splits: np.ndarray
    assignment: Assignment
    score: np.ndarray | None
    stages: np.ndarray | None = None  # with per-row layouts: each row's pp (splits and levels are padded)
    # Issue #22: the smallest margin at the predictor's upper memory bound (LayoutTables.high_margin); None
    # without intervals. The margin floor, the front and the widest plan use it where given (`floor_margins`).
    margin_high: np.ndarray | None = None

    def floor_margins(self, rows: np.ndarray) -> np.ndarray:
        """The margin the pick applies (memx.planner.pick): upper-bound where given, else point; float64."""
        m = self.margin_high if self.margin_high is not None else self.assignment.stats.min_margin
        return m[rows].astype(np.float64)


@dataclass(frozen=True, slots=True)
class Cand:
    """One kept plan: its key, its metrics and what is needed to rebuild it."""

    time_ms: float
    max_mib: float
    var_mib2: float
    score: float
    margin: float
    layout: int
    split: tuple[int, ...]
    level: np.ndarray
    stage_ms: np.ndarray
    stage_mib: np.ndarray
    margin_high: float = float("nan")  # Scored.margin_high; NaN without intervals

    @property
    def floor_margin(self) -> float:
        """The margin the floor, the front and the widest plan use: upper-bound where given, else point."""
        return self.margin if self.margin_high != self.margin_high else self.margin_high

    @property
    def key(self) -> tuple[int, tuple[int, ...]]:
        return (self.layout, self.split)


def _cands(sc: Scored, rows: np.ndarray) -> list[Cand]:
    a = sc.assignment
    many = isinstance(sc.layout, np.ndarray)
    out = []
    for i in rows:
        pp = int(sc.stages[i]) if many else sc.splits.shape[1]
        out.append(Cand(time_ms=float(a.time_ms[i]), max_mib=float(a.stats.max_mib[i]),
                        var_mib2=float(a.stats.variance_mib2[i]), score=float(sc.score[i]) if sc.score is not None else 0.0,
                        margin=float(a.stats.min_margin[i]), layout=int(sc.layout[i]) if many else sc.layout,
                        split=tuple(int(x) for x in sc.splits[i, :pp]), level=a.level[:pp, i].copy(),
                        stage_ms=a.stage_ms[:pp, i].copy(), stage_mib=a.stage_mib[:pp, i].copy(),
                        margin_high=float(sc.margin_high[i]) if sc.margin_high is not None else float("nan")))
    return out


class Keeper:
    """The decision sets of one search (or shard); `offer` scored plans, `needs` prunes boxes, `merge` shards.

    `timed_only`: keep only the top-k by time (the step-1 pre-pass of the auto profile)."""

    def __init__(self, *, top_k: int, max_time_ratio: float = 0.0, timed_only: bool = False,
                 margin_floor: float | None = None, balance_tolerance: float = 0.0, time_floor_ms: float = 0.0,
                 front_tolerance: float | None = None):
        self.k, self.ratio, self.timed_only = max(top_k, 1), max_time_ratio, timed_only
        # A lower bound of every plan's time (the auto pre-pass's fastest step-1 time; 0: none): the final window
        # reaches at least ratio × it, so Φ's box test may count every member up to there (`_box_phi_threshold`).
        self.time_floor_ms = time_floor_ms
        self.floor = None if timed_only else margin_floor  # None: no safe sets
        self.tol, self.front_tol = balance_tolerance, front_tolerance  # front_tol: front_window_ms; None: Φ's window
        self.front_variance = KEPT_FRONT_VARIANCE
        self.fastest_ms = np.inf
        self.fastest_safe_ms = np.inf
        self.by_time: list[Cand] = []
        self.phi: list[Cand] = []
        self.front: list[Cand] = []
        self.safe_phi: list[Cand] = []  # staircase by (log Φ, key) among safe plans
        self.safe_margin: list[Cand] = []  # staircase by (−margin, key) among safe plans
        self.safe_front: list[Cand] = []  # (T, −margin) front of the safe plans, equal points: least log Φ
        self.widest: Cand | None = None
        self._refresh()

    # --- thresholds ---------------------------------------------------------------------------
    def window_ms(self) -> float:
        return self.ratio * self.fastest_ms if self.ratio > 0 else np.inf

    def safe_window_ms(self) -> float:
        return (1.0 + self.tol) * self.fastest_safe_ms

    def front_window_ms(self) -> float:
        """The kept front's time window (module docstring; SearchSpace.front_tolerance): the Φ window, cut to (1 +
        the front tolerance) × the fastest safe plan once one is known; it only shrinks as plans are offered."""
        w = self.window_ms()
        if self.front_tol is None or self.floor is None or not np.isfinite(self.fastest_safe_ms):
            return w
        return min(w, (1.0 + self.front_tol) * self.fastest_safe_ms)

    def front_cut_ms(self) -> float | None:
        """The front's window when the front tolerance cut it (the output reports it), else None."""
        return float(self.front_window_ms()) if self.front_window_ms() < self.window_ms() else None

    def _refresh(self) -> None:
        self.kth_time = self.by_time[self.k - 1].time_ms if len(self.by_time) >= self.k else np.inf
        stair = sorted(self.phi, key=lambda c: (c.time_ms, c.score))
        self._stair_t = np.array([c.time_ms for c in stair])
        best: list[float] = []
        kth = []
        for c in stair:  # k-th smallest score among members no slower than this one
            bisect.insort(best, c.score)
            del best[self.k:]
            kth.append(best[-1] if len(best) >= self.k else np.inf)
        self._stair_kth = np.array(kth)
        self._front = np.array([self._point(c.time_ms, c.floor_margin, c.var_mib2) for c in self.front]).reshape(-1, 3)
        self._front_index: FrontIndex | None = None  # built on the first dominance query after a change
        self._safe_stairs = [_prefix_best(self.safe_phi, _by_score), _prefix_best(self.safe_margin, _by_margin)]

    def _point(self, time_ms, margin, var_mib2) -> list:
        """A plan's (or a box corner's) point on the kept front: (T, −margin, V), or (T, −margin, 0) without V."""
        return front_point(time_ms, margin, var_mib2 if self.front_variance else np.zeros(np.shape(var_mib2)))

    def _phi_threshold(self, time_ms: np.ndarray) -> np.ndarray:
        """k-th smallest log Φ among kept candidates no slower than time_ms (inf where fewer than k)."""
        if self.ratio <= 0:
            return np.full(time_ms.shape, self._stair_kth[-1] if len(self._stair_kth) else np.inf)
        i = np.searchsorted(self._stair_t, time_ms, side="right") - 1
        return np.where(i >= 0, self._stair_kth[np.maximum(i, 0)] if len(self._stair_kth) else np.inf, np.inf)

    def _box_phi_threshold(self, time_ms: np.ndarray) -> np.ndarray:
        """The Φ threshold a box (or its plans of T ≥ time_ms) must beat (issue #26, docs/planner.md §Joint bounds):
        a plan of the final top-k by Φ lies in the final window, which reaches ratio × the final fastest time
        ≥ ratio × time_floor_ms, and fewer than k plans of that window beat it — the members no slower than it
        and those up to ratio × time_floor_ms among them; so the staircase is read at max(T, ratio × time_floor_ms)."""
        if self.ratio <= 0:
            return self._phi_threshold(time_ms)
        return self._phi_threshold(np.maximum(time_ms, self.ratio * self.time_floor_ms))

    def _dominated(self, pts: np.ndarray) -> np.ndarray:
        """Rows of pts (N, 3) strictly dominated by a kept front point."""
        f = self._front
        if len(f) >= FrontIndex.MIN_POINTS and len(pts):
            if self._front_index is None:
                self._front_index = FrontIndex(f)
            out, unsure = self._front_index.dominated(pts)
            if unsure.any():
                out[unsure] = dominated_by(f, pts[unsure])
            return out
        return dominated_by(f, pts)

    def time_needed(self, time_lb: np.ndarray) -> np.ndarray:
        """Boxes whose time bound alone does not rule them out (before bounding memory)."""
        if self.timed_only:
            return time_lb <= self.kth_time
        need = (time_lb <= self.kth_time) | (time_lb <= self.window_ms())
        if self.floor is not None:
            need |= time_lb <= self.safe_window_ms()  # inf until a safe plan is found
        return need

    def needs(self, c: Corner, score_lb: np.ndarray | None, weights: Weights | None = None) -> np.ndarray:
        """Boxes (by their lower bounds) that may still hold a plan of a decision set: the corner tests, then, for
        the boxes the time top-k does not keep, the sets' joint bounds (memx.planner.joint; `weights`: log Φ's,
        for the log Φ tests' (T, M) cut) — a box is dropped when every set that its corner keeps is covered."""
        need = c.time_ms <= self.kth_time
        if self.timed_only:
            return need
        window = c.time_ms <= self.window_ms()
        phi = window & ~(self._box_phi_threshold(c.time_ms) < score_lb - SCORE_SLACK)
        front = (c.time_ms <= self.front_window_ms()) & ~self._dominated(
            np.stack(self._point(c.time_ms, _floor_ub(c), c.var_mib2), axis=1))
        safe = self._safe_needs(c, score_lb)
        keep = need | phi | front | safe
        open_ = keep & ~need  # boxes a joint bound may still discard (small ones: scored instead)
        if c.splits_ub is not None:
            open_ &= c.splits_ub > joint.MIN_SPLITS
        for mask, covers in ((phi, self._phi_covers), (safe, self._safe_covers), (front, self._front_joint)):
            rows = np.nonzero(open_ & mask)[0]
            if rows.size:
                open_[rows[~covers(c, rows, score_lb, weights)]] = False  # this set may need them: kept
        return keep & ~open_

    def _phi_covers(self, c: Corner, rows: np.ndarray, score_lb: np.ndarray, w: Weights | None) -> np.ndarray:
        """Boxes `rows` no plan of which can enter Φ's staircase, by the joint (T, M) cut (joint.score_covered)."""
        if w is None:
            return np.zeros(len(rows), dtype=bool)
        return score_covered(c, rows, score_lb, c.time_ms[rows], w, self._box_phi_threshold, self.window_ms())

    def _safe_covers(self, c: Corner, rows: np.ndarray, score_lb: np.ndarray, w: Weights | None) -> np.ndarray:
        """Boxes `rows` no plan of which can enter a safe set, by joint bounds (docs/planner.md §Joint bounds): the T
        bound of their plans of margin ≥ the floor past the safe window, or both staircases' joint tests
        (joint.score_covered by log Φ, joint.stair_covers_by_time by margin, which is also the safe front's)."""
        if not np.isfinite(self.fastest_safe_ms) or c.time_cut is None:
            return np.zeros(len(rows), dtype=bool)  # no safe plan yet: the widest plan's test decides
        t_safe = np.maximum(c.time_ms[rows], c.time_above(rows, np.full(len(rows), self.floor)))
        window = self.safe_window_ms()
        past = t_safe > window  # no safe plan of the box within the safe window
        live = np.nonzero(~past)[0]  # covered only if both staircases' tests cover them
        if live.size and w is None:
            return past
        if live.size:
            stair_t, best_rank = self._safe_stairs[1]  # prefix-best −margin
            by_margin = stair_covers_by_time(stair_t, -best_rank, window, self.floor, c, rows[live], t_safe[live],
                                             _floor_ub(c)[rows[live]])
            live = live[by_margin]
        if live.size:
            threshold = lambda t: _stair_query(self._safe_stairs[0], t)  # noqa: E731
            past[live] = score_covered(c, rows[live], score_lb, t_safe[live], w, threshold, window, mu=self.floor)
        return past

    def _front_joint(self, c: Corner, rows: np.ndarray, score_lb: np.ndarray, w: Weights | None) -> np.ndarray:
        """Boxes `rows` no plan of which can enter the kept front: the joint (margin, V) chain with the V front,
        else the joint (T, margin) bound (joint.front_covers_by_time)."""
        if self.front_variance:
            return self._front_covers(c, rows) if c.stage_lo_mib is not None else np.zeros(len(rows), dtype=bool)
        if c.time_cut is None:
            return np.zeros(len(rows), dtype=bool)
        return front_covers_by_time(self._front, self.front_window_ms(), c, rows, _floor_ub(c)[rows])

    def _front_covers(self, c: Corner, rows: np.ndarray) -> np.ndarray:
        """Boxes `rows` every plan of which a kept front point dominates, by the joint (margin, V) bound (issue
        #22): with g(μ) = the least V of front points no slower than the box's T bound with margin ≥ μ (strictly
        faster: the T bound is deflated) and V_μ = the least V of the box's plans with margin ≥ μ
        (Corner.variance_lb_above), a plan of margin in [μ_{j+1}, μ_j) is dominated when g(μ_j) ≤ V_{μ_{j+1}}; on
        the chain μ_0 = the box's margin bound > μ_1 > … > μ_G > −∞ (a grid of the front's margins) every plan
        is. The plain corner test is the chain without a grid: g(μ_0) ≤ V_{−∞}."""
        if len(self._front) < 2:
            return np.zeros(len(rows), dtype=bool)
        if self._front_index is None:
            self._front_index = FrontIndex(self._front)
        t, ub = c.time_ms[rows], _floor_ub(c)[rows]
        grid = np.unique(np.quantile(-self._front[:, 1], np.linspace(1.0, 0.0, JOINT_GRID)))[::-1]
        covered = np.ones(len(rows), dtype=bool)
        prev = ub
        for mu in [*grid, -np.inf]:
            nxt = np.minimum(mu, ub)
            v_lb = c.variance_lb_above(rows, nxt) if np.isfinite(mu) else c.var_mib2[rows]
            covered &= self._front_index.least(t, -prev) <= v_lb
            prev = nxt
            if not covered.any():
                break
        return covered

    def _safe_needs(self, c: Corner, score_lb: np.ndarray) -> np.ndarray:
        """Boxes that may hold a member of the safe staircases or a wider plan than the widest so far."""
        if self.floor is None:
            return np.zeros(len(c.time_ms), dtype=bool)
        ub = _floor_ub(c)
        safe = (ub >= self.floor) & (c.time_ms <= self.safe_window_ms())
        by_phi = ~(_stair_query(self._safe_stairs[0], c.time_ms) < score_lb - SCORE_SLACK)
        by_margin = ~(_stair_query(self._safe_stairs[1], c.time_ms) < -ub)
        wider = ub >= (self.widest.floor_margin if self.widest is not None else -np.inf)
        return (safe & (by_phi | by_margin)) | (wider if not np.isfinite(self.fastest_safe_ms) else False)

    # --- offers --------------------------------------------------------------------------------
    def offer(self, sc: Scored) -> None:
        """Offer scored plans: the batch's fastest (and fastest safe) time and widest plan first, then the rows the
        sets' thresholds admit, in blocks by time (thresholds only tighten: a row rejected now stays rejected)."""
        a = sc.assignment
        if a.time_ms.size == 0:
            return
        t = a.time_ms.astype(np.float64)
        self.fastest_ms = min(self.fastest_ms, float(t.min()))
        self._offer_widest(sc, t)
        rows = np.nonzero(self._admitted(sc, np.arange(t.size), t).any(axis=0))[0]
        order = rows[np.argsort(t[rows], kind="stable")]
        i, size = 0, FIRST_BLOCK  # blocks grow: the first ones set the thresholds that filter the rest
        while i < order.size:
            self._offer_block(sc, order[i:i + size], t[order[i:i + size]])
            i, size = i + size, min(2 * size, BLOCK)

    def _admitted(self, sc: Scored, rows: np.ndarray, t: np.ndarray) -> np.ndarray:
        """(4, rows) masks of the rows (times t) the current thresholds admit to the top-k by time, Φ's
        staircase, the front and the safe staircases (the same tests decide in `_offer_block`)."""
        out = np.zeros((4, rows.size), dtype=bool)
        out[0] = t <= self.kth_time
        if self.timed_only:
            return out
        a = sc.assignment
        inside = t <= self.window_ms()
        s = sc.score[rows].astype(np.float64)
        out[1] = inside & ~(self._phi_threshold(t) < s)
        m = sc.floor_margins(rows)
        pts = np.stack(self._point(t, m, a.stats.variance_mib2[rows].astype(np.float64)), axis=1)
        out[2] = (t <= self.front_window_ms()) & ~self._dominated(pts)
        if self.floor is not None:
            safe = (m >= self.floor) & (t <= self.safe_window_ms())
            out[3] = safe & (~(_stair_query(self._safe_stairs[0], t) < s) | ~(_stair_query(self._safe_stairs[1], t) < -m))
        return out

    def _offer_block(self, sc: Scored, rows: np.ndarray, t: np.ndarray) -> None:
        """One block (rows by time, their times t) against the thresholds as they are."""
        by_time, phi, front, safe = (rows[x] for x in self._admitted(sc, rows, t))
        if by_time.size:
            self.by_time = self._top(self.by_time + _cands(sc, by_time), lambda c: (c.time_ms, c.key))
        if phi.size:
            self.phi = self._staircase(self.phi + _cands(sc, phi))
        if front.size:
            self.front = self._pareto(self.front + _cands(sc, front))
        if safe.size:
            new = _cands(sc, safe)
            self.safe_phi = self._safe_stair(self.safe_phi + new, _by_score)
            self.safe_margin = self._safe_stair(self.safe_margin + new, _by_margin)
            self.safe_front = self._safe_stair(self.safe_front + new, _by_margin, front=True)
        if by_time.size or phi.size or front.size or safe.size:
            self._refresh()

    def _offer_widest(self, sc: Scored, t: np.ndarray) -> None:
        """The batch's widest plan (largest margin, then fastest, then least V) against the widest so far, and
        the batch's fastest safe plan's time (so the safe window is set before its blocks)."""
        if self.floor is None:
            return
        m = sc.floor_margins(np.arange(t.size))
        if (m >= self.floor).any():
            self.fastest_safe_ms = min(self.fastest_safe_ms, float(t[m >= self.floor].min()))
        v = sc.assignment.stats.variance_mib2.astype(np.float64)
        i = int(np.lexsort((v, t, -m))[0])
        w = self.widest
        if w is None or (-m[i], t[i], v[i]) < (-w.floor_margin, w.time_ms, w.var_mib2):
            self.widest = _cands(sc, np.array([i]))[0]

    def merge(self, other: Keeper) -> None:
        """Fold another keeper (a shard's) into this one."""
        self.fastest_ms = min(self.fastest_ms, other.fastest_ms)
        self.by_time = self._top(self.by_time + other.by_time, lambda c: (c.time_ms, c.key))
        if not self.timed_only:
            self.phi = self._staircase(self.phi + other.phi)
            self.front = self._pareto(self.front + other.front)
        if self.floor is not None:
            self.fastest_safe_ms = min(self.fastest_safe_ms, other.fastest_safe_ms)
            self.safe_phi = self._safe_stair(self.safe_phi + other.safe_phi, _by_score)
            self.safe_margin = self._safe_stair(self.safe_margin + other.safe_margin, _by_margin)
            self.safe_front = self._safe_stair(self.safe_front + other.safe_front, _by_margin, front=True)
            ws = [w for w in (self.widest, other.widest) if w is not None]
            self.widest = min(ws, key=lambda c: (-c.floor_margin, c.time_ms, c.var_mib2, c.key)) if ws else None
        self._refresh()

    # --- exact set maintenance (small lists) ---------------------------------------------------
    def _top(self, cands: list[Cand], key) -> list[Cand]:
        return sorted(_unique(cands), key=key)[: self.k]

    def _staircase(self, cands: list[Cand]) -> list[Cand]:
        window = self.window_ms()
        cands = [c for c in _unique(cands) if c.time_ms <= window]
        if self.ratio <= 0:
            return self._top(cands, lambda c: (c.score, c.key))
        out, best = [], []
        for c in sorted(cands, key=lambda c: (c.time_ms, c.score, c.key)):
            rank = (c.score, c.key)
            if len(best) < self.k or rank < best[self.k - 1]:
                out.append(c)
            bisect.insort(best, rank)
            del best[self.k:]
        return out

    def _pareto(self, cands: list[Cand]) -> list[Cand]:
        window = self.front_window_ms()
        cands = sorted((c for c in _unique(cands) if c.time_ms <= window),
                       key=lambda c: (c.time_ms, -c.floor_margin, c.var_mib2, c.key))
        keep = non_dominated(np.array([self._point(c.time_ms, c.floor_margin, c.var_mib2) for c in cands]).reshape(-1, 3))
        return [c for c, k in zip(cands, keep) if k]

    def _safe_stair(self, cands: list[Cand], rank, front: bool = False) -> list[Cand]:
        """Safe plans within the tolerance that no no-slower safe plan beats by `rank` (then V, then key); with
        `front`, that no no-slower one matches on `rank` either, ties by (log Φ, key): the (T, rank) front, of
        equal points the least log Φ (the safe front)."""
        window = self.safe_window_ms()
        out: list[Cand] = []
        best = None
        for c in sorted((c for c in _unique(cands) if c.time_ms <= window),
                        key=lambda c: (c.time_ms, rank(c), c.score if front else c.var_mib2, c.key)):
            if best is None or (rank(c) < best[0] if front else (rank(c), c.var_mib2, c.key) < best):
                out.append(c)
                best = (rank(c), c.var_mib2, c.key)
        return out

    # --- the answer ----------------------------------------------------------------------------
    def best_by_time(self) -> list[Cand]:
        return self.by_time[: self.k]

    def best_by_score(self) -> list[Cand]:
        fastest = self.by_time[0].time_ms if self.by_time else np.inf
        eligible = [c for c in self.phi if self.ratio <= 0 or c.time_ms <= self.ratio * fastest]
        return sorted(eligible, key=lambda c: (c.score, c.key))[: self.k]

    def pareto(self) -> list[Cand]:
        window = self.front_window_ms()
        return [c for c in self.front if c.time_ms <= window]

    def safe(self) -> list[Cand]:
        """The safe staircases within the tolerance of the fastest safe plan; the widest plan if none is safe."""
        if self.floor is None:
            return []
        if not np.isfinite(self.fastest_safe_ms):
            return [self.widest] if self.widest is not None else []
        window = self.safe_window_ms()
        return _unique([c for c in self.safe_margin + self.safe_phi + self.safe_front if c.time_ms <= window])


def _by_score(c: Cand) -> float:
    return c.score


def _by_margin(c: Cand) -> float:
    return -c.floor_margin


def _floor_ub(c: Corner) -> np.ndarray:
    """The boxes' upper bound of the margin the floor uses (Cand.floor_margin)."""
    return c.margin_high_ub if c.margin_high_ub is not None else c.margin_ub


def _prefix_best(stair: list[Cand], rank) -> tuple[np.ndarray, np.ndarray]:
    """(times ascending, best rank among members no slower) of a staircase."""
    t = np.array([c.time_ms for c in stair], dtype=np.float64)
    r = np.minimum.accumulate(np.array([rank(c) for c in stair], dtype=np.float64)) if stair else np.empty(0)
    return t, r


def _stair_query(stair: tuple[np.ndarray, np.ndarray], time_ms: np.ndarray) -> np.ndarray:
    """Best rank among staircase members no slower than time_ms (inf where none)."""
    t, r = stair
    if len(t) == 0:
        return np.full(np.shape(time_ms), np.inf)
    i = np.searchsorted(t, time_ms, side="right") - 1
    return np.where(i >= 0, r[np.maximum(i, 0)], np.inf)


def _unique(cands: list[Cand]) -> list[Cand]:
    seen: dict = {}
    for c in cands:
        seen.setdefault(c.key, c)
    return list(seen.values())


def pareto_front(cands: list[PlanMetrics]) -> list[PlanMetrics]:
    """Deduplicate by plan (the whole plan: two plans that differ only in virtual stages or a job option are
    two plans) and sort by time."""
    seen, out = set(), []
    for c in sorted(cands, key=lambda c: c.iteration_time_ms):
        key = c.plan
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out
