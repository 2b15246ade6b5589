"""Lower bounds on (T, M, V, log Φ) over a *box* of layer splits — every split with a_s ≤ n_s ≤ b_s and
Σ n_s = L — for the exact branch-and-bound search (docs/planner.md §Search; docs/architecture.md §Search).

Per stage s and layer count n the tables give the step-1 (fit) level's time t1 and peak m1 and the
DP tail (all-reduce + optimizer). Refinement (memx.planner.recompute, step 2) only moves a stage up
its ladder — time up, memory down — and only while that stage is tight (margin < target), so a
stage's final memory lies in [m_lo, m1], m_lo being the peak of the first level at or above the fit
that is not tight (or the top of the ladder), and its final time is ≥ t1. Hence for every split in a box:
* T ≥ (m − 1)·max(B*, MM) + SS + Σ 2·p2p + max_s min tail (cycle-mean-drain: min tail_0, as max_s (tail_s − D_s)
  ≥ tail_0, memx.planner.drain) — T is non-decreasing in every stage time
  (1F1B, paper §3.1.2), B* = the layout's smallest achievable bottleneck, MM ≤ min over the box's splits
  (Σ n = L) of max_s t1 (`MinMax`), SS ≤ min over them of Σ_s t1 (`max_lagrange_sum`);
* M ≥ max(max_s min m_lo, the box min-max of m_lo);
* the smallest margin 1 − max_s peak_s / cap_s ≤ 1 − max(max_s min m_lo/cap, the box min-max of m_lo/cap)
  (each stage's final peak ≥ m_lo; issue #22: the safe sets and the (T, margin, V) front need it);
* V ≥ min over x_s ∈ [min m_lo, max m1] of the GPU-weighted variance of x = min_c Σ_s w_s·dist(c, I_s)²
  (a convex function of c: the variance is the smallest weighted square distance to one point);
* log Φ ≥ wT·log T_lb + wM·log M_lb + wV·log(V_lb + ε) (log Φ is non-decreasing in T, M, V).
Range minima over n ∈ [a, b] are O(1) lookups in sparse tables (Bender & Farach-Colton 2000).
The search evaluates T, M, V in float32, so bounds are compared with a relative slack (SLACK).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from memx.domain.specs import Weights
from memx.planner.medians import sorted_quantiles
from memx.planner.tables import StackedTables

SLACK = 1e-5  # relative: float32 totals of ≤ 64 stages are within ~64·2⁻²⁴ ≈ 4e−6 of exact arithmetic
SCORE_SLACK = 1e-4  # absolute, in log Φ (float32 log of values ≈ 10: error ≤ a few 1e−6)
MARGIN_SLACK = 1e-5  # absolute, on a margin in [0, 1) computed in float32 (error ≤ a few 1e−7)
JOINT_TIME = True  # issue #26: the keeper's joint bounds (Corner.time_cut; docs/planner.md §Joint bounds); read in BoxBounds.corner
_LOG2 = np.floor(np.log2(np.maximum(np.arange(1 << 12), 1))).astype(np.int64)  # ⌊log2 w⌋ of a range width w ≥ 1


class RangeTable:
    """Range minimum (or maximum) over n ∈ [a, b] per stage in O(1): a sparse table of 2^j windows."""

    def __init__(self, x: np.ndarray, *, maximum: bool = False):
        self.op = np.maximum if maximum else np.minimum
        n = x.shape[1]
        self.levels = np.empty((max(n, 1).bit_length(), *x.shape), dtype=x.dtype)  # (J, pp, rows): 2^j ≤ rows
        self.levels[0] = x
        for j in range(1, len(self.levels)):  # level j: the extremum of the 2^j window from n (filled in place)
            width = 1 << (j - 1)
            prev, nxt = self.levels[j - 1], self.levels[j]
            self.op(prev[:, : n - width], prev[:, width:], out=nxt[:, : n - width])
            nxt[:, n - width:] = -np.inf if maximum else np.inf

    def query(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """(B, pp) range extremum of stage s over [a[:, s], b[:, s]] (a ≤ b)."""
        return self.query_rows(np.arange(a.shape[1])[None, :], a, b)

    def query_rows(self, r: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Range extremum of table row r[i, s] over [a[i, s], b[i, s]]: (B, P), or (B, P, C) for a table of
        C channels (x of shape (rows of tables, n, C): every channel in one gather). Gathered by flat `take`s
        of levels[j, r, n] (issue #26: the three-index fancy index took twice as long; the same entries)."""
        j = _LOG2[np.maximum(b - a + 1, 1)]
        _, rows, n = self.levels.shape[:3]
        at = (j * rows + r) * n
        flat = self.levels.reshape(-1, *self.levels.shape[3:])
        return self.op(flat.take(at + a, axis=0), flat.take(at + b - (1 << j) + 1, axis=0))


@dataclass(frozen=True, kw_only=True)
class Corner:
    """Lower bounds of a batch of boxes (arrays of shape (B,))."""

    time_ms: np.ndarray
    max_mib: np.ndarray
    var_mib2: np.ndarray
    margin_ub: np.ndarray  # an upper bound (not a lower one) of the smallest margin, inflated by MARGIN_SLACK
    # Issue #22: the same for the smallest margin at the predictor's upper memory bound (LayoutTables.high_mib);
    # None without intervals.
    margin_high_ub: np.ndarray | None = None
    # Issue #22, the joint (margin, V) bound: each stage's peak interval over the box, the layout's GPU weights
    # and capacities (all (B, P)) — `variance_lb_above` bounds V among a box's plans of margin ≥ μ.
    stage_lo_mib: np.ndarray | None = None
    stage_hi_mib: np.ndarray | None = None
    weight: np.ndarray | None = None
    capacity_mib: np.ndarray | None = None
    # Issue #26, the joint bounds: time_cut(rows, mu=, peak_mib=) bounds T over boxes `rows`' plans of margin ≥ mu
    # and largest peak ≤ peak_mib (BoxBounds.time_lb_cut); the keeper's joint tests use it where the corner alone
    # keeps a box (docs/planner.md §Joint bounds).
    time_cut: Callable[..., np.ndarray] | None = None
    splits_ub: np.ndarray | None = None  # an upper bound of each box's splits (BoxBounds.leaf_size)

    def time_above(self, rows: np.ndarray, mu: np.ndarray) -> np.ndarray:
        """A lower bound of T over the plans of boxes `rows` whose smallest margin is ≥ mu (per row)."""
        return self.time_cut(rows, mu=mu)

    def variance_lb_above(self, rows: np.ndarray, mu: np.ndarray) -> np.ndarray:
        """A lower bound of V over the plans of boxes `rows` whose smallest margin (point or upper-bound: the
        upper-bound peak is ≥ the point peak) is ≥ mu (per row): such a plan has every stage's peak ≤ (1 − μ)·cap
        (MARGIN_SLACK for float32), so V ≥ box_variance_lb over the intervals clipped there; +inf where a
        clipped interval is empty (no plan of the box has that margin). On mixed capacities a wide margin
        forces the small GPUs' peaks down while the large ones' stay above their lower ends: V grows."""
        lo, hi = self.stage_lo_mib[rows], self.stage_hi_mib[rows]
        top = (1.0 - np.asarray(mu, dtype=np.float64)[:, None] + MARGIN_SLACK) * self.capacity_mib[rows]
        hi = np.minimum(hi, top)
        empty = (hi < lo).any(axis=1)
        hi = np.maximum(hi, lo)
        return np.where(empty, np.inf, _safe_variance(box_variance_lb(lo, hi, self.weight[rows]), hi))

    def score(self, w: Weights, epsilon_mib2: float) -> np.ndarray:
        with np.errstate(divide="ignore"):
            return w.w_time * np.log(self.time_ms) + w.w_mem * np.log(self.max_mib) + w.w_var * np.log(
                self.var_mib2 + epsilon_mib2)


class BoxBounds:
    """Per-(stage, n) bound tables of many layouts at once; `time_lb` and `corner` bound boxes, `tighten`
    shrinks them. Boxes of every layout are bounded together: a box is (a, b, layout) with a and b of P =
    the largest pp of the layouts; a layout with fewer stages is padded with stages fixed at n = 0 that
    cost nothing (time 0, tail 0, peak 0, GPU weight 0), so every bound of a padded box is that of the
    layout's own box (+ 0). Built from the layouts' StackedTables (memx.planner.tables) and their per-stage
    layer caps hi (layouts, P), vectorised over layouts."""

    def __init__(self, st: StackedTables, hi: np.ndarray, total: int, target_margin: float):
        self.total, self.layouts, self.P, self.rows = total, len(st.stages), st.pp, st.rows
        self.pp, self.weight = st.stages, st.gpu_weight
        self.micro_batches = st.micro_batches.astype(np.float64)
        self.virtual_stages = st.virtual_stages.astype(np.float64)
        self.fixed_ms = np.array(st.fixed_ms, dtype=np.float64)
        self.drain = st.drain  # (layouts,) bool or None: the tail bound is stage 0's (time_lb)
        P, rows = self.P, self.rows
        n = np.arange(rows)
        real = (np.arange(P)[None, :] < self.pp[:, None]).reshape(-1)[:, None]
        ok = real & (st.fit.reshape(-1, rows) >= 0) & (n >= 1) & (n <= np.asarray(hi).reshape(-1)[:, None])
        pad = ~real & (n == 0)  # a layout's missing stages: n = 0, costing nothing

        def per_row(x: np.ndarray, outside: float) -> np.ndarray:  # (layouts·P, rows)
            return np.where(ok, x.reshape(-1, rows), np.where(pad, 0.0, outside))

        ctx_cap = np.ones(len(st.ctx_fit))
        ctx_cap[st.ctx.reshape(-1)] = st.capacity.reshape(-1)  # a context's GPU: one capacity wherever it appears
        m_lo = lowest_reachable(st.ctx_peak_mib, st.ctx_length, st.ctx_fit, ctx_cap, target_margin)
        t1 = per_row(st.fit_time_ms.astype(np.float64), np.inf)
        self.lams = self._multipliers(t1)  # (layouts, Λ)
        # The tables hold each layout's real stages and one row for every missing stage (all alike: n = 0 costs 0;
        # issue #26: ~30 % of the rows were such copies); rows_of maps (layout, stage) to its row.
        keep, self.rowmap = _compact_rows(real[:, 0], st.capacity.reshape(-1), self.layouts, P)
        self.t1 = t1[keep]
        lo = per_row(m_lo.reshape(-1)[st.row_ctx], np.inf)[keep]
        used = lo / st.capacity.reshape(-1)[keep, None]
        self.ok = (ok | pad)[keep]
        idx = np.where(self.ok, n[None, :], rows)  # next / previous allowed layer count at or after / before n
        self.next_ok = np.ascontiguousarray(np.minimum.accumulate(idx[:, ::-1], axis=1)[:, ::-1])
        self.prev_ok = np.maximum.accumulate(np.where(self.ok, n[None, :], -1), axis=1)
        sums = self.t1[:, :, None] - np.repeat(self.lams, P, axis=0)[keep, None, :] * n[None, :, None]
        # the range-minimum channels in two tables, each query gathering only its own (issue #26: a time bound
        # read the memory channels too, a corner every λ's): tail, then t1 − λ·n per λ; m_lo, m_lo / capacity
        tail = per_row(st.tail_ms.astype(np.float64), np.inf)[keep]
        self.mins = RangeTable(np.concatenate([tail[..., None], sums], axis=2))
        self.mem_mins = RangeTable(np.stack([lo, used], axis=2))
        self.m1_max = RangeTable(per_row(st.fit_peak_mib.astype(np.float64), -np.inf)[keep], maximum=True)
        self.env_t, self.env_m, self.env_used = suffix_min(self.t1), suffix_min(lo), suffix_min(used)
        self.flat_t, self.flat_m, self.flat_used = flat_table(self.env_t), flat_table(self.env_m), flat_table(self.env_used)
        self.capacity = st.capacity  # (layouts, P) MiB
        self.high = None  # issue #22: (range min, suffix min) of the least reachable upper-bound peak / capacity
        if st.ctx_high_mib is not None:
            h = per_row(reachable_high(st.ctx_peak_mib, st.ctx_high_mib, st.ctx_fit, m_lo).reshape(-1)[st.row_ctx], np.inf)
            h_used = h[keep] / st.capacity.reshape(-1)[keep, None]
            self.high = (RangeTable(h_used), suffix_min(h_used))
            self.flat_high = flat_table(self.high[1])

    def _multipliers(self, t1: np.ndarray) -> np.ndarray:
        """Each layout's λs (lagrange_multipliers of its t1 rows (layouts·P, rows)), padded with 0."""
        t1 = t1.reshape(self.layouts, self.P, self.rows)
        fin = np.isfinite(t1) & (np.arange(self.rows) >= 1)
        first = np.where(fin.any(axis=2), fin.argmax(axis=2), 0)
        last = np.where(fin.any(axis=2), self.rows - 1 - fin[..., ::-1].argmax(axis=2), 0)
        take = lambda i: np.take_along_axis(t1, i[..., None], axis=2)[..., 0]  # noqa: E731
        with np.errstate(invalid="ignore", divide="ignore"):
            slope = (take(last) - take(first)) / (last - first)
        lams = _thin_many([[0.0, *slope[li, (last[li] > first[li])].tolist()] for li in range(self.layouts)])
        out = np.zeros((self.layouts, max(len(x) for x in lams)))
        for li, x in enumerate(lams):
            out[li, :len(x)] = x
        return out

    def rows_of(self, li: np.ndarray) -> np.ndarray:
        """(B, P) table rows of the boxes' stages."""
        return self.rowmap.take(li, axis=0)

    def root(self, li: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The root box of each layout in li (tightened; a layout without a split has none)."""
        r = self.rows_of(np.asarray(li, dtype=np.int64))
        return self.tighten(self.next_ok[r, 0], self.prev_ok[r, -1], np.asarray(li, dtype=np.int64))

    def tighten(self, a: np.ndarray, b: np.ndarray, li: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Shrink boxes to allowed end points consistent with Σ n = L; drop empty boxes."""
        a, b, kept = self._tightened(a, b, li)
        return a, b, li[kept]

    def _tightened(self, a: np.ndarray, b: np.ndarray, li: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`tighten`, with the indices of the boxes kept instead of their layouts."""
        L, last = self.total, self.rows - 1
        a, b = a.astype(np.int64), b.astype(np.int64)
        kept = np.arange(len(a))
        next_ok, prev_ok = self.next_ok.ravel(), self.prev_ok.ravel()  # flat takes: faster than [r, n]
        for _ in range(8):
            r = self.rows_of(li[kept]) * self.rows
            sa, sb = a.sum(axis=1, keepdims=True), b.sum(axis=1, keepdims=True)
            na = next_ok.take(r + np.minimum(np.maximum(a, L - (sb - b)), last))
            nb = prev_ok.take(r + np.maximum(np.minimum(b, L - (sa - a)), 0))
            keep = (na <= nb).all(axis=1)
            if keep.all() and (na == a).all() and (nb == b).all():
                break
            a, b, kept = na[keep], nb[keep], kept[keep]
        ok = (a.sum(axis=1) <= L) & (b.sum(axis=1) >= L)
        return a[ok], b[ok], kept[ok]

    def time_lb_above(self, a: np.ndarray, b: np.ndarray, li: np.ndarray, mu: np.ndarray) -> np.ndarray:
        """A lower bound of T over the plans of each box whose smallest margin (the floor's: upper-bound where
        the predictor gives intervals) is ≥ mu (per box); +inf where the box has none (`time_lb_cut`)."""
        return self.time_lb_cut(a, b, li, mu=mu)

    def time_lb_cut(self, a: np.ndarray, b: np.ndarray, li: np.ndarray, *, mu: np.ndarray | None = None,
                    peak_mib: np.ndarray | None = None) -> np.ndarray:
        """A lower bound of T over the plans of each box whose smallest margin (the floor's) is ≥ mu and whose
        largest peak M is ≤ peak_mib (per box; None: no such condition); +inf where the box has none (issue #26,
        docs/planner.md §Joint bounds). Every stage's final peak is ≥ its lowest reachable peak m_lo (the
        upper-bound one for the floor margin: `reachable_high`), so such a plan has, per stage,
        m_lo(s, n_s)/cap_s ≤ 1 − μ + err (err: the float32 margin's rounding, < MARGIN_SLACK) and
        m_lo(s, n_s) ≤ M ≤ peak_mib: n_s ≤ H_s, the largest count whose suffix minimum of m_lo/cap (of m_lo;
        non-decreasing in n, and ≤ the value at n_s) is below 1 − μ + MARGIN_SLACK (at most peak_mib·(1 + SLACK)):
        T is bounded on the box cut there (`time_lb`, whose bound holds for every plan of the cut box)."""
        out = np.full(len(a), np.inf)
        if len(a) == 0:
            return out
        r = self.rows_of(li)
        H = b
        if mu is not None:
            env = self.env_used if self.high is None else self.high[1]
            thr = 1.0 - np.asarray(mu, dtype=np.float64) + MARGIN_SLACK
            H = np.minimum(H, (env.take(r, axis=0) < thr[:, None, None]).sum(axis=2) - 1)  # (B, P): env non-decreasing in n
        if peak_mib is not None:
            thr = np.asarray(peak_mib, dtype=np.float64) * (1 + SLACK)
            H = np.minimum(H, (self.env_m.take(r, axis=0) < thr[:, None, None]).sum(axis=2) - 1)
        a2, b2, kept = self._tightened(a, H, li)
        out[kept] = self.time_lb(a2, b2, li[kept])
        return out

    @staticmethod
    def leaf_size(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """An upper bound of the splits in each box: Σ n = L fixes the widest stage once the others are set."""
        width = (b - a + 1).astype(np.float64)
        return width.prod(axis=1) / width.max(axis=1)

    def time_lb(self, a: np.ndarray, b: np.ndarray, li: np.ndarray) -> np.ndarray:
        """Lower bound of T over each box, deflated by SLACK."""
        r = self.rows_of(li)
        mins = self.mins.query_rows(r, a, b)  # (B, P, 1 + Λ)
        tmax = self._minmax(self.flat_t, r, a, b)
        tsum = (self.lams[li] * self.total + mins[:, :, 1:].sum(axis=1)).max(axis=1)  # max_lagrange_sum
        m, v = self.micro_batches[li], self.virtual_stages[li]
        with np.errstate(invalid="ignore"):  # pipeline_compute_ms per box: plain 1F1B, or interleaved (issue #27)
            compute = np.where(v == 1, (m - 1) * tmax + tsum, m * tmax + (tsum - tmax) / v)
        tail = mins[:, :, 0].max(axis=1)
        if self.drain is not None:  # cycle-mean-drain: max_s (tail_s − D_s) ≥ tail_0 (D_0 = 0; memx.planner.drain)
            tail = np.where(self.drain[li], mins[:, 0, 0], tail)
        T = compute + self.fixed_ms[li] + tail
        return T * (1 - SLACK)

    def corner(self, a: np.ndarray, b: np.ndarray, li: np.ndarray, time_lb: np.ndarray) -> Corner:
        r = self.rows_of(li)
        mins = self.mem_mins.query_rows(r, a, b)
        lo, used = mins[:, :, 0], mins[:, :, 1]
        hi = self.m1_max.query_rows(r, a, b)
        m_lb = np.maximum(lo.max(axis=1), self._minmax(self.flat_m, r, a, b))
        used_lb = np.maximum(used.max(axis=1), self._minmax(self.flat_used, r, a, b))
        return Corner(time_ms=time_lb, max_mib=m_lb * (1 - SLACK),
                      var_mib2=_safe_variance(box_variance_lb(lo, hi, self.weight[li]), hi),
                      margin_ub=1.0 - used_lb + MARGIN_SLACK, margin_high_ub=self.margin_high_ub(r, a, b),
                      stage_lo_mib=lo, stage_hi_mib=hi, weight=self.weight[li], capacity_mib=self.capacity[li],
                      time_cut=(lambda rows, mu=None, peak_mib=None: self.time_lb_cut(
                          a[rows], b[rows], li[rows], mu=mu, peak_mib=peak_mib)) if JOINT_TIME else None,
                      splits_ub=self.leaf_size(a, b))

    def margin_high_ub(self, r: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
        """An upper bound of each box's smallest upper-bound margin (issue #22), as margin_ub: a stage's final
        level lies between its fit and its lowest reachable level (m_lo), so its upper-bound peak is ≥ the
        least upper-bound peak over those levels (`reachable_high`). None without intervals."""
        if self.high is None:
            return None
        rng = self.high[0]
        return 1.0 - np.maximum(rng.query_rows(r, a, b).max(axis=1), self._minmax(self.flat_high, r, a, b)) + MARGIN_SLACK

    def _minmax(self, flat: np.ndarray, r: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """suffix_minmax over one of the flat suffix-minimum tables (`flat_table`)."""
        return flat_minmax(flat, self.rows, r, a, b, self.total)

    @staticmethod
    def table_bytes(layouts: int, pp: int, rows: int, multipliers: int = 5) -> int:
        """About the memory of the tables of `layouts` layouts of ≤ pp stages (sparse tables: ⌈log2 rows⌉ levels)."""
        levels = int(np.ceil(np.log2(max(rows, 2)))) + 1
        return layouts * pp * rows * 8 * (levels * (4 + multipliers) + 12)


class MinMax:
    """A lower bound of min over the box's splits (Σ n = L) of max_s x(s, n_s), exact when x(s, ·) is
    non-decreasing on the allowed counts: x is replaced by its suffix minimum x̂(s, n) = min_{n′ ≥ n} x(s, n′)
    (x̂ ≤ x, non-decreasing; interior counts that are not allowed are ignored: a relaxation) — the min-max
    stage partition of Alpa §5.2 / Sailor, as a bound on a box. With x̂ non-decreasing, the best split
    starts from n = a and adds the k = L − Σ a cheapest increments x̂(s, n), a_s < n ≤ b_s (each stage's in
    order, so any k smallest are a prefix per stage): the bound is max(max_s x̂(s, a_s), the k-th smallest
    increment) — one sort per box, vectorised over boxes (`suffix_minmax`)."""

    def __init__(self, x: np.ndarray):
        self.env = suffix_min(x)

    def query(self, a: np.ndarray, b: np.ndarray, total: int) -> np.ndarray:
        return suffix_minmax(self.env, np.arange(a.shape[1])[None, :], a, b, total)


def _compact_rows(real: np.ndarray, capacity: np.ndarray, layouts: int, P: int) -> tuple[np.ndarray, np.ndarray]:
    """(the (layout, stage) rows a BoxBounds table keeps, the (layouts, P) map to them): every real stage, and the
    first missing one standing for all (a missing stage's rows are alike: 0 at n = 0, else ±inf; its m_lo /
    capacity too when every such capacity is positive — else nothing is shared)."""
    pads = np.flatnonzero(~real)
    if len(pads) == 0 or not (capacity[pads] > 0).all():
        return np.arange(len(real)), np.arange(len(real)).reshape(layouts, P)
    keep = np.append(np.flatnonzero(real), pads[0])
    rowmap = np.full(len(real), len(keep) - 1)
    rowmap[keep[:-1]] = np.arange(len(keep) - 1)
    return keep, rowmap.reshape(layouts, P)


def suffix_min(x: np.ndarray) -> np.ndarray:
    """x̂(r, n) = min_{n′ ≥ n} x(r, n′) along the last axis."""
    return np.minimum.accumulate(x[..., ::-1], axis=-1)[..., ::-1]


def suffix_minmax(env: np.ndarray, r: np.ndarray, a: np.ndarray, b: np.ndarray, total: int) -> np.ndarray:
    """MinMax's bound for boxes [a, b] (B, P) over rows r (B, P) of env (a suffix minimum, `suffix_min`);
    +inf where no split reaches L within the box."""
    return flat_minmax(flat_table(env), env.shape[-1], r, a, b, total)


def flat_table(env: np.ndarray) -> np.ndarray:
    """env (rows, n) raveled with n × +inf after it: what flat_minmax reads (every count a box reaches past a row's
    end stays inside the array); in float32 when that holds every value exactly (the fitted times and peaks are
    float32 values: flat_minmax only selects entries, so its bounds are the same, and sorting halves the bytes)."""
    flat = np.concatenate([env.ravel(), np.full(env.shape[-1], np.inf)])
    narrow = flat.astype(np.float32)
    return narrow if np.array_equal(narrow, flat) else flat


def flat_minmax(flat: np.ndarray, cols: int, r: np.ndarray, a: np.ndarray, b: np.ndarray, total: int) -> np.ndarray:
    """suffix_minmax over `flat_table(env)` (env of `cols` columns): the increments gathered by one flat `take`,
    the counts beyond a box's end pointed at a +inf (issue #26: the 2-D fancy index and the mask were half of it)."""
    if len(a) == 0:
        return np.zeros(0)
    at = r * cols + a  # (B, P) flat index of env[r, a]
    out = flat.take(at).max(axis=1)
    k = total - a.sum(axis=1)
    width = int((b - a).max())
    if width > 0:
        step = np.arange(1, width + 1)
        idx = at[:, :, None] + step
        np.copyto(idx, len(flat) - 1, where=step > (b - a)[:, :, None])
        inc = np.sort(flat.take(idx.reshape(len(a), -1)), axis=1)
        kth = np.where(k <= inc.shape[1], inc[np.arange(len(a)), np.clip(k - 1, 0, inc.shape[1] - 1)], np.inf)
        out = np.where(k > 0, np.maximum(out, kth), out)
    else:
        out = np.where(k > 0, np.inf, out)
    return out.astype(np.float64, copy=False)  # entries of the table, selected: exact from float32


def _lagrange_tables(x: np.ndarray, n: np.ndarray) -> list[tuple[float, RangeTable]]:
    """Range-minimum tables of x(s, n) − λ·n for a few multipliers λ (`lagrange_multipliers`)."""
    return [(lam, RangeTable(x - lam * n[None, :])) for lam in lagrange_multipliers(x)]


def lagrange_multipliers(x: np.ndarray) -> list[float]:
    """0 and the stages' per-layer slopes (first to last finite entry of each row of x), thinned."""
    lams = [0.0]
    for row in x:
        f = np.nonzero(np.isfinite(row))[0]
        if len(f) >= 2:
            lams.append(float((row[f[-1]] - row[f[0]]) / (f[-1] - f[0])))
    return _thin(lams)


def _thin(lams: list[float]) -> list[float]:
    return _thin_many([lams])[0]


def _thin_many(many: list[list[float]]) -> list[list[float]]:
    """Each list of multipliers thinned (`_thin`); the quantiles of all lists of one length in one np.quantile
    call along axis 1 (the same elementwise interpolation as one list's: issue #26, 200 calls a search), by
    `medians.sorted_quantiles` (np.quantile's arithmetic on rows already sorted: `_spread` keeps them so)."""
    out = [_spread(lams) for lams in many]
    by_len: dict[int, list[int]] = {}
    for i, kept in enumerate(out):
        if len(kept) > 5:  # keep 0 and 4 spread quantiles
            by_len.setdefault(len(kept), []).append(i)
    for rows in by_len.values():
        q = sorted_quantiles(np.array([out[i] for i in rows]), np.linspace(0, 1, 4)).T.tolist()  # np.quantile's
        for i, qs in zip(rows, q):
            out[i] = sorted({0.0, *qs})
    return out


def _spread(lams: list[float]) -> list[float]:
    kept: list[float] = []
    for lam in sorted(lams):  # slopes within 2 % of one already tried add little: stages of one GPU type and tp
        if not kept or lam > kept[-1] + 0.02 * abs(kept[-1]) + 1e-9:
            kept.append(lam)
    return kept


def max_lagrange_sum(tables: list[tuple[float, RangeTable]], a: np.ndarray, b: np.ndarray, total: int) -> np.ndarray:
    """A lower bound of min over the box's splits of Σ_s x(s, n_s): for every λ, Σ_s x(s, n_s) =
    λ·L + Σ_s (x(s, n_s) − λ·n_s) ≥ λ·L + Σ_s min_{n ∈ [a_s, b_s]} (x(s, n) − λ·n) (Lagrangian relaxation of
    Σ n_s = L; exact for x linear in n between the multipliers tried). λ = 0 is the plain per-stage minimum."""
    out = np.full(len(a), -np.inf)
    for lam, rt in tables:
        out = np.maximum(out, lam * total + rt.query(a, b).sum(axis=1))
    return out


def box_variance_lb(lo: np.ndarray, hi: np.ndarray, w: np.ndarray) -> np.ndarray:
    """min over x_s ∈ [lo_s, hi_s] of Σ_s w_s (x_s − Σ w x)² (Σ w = 1), per row (w: (pp,) or (B, pp)).

    = min_c f(c), f(c) = Σ_s w_s·dist(c, [lo_s, hi_s])² — convex, with f′(c)/2 = g(c) = Σ_s w_s (c − clip(c))
    piecewise linear and non-decreasing between the 2·pp interval end points: the root is found on the
    end points and interpolated exactly on its segment. g at every end point in O(pp log pp) a row (issue #26:
    it was O(pp²), 15 % of the 405B deep search): with the end points sorted, g(c) = c·(A + B) − (S_A + S_B),
    A, S_A = Σ w, Σ w·hi over the upper ends ≤ c and B, S_B = Σ w, Σ w·lo over the lower ends > c (an end point
    equal to c adds 0 either way), running sums along the sorted order."""
    P = lo.shape[1]
    wb = np.broadcast_to(w, lo.shape)
    pts = np.concatenate([lo, hi], axis=1)  # (B, 2pp)
    order = np.argsort(pts, axis=1, kind="stable")
    srt = np.take_along_axis(pts, order, axis=1)
    upper = order >= P
    ww = np.take_along_axis(np.concatenate([wb, wb], axis=1), order, axis=1)
    run = lambda x: np.cumsum(x, axis=1)  # noqa: E731
    a_w, a_s = run(np.where(upper, ww, 0.0)), run(np.where(upper, ww * srt, 0.0))
    lo_w, lo_s = run(np.where(upper, 0.0, ww)), run(np.where(upper, 0.0, ww * srt))
    g = srt * (a_w + lo_w[:, -1:] - lo_w) - (a_s + lo_s[:, -1:] - lo_s)
    j = np.clip((g < 0).sum(axis=1), 1, 2 * P - 1)  # first end point with g ≥ 0 (g ends ≥ 0)
    rows = np.arange(len(pts))
    p0, p1, g0, g1 = srt[rows, j - 1], srt[rows, j], g[rows, j - 1], g[rows, j]
    step = np.where(g1 > g0, (p1 - p0) / np.where(g1 > g0, g1 - g0, 1.0), 0.0)
    root = np.where(g0 >= 0, p0, p0 - g0 * step)[:, None]
    d = root - np.minimum(np.maximum(root, lo), hi)
    return (wb * d * d).sum(axis=1)


def _safe_variance(v: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """V is computed in float32 (two-pass): its error is below ~1e−5 of the largest squared peak."""
    return np.maximum(v * (1 - SLACK) - 1e-5 * hi.max(axis=1) ** 2, 0.0)


def lowest_reachable(peak: np.ndarray, length: np.ndarray, fit: np.ndarray, cap: np.ndarray,
                     target_margin: float) -> np.ndarray:
    """(R, rows) peak of the first ladder level at or above the fit that is not tight — refinement moves a
    stage only while it is tight (recompute.refine), so it never goes below this — or the ladder top.
    peak (R, rows, K) float32 as the search evaluates it, length and fit (R, rows), cap (R,) MiB."""
    # Each (row, n) climbs on its own while its level is tight and below its ladder top: it stops at the first level
    # l ≥ max(fit, 0) that is not tight or is ≥ length − 1 — found for all at once (issue #26: the climb one level
    # per pass took up to K passes of gathers; the same levels).
    cap = np.asarray(cap, dtype=np.float64)[:, None, None]
    l = np.arange(peak.shape[2])
    tight = (cap - peak) / cap < target_margin  # the same test as recompute.refine
    stop = ~tight | (l >= (length - 1)[..., None])
    level = np.argmax(stop & (l >= np.maximum(fit, 0)[..., None]), axis=2)
    return np.take_along_axis(peak, level[..., None], axis=2)[..., 0].astype(np.float64)


def reachable_high(peak: np.ndarray, high: np.ndarray, fit: np.ndarray, m_lo: np.ndarray) -> np.ndarray:
    """(R, rows) least upper-bound peak (StageTable.high_mib) over the ladder levels refinement can end on:
    from the fit up to the lowest reachable level — the levels at or above the fit whose point peak is ≥
    `lowest_reachable`'s m_lo (a ladder's peaks fall strictly, padding repeats the top). peak, high (R, rows, K)."""
    level = np.arange(peak.shape[2])[None, None, :]
    reach = (level >= fit[:, :, None]) & (peak.astype(np.float64) >= m_lo[:, :, None])
    return np.where(reach, high.astype(np.float64), np.inf).min(axis=2)
