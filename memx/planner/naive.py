"""A straightforward per-plan Python evaluator: the reference the vectorised engine is checked
against (tests) and timed against (bench/search_throughput.py). Same tables, same rules
(step 1 fit, step 2 refine with exchange rates, 1F1B totals, log Φ), one plan at a time — written
out independently of memx.planner.schedule on purpose, so that it checks the vectorised assembly."""

from __future__ import annotations

import math
from dataclasses import dataclass

from memx.domain.specs import Weights
from memx.planner.drain import drained_tail_py
from memx.planner.interleave import pipeline_compute_ms
from memx.planner.schedule import drains
from memx.planner.tables import LayoutTables


@dataclass(frozen=True, kw_only=True)
class NaiveResult:
    levels: tuple[int, ...]
    time_ms: float
    max_mib: float
    variance_mib2: float
    min_margin: float
    score: float


def _metrics(lt: LayoutTables, split, levels):
    t = [float(lt.time_ms[(s * lt.rows + n) * lt.k + lv]) for s, (n, lv) in enumerate(zip(split, levels))]
    m = [float(lt.peak_mib[(s * lt.rows + n) * lt.k + lv]) for s, (n, lv) in enumerate(zip(split, levels))]
    tails = [float(lt.tail_ms[s * lt.rows + n]) for s, n in enumerate(split)]
    drain = lt.pipeline.virtual_stages == 1 and drains(lt.pipeline.assembly)  # cycle-mean-drain (memx.planner.drain)
    tail = drained_tail_py(t, tails, lt.pipeline.loop_ms()) if drain else max(tails)
    T = pipeline_compute_ms(_period(t, lt.pipeline.loop_ms()), sum(t), lt.micro_batches,
                            lt.pipeline.virtual_stages) + lt.fixed_ms + tail  # paper §3.1.2
    w = [float(x) for x in lt.gpu_weight]
    mean = sum(wi * mi for wi, mi in zip(w, m)) / sum(w)
    var = sum(wi * (mi - mean) ** 2 for wi, mi in zip(w, m)) / sum(w)  # V over GPUs, docs/architecture.md §Score
    margin = min((float(c) - mi) / float(c) for c, mi in zip(lt.capacity_mib, m))
    return t, m, T, max(m), var, margin


def _period(t: list[float], loop) -> float:
    """The steady-state period: max_s t_s (paper §3.1.2), or with loop (pipeline_assembly cycle-mean: 2·c·p2p per
    boundary) the largest mean over contiguous stage ranges a..e of Σ t + Σ loop, per e − a + 1 micro batches
    (docs/planner.md §The 1F1B steady state), every range summed directly."""
    best = max(t)
    if loop is not None:
        gaps = [float(x) for x in loop[:, 0]]
        for a in range(len(t)):
            for e in range(a + 1, len(t)):
                best = max(best, (sum(t[a:e + 1]) + sum(gaps[a:e])) / (e - a + 1))
    return best


def _score(T, M, V, w: Weights, eps: float) -> float:
    return w.w_time * math.log(T) + w.w_mem * math.log(M) + w.w_var * math.log(V + eps)  # log Φ + const, paper §3.1.2


def evaluate_split(lt: LayoutTables, split, w: Weights, *, epsilon_mib2: float, target_margin: float,
                   max_moves: int = 64) -> NaiveResult | None:
    """Step 1 then step 2 for one plan; None when a stage fits at no level."""
    levels = []
    for s, n in enumerate(split):
        f = int(lt.fit[s * lt.rows + n])
        if f < 0:
            return None
        levels.append(f)
    t, m, T, M, V, margin = _metrics(lt, split, levels)
    score = _score(T, M, V, w, epsilon_mib2)
    for _ in range(max_moves):
        if margin >= target_margin:
            break
        best_s, best_r = None, math.inf
        for s, n in enumerate(split):
            cap = float(lt.capacity_mib[s])
            if (cap - m[s]) / cap >= target_margin:
                continue
            up = min(levels[s] + 1, int(lt.length[s * lt.rows + n]) - 1)
            i = (s * lt.rows + n) * lt.k + up
            d_mem = m[s] - float(lt.peak_mib[i])
            if d_mem > 0:
                r = (float(lt.time_ms[i]) - t[s]) / d_mem
                if r < best_r:
                    best_s, best_r = s, r
        if best_s is None:
            break
        trial = list(levels)
        trial[best_s] += 1
        t2, m2, T2, M2, V2, margin2 = _metrics(lt, split, trial)
        s2 = _score(T2, M2, V2, w, epsilon_mib2)
        if not s2 < score:
            break
        levels, t, m, T, M, V, margin, score = trial, t2, m2, T2, M2, V2, margin2, s2
    return NaiveResult(levels=tuple(levels), time_ms=T, max_mib=M, variance_mib2=V, min_margin=margin, score=score)
