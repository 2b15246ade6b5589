"""Φ's reference values — the medians of T, M and V over every feasible plan — in bounded memory.

* Exact, streaming (`RadixMedians`): the float32 values are non-negative, so their bit patterns order
  like the values. Pass 1 counts the high 16 bits (65,536 bins), which gives the bin holding each
  middle rank; pass 2 counts the low 16 bits of the values in those bins, which gives the middle
  values themselves (a two-pass radix select, Knuth TAOCP vol. 3 §5.2.5). Memory: 2 × 65,536 counts
  per statistic, whatever the number of plans.
* Sampled (`sampled_medians`), when the space is larger than `exact_max` splits: n feasible plans drawn
  uniformly (with replacement) over all layouts (memx.planner.compositions), fully assigned and scored,
  and their sample medians. Bound (Dvoretzky–Kiefer–Wolfowitz with Massart's constant, 1990): with
  probability ≥ 1 − δ the sample median lies between the (½ − ε) and (½ + ε) quantiles of all feasible
  plans, ε = √(ln(2/δ) / 2n) — for n = 2¹⁷ and δ = 10⁻⁶, ε = 0.0075. The draw is seeded: the same search
  gives the same values. Φ's ranking never needs the medians (log Φ differs from wT·log T + wM·log M +
  wV·log(V + ε) by a constant), so the pick, the top-k and the Pareto front are exact either way; the
  medians only scale the Φ values reported.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from memx.planner.compositions import sample_many, suffix_counts_many
from memx.planner.schedule import MemoryStats

BINS = 1 << 16


def dkw_epsilon(n: int, delta: float = 1e-6) -> float:
    """Quantile error ε of an n-sample median with probability ≥ 1 − δ (DKW inequality, Massart 1990)."""
    return math.sqrt(math.log(2.0 / delta) / (2.0 * n)) if n > 0 else 1.0


class RadixMedians:
    """Exact medians of three float32 streams (T, M, V) in two passes over the same values."""

    def __init__(self):
        self.n = 0
        self.high = np.zeros((3, BINS), dtype=np.int64)
        self.low: list[dict[int, np.ndarray]] | None = None
        self._targets: list[tuple[int, int]] = []

    @staticmethod
    def _bits(values: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)

    def first_pass(self, stats: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        self.n += len(stats[0])
        for i, v in enumerate(stats):
            self.high[i] += np.bincount(self._bits(v) >> 16, minlength=BINS)

    def _ranks(self) -> tuple[int, int]:
        return (self.n - 1) // 2, self.n // 2

    def second_pass(self, stats: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        if self.low is None:
            self.low = []
            for i in range(3):
                cum = np.cumsum(self.high[i])
                bins = {int(np.searchsorted(cum, r, side="right")) for r in self._ranks()}
                self.low.append({b: np.zeros(BINS, dtype=np.int64) for b in bins})
        for i, v in enumerate(stats):
            bits = self._bits(v)
            for b, hist in self.low[i].items():
                sel = bits[(bits >> 16) == b]
                hist += np.bincount(sel & 0xFFFF, minlength=BINS)

    def medians(self) -> tuple[float, float, float]:
        out = []
        for i in range(3):
            cum = np.cumsum(self.high[i])
            vals = []
            for r in self._ranks():
                b = int(np.searchsorted(cum, r, side="right"))
                offset = r - (int(cum[b - 1]) if b else 0)
                lo = int(np.searchsorted(np.cumsum(self.low[i][b]), offset, side="right"))
                vals.append(np.array([(b << 16) | lo], dtype=np.uint32).view(np.float32)[0])
            out.append(median(np.array(vals, dtype=np.float32)))
        return out[0], out[1], out[2]


def median(values: np.ndarray) -> float:
    """float(np.median(values)) of a 1-D array, computed as numpy's `_median` computes it — the middle one or two
    of a partition (with the largest, NaN if any, at the end) and their `mean` — without its NaN check's
    `np.ma` lookup, which imports numpy.ma (≈ 0.02 CPU s of a plan, issue #26); NaN where the values hold one."""
    sz = values.size
    if sz == 0:
        return float(np.median(values))  # numpy's warning and NaN
    half = sz // 2
    part = np.partition(values, [half - 1, half, -1] if sz % 2 == 0 else [half, -1])
    if np.isnan(part[-1]):
        return float(part[-1])
    return float(np.mean(part[half:half + 1] if sz % 2 else part[half - 1:half + 1], axis=0))


def sorted_quantiles(x: np.ndarray, q: np.ndarray) -> np.ndarray:
    """np.quantile(x, q, axis=1) (method "linear") of rows x (R, n) already sorted, NaN-free, n ≥ 2: numpy's own
    arithmetic (its _get_indexes, _get_gamma and _lerp: the virtual index (n − 1)·q, the neighbours, the weight,
    a + (b − a)·γ or b − (b − a)·(1 − γ) from γ = ½ on) without the partition's np.unique, which imports numpy.ma.
    Returns (len(q), R)."""
    n = x.shape[1]
    virtual = (n - 1) * q
    above = virtual >= n - 1
    prev = np.where(above, -1, np.floor(virtual)).astype(np.intp)
    nxt = np.where(above, -1, np.floor(virtual) + 1).astype(np.intp)
    gamma = (virtual - prev)[:, None]
    a, b = x[:, prev].T, x[:, nxt].T
    diff = b - a
    out = a + diff * gamma
    np.subtract(b, diff * (1 - gamma), out=out, where=gamma >= 0.5)
    return out


SCORE_CHUNK = 1 << 14  # sampled plans scored at once


def stats_of(a_stats: MemoryStats, time_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return time_ms, a_stats.max_mib, a_stats.variance_mib2


def exact_medians(values: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[float, float, float]:
    """Medians of a bounded list of (T, M, V) batches (np.median over their concatenation: `median`)."""
    med = [median(np.concatenate([v[i] for v in values])) for i in range(3)]
    return med[0], med[1], med[2]


def sampled_medians(allowed: list[np.ndarray], total: int, n: int, seed: int,
                    score: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray] | None]
                    ) -> tuple[tuple[float, float, float], int]:
    """Sample medians of n feasible plans drawn uniformly over the layouts' feasible splits
    (allowed[l]: (pp, rows) feasible layer counts of layout l). `score(layouts, splits)` scores the whole
    sample at once: splits (N, P) padded with 0 beyond each layout's pp, layouts (N,); it returns the
    (T, M, V) of the feasible ones (or None). Returns (medians, plans in the sample)."""
    rng = np.random.default_rng(seed)
    suffix = suffix_counts_many(total, allowed)
    weight = np.array([suf[0, total] for suf in suffix])
    draws = rng.multinomial(n, weight / weight.sum())
    drawn = sample_many(total, allowed, [int(d) for d in draws], rng, suffix)  # layout order
    sizes = np.array([len(S) for S in drawn])
    splits = np.zeros((int(sizes.sum()), max(ok.shape[0] for ok in allowed)), dtype=np.int16)  # padded with 0
    for S, end in zip(drawn, np.cumsum(sizes).tolist()):
        splits[end - len(S):end, :S.shape[1]] = S
    owner = np.repeat(np.arange(len(drawn)), sizes)
    # Scored SCORE_CHUNK plans at a time: each plan's (T, M, V) is its own, so the same values in the same order
    # (issue #26: one batch of 2¹⁷ plans touched ~50 MB of fresh temporaries; a chunk's stay in cache)
    got = [score(owner[i:i + SCORE_CHUNK], splits[i:i + SCORE_CHUNK]) for i in range(0, len(splits), SCORE_CHUNK)]
    values = [g for g in got if g is not None]
    return exact_medians(values), sum(len(v[0]) for v in values)
