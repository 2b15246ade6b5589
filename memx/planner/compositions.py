"""Counting and uniform sampling of layer splits whose per-stage layer counts come from allowed sets.

A split of L layers into pp stages is a composition n_0 + … + n_{pp−1} = L; stage s may take n
layers when allowed[s, n]. The number of such splits is the coefficient of x^L in
Π_s (Σ_n allowed[s, n]·x^n) (generating functions; Stanley, Enumerative Combinatorics I, §1.2), and
the suffix products give the conditional counts that sample a split uniformly, stage by stage.
"""

from __future__ import annotations

import math

import numpy as np

INT64_SAFE = 1 << 62


def count_splits(total: int, allowed: np.ndarray) -> int:
    """Exact number of splits of `total` layers with allowed[s, n] for every stage (allowed: (pp, total+1))."""
    pp = allowed.shape[0]
    if pp == 0:
        return 0
    exact_int64 = math.comb(total - 1, pp - 1) < INT64_SAFE if total >= pp else True
    poly: np.ndarray = np.zeros(total + 1, dtype=np.int64 if exact_int64 else object)
    poly[0] = 1
    for s in range(pp):
        row = allowed[s, : total + 1].astype(poly.dtype)
        poly = _truncated_product(poly, row, total)
    return int(poly[total])


def count_splits_many(total: int, allowed: list[np.ndarray]) -> list[int]:
    """count_splits of many layouts at once (the same exact integers): the int64 products of all layouts
    whose counts cannot overflow are formed together, one shifted add per (stage, n); the others one by one."""
    safe = [i for i, ok in enumerate(allowed)
            if ok.shape[0] > 0 and (total < ok.shape[0] or math.comb(total - 1, ok.shape[0] - 1) < INT64_SAFE)]
    out = [0] * len(allowed)
    for i in set(range(len(allowed))) - set(safe):
        out[i] = count_splits(total, allowed[i])
    if not safe:
        return out
    pp = np.array([allowed[i].shape[0] for i in safe])
    rows = np.zeros((len(safe), pp.max(), total + 1), dtype=np.int64)
    for r, i in enumerate(safe):
        width = min(allowed[i].shape[1], total + 1)
        rows[r, :pp[r], :width] = allowed[i][:, :width]
        rows[r, pp[r]:, 0] = 1  # a missing stage takes 0 layers: multiplies by 1
    poly = np.zeros((len(safe), total + 1), dtype=np.int64)
    poly[:, 0] = 1
    for s in range(pp.max()):
        nxt = np.zeros_like(poly)
        for n in np.nonzero(rows[:, s].any(axis=0))[0]:
            nxt[:, n:] += poly[:, : total + 1 - n] * rows[:, s, n:n + 1]
        poly = nxt
    for r, i in enumerate(safe):
        out[i] = int(poly[r, total])
    return out


def _truncated_product(a: np.ndarray, b: np.ndarray, total: int) -> np.ndarray:
    if a.dtype == object:
        out = np.zeros(total + 1, dtype=object)
        for n in np.nonzero(b)[0]:
            out[n:] = out[n:] + a[: total + 1 - n] * b[n]
        return out
    return np.convolve(a, b)[: total + 1]


def suffix_counts(total: int, allowed: np.ndarray) -> np.ndarray:
    """(pp+1, total+1) float64: [s, R] = splits of R layers over stages s..pp−1 (row pp: only R = 0)."""
    pp = allowed.shape[0]
    out = np.zeros((pp + 1, total + 1))
    out[pp, 0] = 1.0
    for s in range(pp - 1, -1, -1):
        out[s] = np.convolve(allowed[s, : total + 1].astype(np.float64), out[s + 1])[: total + 1]
    return out


def sample_splits(total: int, allowed: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """n splits drawn uniformly (with replacement) from the allowed splits: (n, pp) int16.

    Stage s draws its layer count with probability ∝ allowed[s, k]·count(stages s+1.., R − k), vectorised
    over the draws sharing a remaining count R. Counts are float64, so the draw is uniform up to float
    rounding (relative 1e−16); a draw that rounding sends to an impossible value is dropped."""
    pp = allowed.shape[0]
    suffix = suffix_counts(total, allowed)
    if n <= 0 or suffix[0, total] <= 0:
        return np.zeros((0, pp), dtype=np.int16)
    left = np.full(n, total, dtype=np.int64)
    out = np.empty((n, pp), dtype=np.int16)
    k = np.arange(total + 1)
    valid = np.ones(n, dtype=bool)
    for s in range(pp):
        rs, inv = _unique_small(left, total)
        rest = rs[:, None] - k[None, :]
        w = np.where(rest >= 0, suffix[s + 1][np.clip(rest, 0, total)], 0.0) * allowed[s, : total + 1][None, :]
        cw = np.cumsum(w, axis=1)
        tot = cw[:, -1:]
        cw = cw / np.where(tot > 0, tot, 1.0)
        flat = (cw + np.arange(len(rs))[:, None]).ravel()
        pos = np.searchsorted(flat, inv + rng.random(n), side="right") - inv * (total + 1)
        pos = np.clip(pos, 0, total)
        valid &= allowed[s, pos] & (pos <= left)
        out[:, s] = pos
        left = np.maximum(left - pos, 0)
    valid &= left == 0
    return out[valid]


def _unique_small(values: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(values, return_inverse=True) for integers in 0..top, in O(n + top) (no sort)."""
    present = np.bincount(values, minlength=top + 1) > 0
    rank = np.cumsum(present) - 1
    return np.flatnonzero(present), rank[values]
