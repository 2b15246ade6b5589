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
    """n splits drawn uniformly (with replacement) from the allowed splits: (n, pp) int16 (`sample_many`)."""
    return sample_many(total, [allowed], [n], rng)[0]


def sample_many(total: int, allowed: list[np.ndarray], n: list[int], rng: np.random.Generator,
                suffix: list[np.ndarray] | None = None) -> list[np.ndarray]:
    """n[l] splits drawn uniformly (with replacement) from each layout's allowed splits (allowed[l]: (pp_l,
    total+1)), all layouts at once: a list of (≤ n[l], pp_l) int16 arrays. `suffix`: their suffix_counts.

    Stage s draws its layer count with probability ∝ allowed[s, k]·count(stages s+1.., R − k): the inverse
    of the cumulative weights of its remaining count R at a uniform u. Counts are float64, so the draw is
    uniform up to float rounding (relative 1e−16); a draw that rounding sends to an impossible value is
    dropped. The uniforms are taken layout by layout, stage by stage (n[l] per stage), and each layout's
    inverse is one search in the sorted array of its rows offset by their rank j (cw + j, at j + u): the
    same draws whether one layout or many are sampled; the weights of all layouts are formed together."""
    suffix = suffix if suffix is not None else [suffix_counts(total, ok) for ok in allowed]
    live = [li for li, (m, suf) in enumerate(zip(n, suffix)) if m > 0 and suf[0, total] > 0]
    out = [np.zeros((0, ok.shape[0]), dtype=np.int16) for ok in allowed]
    if not live:
        return out
    pp = np.array([allowed[li].shape[0] for li in live])
    P, T = int(pp.max()), total + 1
    counts = np.array([n[li] for li in live])
    uniform = rng.random(int((counts * pp).sum()))
    # draw d of layout l at stage s: uniform[start_l + s·n_l + d]
    start = np.concatenate([[0], np.cumsum(counts * pp)[:-1]])
    owner = np.repeat(np.arange(len(live)), counts)
    draw = np.arange(len(owner)) - np.repeat(np.cumsum(counts) - counts, counts)
    suf = np.zeros((len(live), P + 1, T))
    ok = np.zeros((len(live), P, T))
    for r, li in enumerate(live):
        suf[r, :pp[r] + 1] = suffix[li]
        ok[r, :pp[r]] = allowed[li][:, :T]
    left = np.full(len(owner), total, dtype=np.int64)
    res = np.zeros((len(owner), P), dtype=np.int16)
    valid = np.ones(len(owner), dtype=bool)
    k = np.arange(T)
    for s in range(P):
        at = np.nonzero(pp[owner] > s)[0]
        key = owner[at] * T + left[at]
        keys, inv = _unique_small(key, len(live) * T - 1)
        kl, kr = keys // T, keys % T
        first = np.searchsorted(kl, kl, side="left")  # each layout's rows: j = rank among its remaining counts
        j = (np.arange(len(keys)) - first).astype(np.float64)
        rest = kr[:, None] - k[None, :]
        w = np.where(rest >= 0, suf[kl, s + 1][np.arange(len(keys))[:, None], np.clip(rest, 0, total)], 0.0) * ok[kl, s]
        cw = np.cumsum(w, axis=1)
        tot = cw[:, -1:]
        cw = cw / np.where(tot > 0, tot, 1.0)
        e = cw + j[:, None]
        q = j[inv] + uniform[start[owner[at]] + s * counts[owner[at]] + draw[at]]
        pos = np.empty(len(at), dtype=np.int64)
        here = np.unique(kl)
        row_lo, row_hi = np.searchsorted(kl, here), np.searchsorted(kl, here, side="right")
        draw_lo, draw_hi = np.searchsorted(owner[at], here), np.searchsorted(owner[at], here, side="right")
        for rl, rh, dl, dh in zip(row_lo, row_hi, draw_lo, draw_hi):  # one sorted array per layout, as alone
            pos[dl:dh] = np.searchsorted(e[rl:rh].ravel(), q[dl:dh], side="right") - (inv[dl:dh] - rl) * T
        pos = np.clip(pos, 0, total)
        valid[at] &= ok[owner[at], s, pos].astype(bool) & (pos <= left[at])
        res[at, s] = pos
        left[at] = np.maximum(left[at] - pos, 0)
    valid &= left == 0
    ends = np.cumsum(counts)  # owner is sorted: each layout's draws are one run
    for r, li in enumerate(live):
        lo = ends[r] - counts[r]
        out[li] = res[lo:ends[r]][valid[lo:ends[r]], :pp[r]]
    return out


def _unique_small(values: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(values, return_inverse=True) for integers in 0..top, in O(n + top) (no sort)."""
    present = np.bincount(values, minlength=top + 1) > 0
    rank = np.cumsum(present) - 1
    return np.flatnonzero(present), rank[values]
