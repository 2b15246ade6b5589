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
FLOAT64_EXACT = 1 << 53  # integers below this add exactly in float64
DRAW_CHUNK = 1 << 14  # draws of sample_many worked through at once (whole layouts)


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


def suffix_counts_many(total: int, allowed: list[np.ndarray]) -> list[np.ndarray]:
    """suffix_counts of many layouts, the same values: the layouts whose counts are below 2^53 (at most
    C(total + pp, pp), every composition of ≤ total layers over pp stages, zeros allowed) formed together — one
    shifted add per (stage from the end, n) over all of them, every partial sum an integer below 2^53 and so
    exact in float64 in any order, as np.convolve's; the others one by one."""
    out: list[np.ndarray | None] = [None] * len(allowed)
    safe = [i for i, ok in enumerate(allowed) if math.comb(total + ok.shape[0], ok.shape[0]) < FLOAT64_EXACT]
    for i in set(range(len(allowed))) - set(safe):
        out[i] = suffix_counts(total, allowed[i])
    if safe:
        T = total + 1
        pp = np.array([allowed[i].shape[0] for i in safe])
        rev = np.zeros((len(safe), int(pp.max()), T))  # [l, t]: stage pp_l − 1 − t of layout l (0 past its stages)
        for r, i in enumerate(safe):
            width = min(allowed[i].shape[1], T)
            rev[r, :pp[r], :width] = allowed[i][::-1, :width]
        acc = np.zeros((len(safe), int(pp.max()) + 1, T))  # [l, t]: splits over the last t stages
        acc[:, 0, 0] = 1.0
        for t in range(int(pp.max())):
            for n in np.nonzero(rev[:, t].any(axis=0))[0]:
                acc[:, t + 1, n:] += acc[:, t, :T - n] * rev[:, t, n:n + 1]
        for r, i in enumerate(safe):
            out[i] = acc[r, pp[r]::-1].copy()  # row s: the last pp_l − s stages
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
    same draws whether one layout or many are sampled; the weights of all layouts are formed together. The
    search runs row by row (`upper_bound_rows`) with the same result: every entry of the layout's earlier rows
    is ≤ j ≤ j + u, every entry of its later rows ≥ j + 1 > j + u, and where j + u rounds up to j + 1 the draw
    counts its whole row (> total) and is clipped to total either way."""
    suffix = suffix if suffix is not None else [suffix_counts(total, ok) for ok in allowed]
    live = [li for li, (m, suf) in enumerate(zip(n, suffix)) if m > 0 and suf[0, total] > 0]
    out = [np.zeros((0, ok.shape[0]), dtype=np.int16) for ok in allowed]
    if not live:
        return out
    pp = np.array([allowed[li].shape[0] for li in live])
    counts = np.array([n[li] for li in live])
    uniform = rng.random(int((counts * pp).sum()))
    start = np.concatenate([[0], np.cumsum(counts * pp)[:-1]])  # draw d of layout l at stage s: uniform[start_l + s·n_l + d]
    # The layouts are worked through with the most stages first, so the draws still open at stage s are a prefix;
    # in groups of consecutive layouts of about DRAW_CHUNK draws (a layout's draws in one group: each draw's rank j
    # and row are its layout's alone, so the same draws; issue #26: the temporaries of a group stay in cache).
    order = np.argsort(-pp, kind="stable")
    live, pp, counts, start = [live[i] for i in order], pp[order], counts[order], start[order]
    group = np.cumsum(counts) // DRAW_CHUNK
    cuts = np.flatnonzero(np.r_[True, group[1:] != group[:-1], True])
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        res, valid = _draw_group(total, [suffix[li] for li in live[lo:hi]], [allowed[li] for li in live[lo:hi]],
                                 pp[lo:hi], counts[lo:hi], start[lo:hi], uniform)
        first_draw = np.cumsum(counts[lo:hi]) - counts[lo:hi]
        for r, li in enumerate(live[lo:hi]):
            a, b = first_draw[r], first_draw[r] + counts[lo + r]
            out[li] = res[a:b][valid[a:b], :pp[lo + r]]
    return out


def _draw_group(total: int, suffix: list[np.ndarray], allowed: list[np.ndarray], pp: np.ndarray, counts: np.ndarray,
                start: np.ndarray, uniform: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`sample_many`'s draws of a group of layouts (most stages first): (splits (N, P), whether each is valid)."""
    P, T = int(pp.max()), total + 1
    owner = np.repeat(np.arange(len(pp)), counts)
    first_draw = np.cumsum(counts) - counts
    u_at = np.repeat(start, counts) + (np.arange(len(owner)) - np.repeat(first_draw, counts))
    u_step = np.repeat(counts, counts)
    open_at = [int(counts[pp > s].sum()) for s in range(P)]
    suf = np.zeros((len(pp), P + 1, T))
    ok = np.zeros((len(pp), P, T))
    for r in range(len(pp)):
        suf[r, :pp[r] + 1] = suffix[r]
        ok[r, :pp[r]] = allowed[r][:, :T]
    allowed_flat = ok.astype(bool).ravel()  # [(layout · P + s) · T + n]
    left = np.full(len(owner), total, dtype=np.int64)
    res = np.zeros((len(owner), P), dtype=np.int16)
    valid = np.ones(len(owner), dtype=bool)
    k = np.arange(T)
    for s in range(P):
        m = open_at[s]
        own, rem = owner[:m], left[:m]
        keys, inv = _unique_small(own * T + rem, len(pp) * T - 1)
        kl, kr = keys // T, keys % T
        first = np.searchsorted(kl, kl, side="left")  # each layout's rows: j = rank among its remaining counts
        j = (np.arange(len(keys)) - first).astype(np.float64)
        rest = kr[:, None] - k[None, :]
        # flat takes (issue #26: numpy's take is 2–3× its fancy index on these gathers; the same entries)
        nxt = suf[:, s + 1].take(kl, axis=0).ravel().take(np.arange(len(keys))[:, None] * T + np.clip(rest, 0, total))
        w = np.where(rest >= 0, nxt, 0.0) * ok[:, s].take(kl, axis=0)
        cw = np.cumsum(w, axis=1)
        tot = cw[:, -1:]
        cw = cw / np.where(tot > 0, tot, 1.0)
        e = cw + j[:, None]
        q = j.take(inv) + uniform.take(u_at[:m] + s * u_step[:m])
        pos = np.minimum(upper_bound_rows(e, inv, q), total)
        valid[:m] &= allowed_flat.take((own * P + s) * T + pos) & (pos <= rem)
        res[:m, s] = pos
        left[:m] = np.maximum(rem - pos, 0)
    return res, valid & (left == 0)


def upper_bound_rows(e: np.ndarray, row: np.ndarray, q: np.ndarray) -> np.ndarray:
    """np.searchsorted(e[row[i]], q[i], side="right") for every i (each row of e non-decreasing, q finite): the
    number of entries of row row[i] that are ≤ q[i], by binary lifting vectorised over i — the rows padded with
    +inf to a power of two 2^b, then b rounds: step 2^(b−1), …, 1 is added where the entry it reaches is ≤ q."""
    width = 1 << int(e.shape[1]).bit_length()
    padded = np.full((e.shape[0], width), np.inf)
    padded[:, :e.shape[1]] = e
    flat, at = padded.ravel(), row.astype(np.int64) * width - 1  # at + count: the last entry counted
    count = np.zeros(len(q), dtype=np.int64)
    step = width >> 1
    while step:
        count += step * (flat.take(at + count + step) <= q)
        step >>= 1
    return count


def _unique_small(values: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(values, return_inverse=True) for integers in 0..top, in O(n + top) (no sort)."""
    present = np.bincount(values, minlength=top + 1) > 0
    rank = np.cumsum(present) - 1
    return np.flatnonzero(present), rank[values]
