"""The kept (T, −margin, V) front's dominance tests (memx.planner.candidates.Keeper): pairwise, indexed
(`FrontIndex`, a 2-D prefix minimum) and the 3-D maxima sweep of a list of points."""

from __future__ import annotations

import bisect

import numpy as np


def dominated_by(f: np.ndarray, pts: np.ndarray) -> np.ndarray:
    """Rows of pts (N, 3) strictly dominated by a row of f (F, 3): ≤ in all three, < in one (all pairs)."""
    out = np.zeros(len(pts), dtype=bool)
    if len(f) == 0 or len(pts) == 0:
        return out
    step = max(1, (1 << 20) // len(f))
    fT, fM, fV = f[None, :, 0], f[None, :, 1], f[None, :, 2]
    for i in range(0, len(pts), step):
        t, m, v = pts[i:i + step, 0:1], pts[i:i + step, 1:2], pts[i:i + step, 2:3]
        le = (fT <= t) & (fM <= m) & (fV <= v)
        out[i:i + step] = (le & ((fT < t) | (fM < m) | (fV < v))).any(axis=1)
    return out


class FrontIndex:
    """Dominance queries against a fixed set of front points (T, M, V) in O(log F) a row: G[i, j] = the least V
    among points with T ≤ the i-th distinct T and M ≤ the j-th distinct M (a 2-D prefix minimum), so a row
    (t, m, v) is weakly dominated iff G at (t, m)'s ranks ≤ v, and strictly where that least V < v. Rows where
    it equals v (a point with equal V, possibly the row itself) are `unsure`: the caller checks them pair by pair."""

    MIN_POINTS = 24  # fewer front points: the pairwise test is as fast
    MAX_CELLS = 1 << 24  # 16 M cells (128 MiB): beyond, the front is indexed on a coarser T grid (still exact)

    def __init__(self, f: np.ndarray):
        self.t = np.unique(f[:, 0])
        self.m = np.unique(f[:, 1])
        if len(self.t) * len(self.m) > self.MAX_CELLS:  # T ranks rounded up to a grid: a row sees fewer points
            self.t = self.t[np.linspace(0, len(self.t) - 1, max(1, self.MAX_CELLS // len(self.m))).astype(np.int64)]
        g = np.full((len(self.t), len(self.m)), np.inf)
        i = np.searchsorted(self.t, f[:, 0], side="left")  # the first grid T ≥ the point's: seen from there on
        ok = i < len(self.t)
        np.minimum.at(g, (i[ok], np.searchsorted(self.m, f[ok, 1])), f[ok, 2])
        self.g = np.minimum.accumulate(np.minimum.accumulate(g, axis=0), axis=1)

    def least(self, t: np.ndarray, m: np.ndarray) -> np.ndarray:
        """The least V among points with T ≤ t and M ≤ m (+inf where none)."""
        i = np.searchsorted(self.t, t, side="right") - 1
        j = np.searchsorted(self.m, m, side="right") - 1
        return np.where((i >= 0) & (j >= 0), self.g[np.maximum(i, 0), np.maximum(j, 0)], np.inf)

    def dominated(self, pts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(strictly dominated, unsure) masks of rows of pts (N, 3)."""
        least = self.least(pts[:, 0], pts[:, 1])
        return least < pts[:, 2], least == pts[:, 2]


def front_point(time_ms, margin, var_mib2) -> list:
    """A plan's point on the kept front: (T, −margin, V), all minimised."""
    if np.ndim(margin):
        return [time_ms, -np.asarray(margin, dtype=np.float64), np.asarray(var_mib2, dtype=np.float64)]
    return [time_ms, -float(margin), float(var_mib2)]


def non_dominated(pts: np.ndarray) -> np.ndarray:
    """Mask of points no other point dominates in (T, M, V); of equal points the first is kept. Sweep in
    order of T, keeping a staircase of the (M, V) front of the points seen so far (Kung et al. 1975,
    3-D maxima)."""
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
