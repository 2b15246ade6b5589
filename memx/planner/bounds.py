"""Lower bounds on (T, M, V, log Φ) over a *box* of layer splits — every split with a_s ≤ n_s ≤ b_s and
Σ n_s = L — for the exact branch-and-bound search (docs/planner.md §Search; docs/architecture.md §Search).

Per stage s and layer count n the tables give the step-1 (fit) level's time t1 and peak m1 and the
DP tail (all-reduce + optimizer). Refinement (memx.planner.recompute, step 2) only moves a stage up
its ladder — time up, memory down — and only while that stage is tight (margin < target), so a
stage's final memory lies in [m_lo, m1], m_lo being the peak of the first level at or above the fit
that is not tight (or the top of the ladder), and its final time is ≥ t1. Hence for every split in a box:
* T ≥ (m − 1)·max(B*, MM) + SS + Σ 2·p2p + max_s min tail — T is non-decreasing in every stage time
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

from dataclasses import dataclass

import numpy as np

from memx.domain.specs import Weights
from memx.planner.interleave import pipeline_compute_ms
from memx.planner.tables import LayoutTables

SLACK = 1e-5  # relative: float32 totals of ≤ 64 stages are within ~64·2⁻²⁴ ≈ 4e−6 of exact arithmetic
SCORE_SLACK = 1e-4  # absolute, in log Φ (float32 log of values ≈ 10: error ≤ a few 1e−6)
MARGIN_SLACK = 1e-5  # absolute, on a margin in [0, 1) computed in float32 (error ≤ a few 1e−7)


class RangeTable:
    """Range minimum (or maximum) over n ∈ [a, b] per stage in O(1): a sparse table of 2^j windows."""

    def __init__(self, x: np.ndarray, *, maximum: bool = False):
        self.op = np.maximum if maximum else np.minimum
        fill = -np.inf if maximum else np.inf
        levels = [x]
        width = 1
        while 2 * width <= x.shape[1]:
            prev = levels[-1]
            nxt = np.full_like(prev, fill)
            nxt[:, : x.shape[1] - width] = self.op(prev[:, : x.shape[1] - width], prev[:, width:])
            levels.append(nxt)
            width *= 2
        self.levels = np.stack(levels)  # (J, pp, rows)

    def query(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """(B, pp) range extremum of stage s over [a[:, s], b[:, s]] (a ≤ b)."""
        j = np.floor(np.log2(np.maximum(b - a + 1, 1))).astype(np.int64)
        s = np.arange(a.shape[1])[None, :]
        return self.op(self.levels[j, s, a], self.levels[j, s, b - (1 << j) + 1])


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
    # Issue #22, the joint (margin, V) bound: each stage's peak interval over the box (B, pp), the layout's
    # GPU weights and capacities (pp,) — `variance_lb_above` bounds V among a box's plans of margin ≥ μ.
    stage_lo_mib: np.ndarray | None = None
    stage_hi_mib: np.ndarray | None = None
    weight: np.ndarray | None = None
    capacity_mib: np.ndarray | None = None

    def variance_lb_above(self, rows: np.ndarray, mu: np.ndarray) -> np.ndarray:
        """A lower bound of V over the plans of boxes `rows` whose smallest margin (point or upper-bound: the
        upper-bound peak is ≥ the point peak) is ≥ mu (per row): such a plan has every stage's peak ≤ (1 − μ)·cap
        (MARGIN_SLACK for float32), so V ≥ box_variance_lb over the intervals clipped there; +inf where a
        clipped interval is empty (no plan of the box has that margin). On mixed capacities a wide margin
        forces the small GPUs' peaks down while the large ones' stay above their lower ends: V grows."""
        lo, hi = self.stage_lo_mib[rows], self.stage_hi_mib[rows]
        top = (1.0 - np.asarray(mu, dtype=np.float64)[:, None] + MARGIN_SLACK) * self.capacity_mib[None, :]
        hi = np.minimum(hi, top)
        empty = (hi < lo).any(axis=1)
        hi = np.maximum(hi, lo)
        return np.where(empty, np.inf, _safe_variance(box_variance_lb(lo, hi, self.weight), hi))

    def score(self, w: Weights, epsilon_mib2: float) -> np.ndarray:
        with np.errstate(divide="ignore"):
            return w.w_time * np.log(self.time_ms) + w.w_mem * np.log(self.max_mib) + w.w_var * np.log(
                self.var_mib2 + epsilon_mib2)


class LayoutBounds:
    """Per-(stage, n) bound tables of one layout; `corner` bounds boxes, `tighten` shrinks them."""

    def __init__(self, lt: LayoutTables, hi: np.ndarray, total: int, target_margin: float):
        pp, rows = lt.pp, lt.rows
        n = np.arange(rows)
        fit = lt.fit.reshape(pp, rows)
        self.total, self.pp, self.rows = total, pp, rows
        self.ok = (fit >= 0) & (n[None, :] >= 1) & (n[None, :] <= np.asarray(hi)[:, None])
        self.t1 = np.where(self.ok, lt.fit_time_ms.reshape(pp, rows).astype(np.float64), np.inf)
        self.tail = np.where(self.ok, lt.tail_ms.reshape(pp, rows).astype(np.float64), np.inf)
        self.t_range, self.tail_range = RangeTable(self.t1), RangeTable(self.tail)
        self.micro_batches, self.fixed_ms = lt.micro_batches, lt.fixed_ms
        self.virtual_stages = lt.pipeline.virtual_stages
        self.weight = lt.gpu_weight / lt.gpu_weight.sum()
        # next / previous allowed layer count at or after / before n (rows = none).
        idx = np.where(self.ok, n[None, :], rows)
        self.next_ok = np.minimum.accumulate(idx[:, ::-1], axis=1)[:, ::-1]
        idx = np.where(self.ok, n[None, :], -1)
        self.prev_ok = np.maximum.accumulate(idx, axis=1)
        self.bottleneck_ms = _min_bottleneck(self.t1, total)
        self.t_minmax = MinMax(self.t1)
        self.t_sums = _lagrange_tables(self.t1, n)
        self._tables, self._target = lt, target_margin
        self._memory: tuple[RangeTable, RangeTable] | None = None
        self._m_minmax: MinMax | None = None
        self._used: tuple[RangeTable, MinMax] | None = None  # m_lo / capacity: range min and min-max
        self._high_used: tuple[RangeTable, MinMax] | None = None  # the same for the upper-bound peaks (issue #22)

    def memory_ranges(self) -> tuple[RangeTable, RangeTable]:
        """(range min of the lowest reachable peak, range max of the fitted peak), built on first use."""
        if self._memory is None:
            lt = self._tables
            m1 = np.where(self.ok, lt.fit_peak_mib.reshape(self.pp, self.rows).astype(np.float64), -np.inf)
            m_lo = np.where(self.ok, _lowest_reachable_mib(lt, self._target), np.inf)
            self._memory = (RangeTable(m_lo), RangeTable(m1, maximum=True))
            self._m_minmax = MinMax(m_lo)
            used = m_lo / lt.capacity_mib.astype(np.float64)[:, None]
            self._used = (RangeTable(used), MinMax(used))
        return self._memory

    def root(self) -> tuple[np.ndarray, np.ndarray]:
        a = self.next_ok[:, 0][None, :].astype(np.int64)
        b = self.prev_ok[:, -1][None, :].astype(np.int64)
        return self.tighten(a, b)

    def tighten(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Shrink boxes to allowed end points consistent with Σ n = L; drop empty boxes."""
        L, last = self.total, self.rows - 1
        s = np.arange(self.pp)[None, :]
        for _ in range(8):
            sa, sb = a.sum(axis=1, keepdims=True), b.sum(axis=1, keepdims=True)
            na = self.next_ok[s, np.minimum(np.maximum(a, L - (sb - b)), last)]
            nb = self.prev_ok[s, np.maximum(np.minimum(b, L - (sa - a)), 0)]
            keep = (na <= nb).all(axis=1)
            if keep.all() and (na == a).all() and (nb == b).all():
                break
            a, b = na[keep].astype(np.int64), nb[keep].astype(np.int64)
        sa, sb = a.sum(axis=1), b.sum(axis=1)
        ok = (sa <= L) & (sb >= L)
        return a[ok], b[ok]

    def leaf_size(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """An upper bound of the splits in each box: Σ n = L fixes the widest stage once the others are set."""
        width = (b - a + 1).astype(np.float64)
        return width.prod(axis=1) / width.max(axis=1)

    def time_lb(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Lower bound of T over each box, deflated by SLACK."""
        tmax = np.maximum(self.t_minmax.query(a, b, self.total), self.bottleneck_ms)
        tsum = max_lagrange_sum(self.t_sums, a, b, self.total)
        T = pipeline_compute_ms(tmax, tsum, self.micro_batches, self.virtual_stages) + self.fixed_ms \
            + self.tail_range.query(a, b).max(axis=1)  # interleaved 1F1B too (issue #27)
        return T * (1 - SLACK)

    def corner(self, a: np.ndarray, b: np.ndarray, time_lb: np.ndarray) -> Corner:
        lo_range, hi_range = self.memory_ranges()
        lo, hi = lo_range.query(a, b), hi_range.query(a, b)
        m_lb = np.maximum(lo.max(axis=1), self._m_minmax.query(a, b, self.total))
        used_range, used_minmax = self._used
        used_lb = np.maximum(used_range.query(a, b).max(axis=1), used_minmax.query(a, b, self.total))
        return Corner(time_ms=time_lb, max_mib=m_lb * (1 - SLACK),
                      var_mib2=_safe_variance(box_variance_lb(lo, hi, self.weight), hi),
                      margin_ub=1.0 - used_lb + MARGIN_SLACK, margin_high_ub=self.margin_high_ub(a, b),
                      stage_lo_mib=lo, stage_hi_mib=hi, weight=self.weight,
                      capacity_mib=self._tables.capacity_mib.astype(np.float64))

    def margin_high_ub(self, a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
        """An upper bound of each box's smallest upper-bound margin (issue #22), as margin_ub: a stage's final
        level lies between its fit and its lowest reachable level (m_lo), so its upper-bound peak is ≥ the
        least high_mib over those levels (`_reachable_high_mib`). None without intervals."""
        if self._tables.high_mib is None:
            return None
        if self._high_used is None:
            used = _reachable_high_mib(self._tables, self._target, self.ok) / self._tables.capacity_mib.astype(
                np.float64)[:, None]
            self._high_used = (RangeTable(used), MinMax(used))
        rng, minmax = self._high_used
        return 1.0 - np.maximum(rng.query(a, b).max(axis=1), minmax.query(a, b, self.total)) + MARGIN_SLACK

    def count(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Splits in each box (float64; interior layer counts that are not allowed included)."""
        L = self.total
        dp = np.zeros((len(a), L + 1))
        dp[:, 0] = 1.0
        r = np.arange(L + 1)[None, :]
        rows = np.arange(len(a))[:, None]
        c = np.zeros((len(a), L + 2))
        for s in range(self.pp):
            np.cumsum(dp, axis=1, out=c[:, 1:])  # c[:, j] = Σ dp[:, <j]
            hi_idx = np.clip(r - a[:, s:s + 1] + 1, 0, L + 1)
            lo_idx = np.clip(r - b[:, s:s + 1], 0, L + 1)
            dp = c[rows, hi_idx] - c[rows, lo_idx]
        return dp[:, L]


class MinMax:
    """A lower bound of min over the box's splits (Σ n = L) of max_s x(s, n_s), exact when x(s, ·) is
    non-decreasing on the allowed counts: x is replaced by its suffix minimum x̂(s, n) = min_{n′ ≥ n} x(s, n′)
    (x̂ ≤ x, non-decreasing), so max_s x̂ ≤ B ⇔ n_s ≤ H_s(B); some split of the box has max_s x̂ ≤ B iff
    H_s(B) ≥ a_s for all s and Σ_s min(H_s(B), b_s) ≥ L (interior counts that are not allowed are
    ignored: a relaxation). The smallest such B among the values of x̂ by bisection, vectorised over boxes
    (the min-max stage partition of Alpa §5.2 / Sailor, as a bound on a box)."""

    def __init__(self, x: np.ndarray):
        env = np.minimum.accumulate(x[:, ::-1], axis=1)[:, ::-1]
        self.cand = np.unique(env[np.isfinite(env)])
        # H[s, c] = the largest n with env[s, n] ≤ cand[c] (−1 when none)
        self.H = np.stack([np.searchsorted(env[s], self.cand, side="right") - 1 for s in range(x.shape[0])])

    def query(self, a: np.ndarray, b: np.ndarray, total: int) -> np.ndarray:
        C = len(self.cand)
        if C == 0:
            return np.full(len(a), np.inf)
        lo, hi = np.zeros(len(a), dtype=np.int64), np.full(len(a), C - 1, dtype=np.int64)
        s = np.arange(a.shape[1])[None, :]
        while (lo < hi).any():
            mid = (lo + hi) // 2
            h = np.minimum(self.H[s, mid[:, None]], b)
            ok = (h >= a).all(axis=1) & (h.sum(axis=1) >= total)
            hi, lo = np.where(ok, mid, hi), np.where(ok, lo, mid + 1)
        h = np.minimum(self.H[s, lo[:, None]], b)
        ok = (h >= a).all(axis=1) & (h.sum(axis=1) >= total)
        return np.where(ok, self.cand[lo], np.inf)


def _lagrange_tables(x: np.ndarray, n: np.ndarray) -> list[tuple[float, RangeTable]]:
    """Range-minimum tables of x(s, n) − λ·n for a few multipliers λ: 0 and the stages' per-layer slopes."""
    lams = [0.0]
    for row in x:
        f = np.nonzero(np.isfinite(row))[0]
        if len(f) >= 2:
            lams.append(float((row[f[-1]] - row[f[0]]) / (f[-1] - f[0])))
    kept: list[float] = []
    for lam in sorted(lams):  # slopes within 2 % of one already tried add little: stages of one GPU type and tp
        if not kept or lam > kept[-1] + 0.02 * abs(kept[-1]) + 1e-9:
            kept.append(lam)
    if len(kept) > 5:  # keep 0 and 4 spread quantiles
        kept = sorted({0.0, *np.quantile(kept, np.linspace(0, 1, 4)).tolist()})
    lams = kept
    return [(lam, RangeTable(x - lam * n[None, :])) for lam in lams]


def max_lagrange_sum(tables: list[tuple[float, RangeTable]], a: np.ndarray, b: np.ndarray, total: int) -> np.ndarray:
    """A lower bound of min over the box's splits of Σ_s x(s, n_s): for every λ, Σ_s x(s, n_s) =
    λ·L + Σ_s (x(s, n_s) − λ·n_s) ≥ λ·L + Σ_s min_{n ∈ [a_s, b_s]} (x(s, n) − λ·n) (Lagrangian relaxation of
    Σ n_s = L; exact for x linear in n between the multipliers tried). λ = 0 is the plain per-stage minimum."""
    out = np.full(len(a), -np.inf)
    for lam, rt in tables:
        out = np.maximum(out, lam * total + rt.query(a, b).sum(axis=1))
    return out


def box_variance_lb(lo: np.ndarray, hi: np.ndarray, w: np.ndarray) -> np.ndarray:
    """min over x_s ∈ [lo_s, hi_s] of Σ_s w_s (x_s − Σ w x)² (Σ w = 1), per row.

    = min_c f(c), f(c) = Σ_s w_s·dist(c, [lo_s, hi_s])² — convex, with f′(c)/2 = Σ_s w_s (c − clip(c))
    piecewise linear and non-decreasing between the 2·pp interval end points: the root is found on the
    end points and interpolated exactly on its segment."""
    pts = np.sort(np.concatenate([lo, hi], axis=1), axis=1)  # (B, 2pp)
    c = pts[:, :, None]
    g = (w * (c - np.minimum(np.maximum(c, lo[:, None, :]), hi[:, None, :]))).sum(axis=2)  # (B, 2pp)
    j = np.clip((g < 0).sum(axis=1), 1, pts.shape[1] - 1)  # first end point with g ≥ 0 (g ends ≥ 0)
    rows = np.arange(len(pts))
    p0, p1, g0, g1 = pts[rows, j - 1], pts[rows, j], g[rows, j - 1], g[rows, j]
    step = np.where(g1 > g0, (p1 - p0) / np.where(g1 > g0, g1 - g0, 1.0), 0.0)
    root = np.where(g0 >= 0, p0, p0 - g0 * step)[:, None]
    d = root - np.minimum(np.maximum(root, lo), hi)
    return (w * d * d).sum(axis=1)


def _safe_variance(v: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """V is computed in float32 (two-pass): its error is below ~1e−5 of the largest squared peak."""
    return np.maximum(v * (1 - SLACK) - 1e-5 * hi.max(axis=1) ** 2, 0.0)


def _lowest_reachable_mib(lt: LayoutTables, target_margin: float) -> np.ndarray:
    """(pp, rows) peak of the first ladder level at or above the fit that is not tight — refinement moves a
    stage only while it is tight (recompute.refine), so it never goes below this — or the ladder top."""
    pp, rows, k = lt.pp, lt.rows, lt.k
    peak = lt.peak_mib.reshape(pp, rows, k)
    length = lt.length.reshape(pp, rows)
    level = np.maximum(lt.fit.reshape(pp, rows), 0).astype(np.int64)
    cap = lt.capacity_mib[:, None]
    s_idx, n_idx = np.meshgrid(np.arange(pp), np.arange(rows), indexing="ij")
    for _ in range(k):
        cur = peak[s_idx, n_idx, level]
        tight = (cap - cur) / cap < target_margin  # the same test as recompute.refine
        move = tight & (level < length - 1)
        if not move.any():
            break
        level = level + move
    return peak[s_idx, n_idx, level].astype(np.float64)


def _reachable_high_mib(lt: LayoutTables, target_margin: float, ok: np.ndarray) -> np.ndarray:
    """(pp, rows) least upper-bound peak (LayoutTables.high_mib) over the ladder levels refinement can end on:
    from the fit up to the lowest reachable level — the levels at or above the fit whose point peak is ≥
    `_lowest_reachable_mib`'s (a ladder's peaks fall strictly, padding repeats the top); +inf where not ok."""
    pp, rows, k = lt.pp, lt.rows, lt.k
    peak = lt.peak_mib.reshape(pp, rows, k).astype(np.float64)
    high = lt.high_mib.reshape(pp, rows, k).astype(np.float64)
    m_lo = _lowest_reachable_mib(lt, target_margin)
    level = np.arange(k)[None, None, :]
    reach = (level >= lt.fit.reshape(pp, rows)[:, :, None]) & (peak >= m_lo[:, :, None])
    least = np.where(reach, high, np.inf).min(axis=2)
    return np.where(ok, least, np.inf)


def _min_bottleneck(t1: np.ndarray, total: int) -> float:
    """A lower bound on min over splits of max_s t1: the smallest B with Σ_s max{n : t1(s, n) ≤ B} ≥ L."""
    n = np.arange(t1.shape[1])
    cand = np.unique(t1[np.isfinite(t1)])
    if cand.size == 0:
        return np.inf

    def capacity(bound: float) -> int:
        return int(np.where(t1 <= bound, n[None, :], 0).max(axis=1).sum())

    lo, hi = 0, cand.size - 1
    if capacity(cand[hi]) < total:
        return float(cand[hi])
    while lo < hi:
        mid = (lo + hi) // 2
        if capacity(cand[mid]) >= total:
            hi = mid
        else:
            lo = mid + 1
    return float(cand[lo])
