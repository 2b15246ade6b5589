"""The vectorised search engine: every layout × every layer split, recompute assignment, Φ, top-k.

Per layout, all layer splits are one numpy array (N, pp); stage times and memory are gathered
from the stage tables in one indexing operation, and the 1F1B totals, recompute fit/refine and Φ
are array expressions — never a Python loop per plan (docs/architecture.md §Search).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial

import numpy as np

from memx.domain.errors import InfeasibleError
from memx.domain.specs import Cluster, ModelArch, SearchSpace, Weights
from memx.planner.candidates import CandidatePool, keep_chunk, pareto_front
from memx.planner.cost import model_static_bytes
from memx.planner.metrics import PlanMetrics, plan_metrics
from memx.planner.objective import auto_profile, log_score, parse_weights, phi
from memx.planner.predictions import PredictedTables, predict_tables
from memx.planner.recompute import Assignment, fit, refine
from memx.planner.result import SearchResult, SpaceCount
from memx.planner.schedule import pipeline
from memx.planner.signatures import StagePredictor
from memx.planner.space import Layout, check_space_input, count_compositions, count_with_options, enumerate_layouts, splits
from memx.planner.tables import LayoutTables, StageContext, decode_option, stage_options

__all__ = ["SearchResult", "SpaceCount", "search", "shard_layouts"]


def _contexts(layouts: list[Layout], n_layers: int) -> dict[StageContext, int]:
    """Every stage context of the layouts, with the most layers any layout may give it."""
    out: dict[StageContext, int] = {}
    for lay in layouts:
        for c in lay.contexts():
            out[c] = max(out.get(c, 0), n_layers - lay.pp + 1)
    return out


@dataclass(frozen=True, kw_only=True)
class _Prepared:
    lay: Layout
    tables: LayoutTables
    hi: np.ndarray  # per-stage layer cap


def _prepare(lay: Layout, pt: PredictedTables, cluster: Cluster, model: ModelArch, seq: int,
             slowdown: float) -> _Prepared | None:
    ctxs = lay.contexts()
    if any(c not in pt.tables for c in ctxs):
        return None
    pipe = pipeline(cluster, model, stage_gpus=lay.stage_gpus, stage_tp=lay.stage_tp, dp=lay.dp,
                    micro_batch=lay.micro_batch, micro_batches=lay.micro_batches, seq_len=seq, p2p_gbps=lay.p2p_gbps,
                    dp_gbps=lay.dp_gbps)
    lt = LayoutTables.stack([pt.tables[c] for c in ctxs], pipe)
    hi = np.array([pt.max_layers[c] for c in ctxs])
    if slowdown > 0:
        hi = np.minimum(hi, _slowdown_caps(lt, model.layers, slowdown))
    return _Prepared(lay=lay, tables=lt, hi=hi)


def _slowdown_caps(lt: LayoutTables, total: int, factor: float) -> np.ndarray:
    """Per-stage layer caps: a stage whose fitted time exceeds factor × B* (B* = the smallest
    achievable bottleneck stage time of this layout) makes the plan ≥ factor× slower in the
    steady 1F1B phase than the balanced split; such splits are pruned before evaluation."""
    n = np.arange(lt.rows)
    fitted = np.full((lt.pp, lt.rows), np.inf)
    for s in range(lt.pp):
        f = lt.fit[s * lt.rows + n]
        ok = (f >= 0) & (n > 0)
        fitted[s, ok] = lt.time_ms[(s * lt.rows + n[ok]) * lt.k + f[ok]]
    cand = np.unique(fitted[np.isfinite(fitted)])
    if cand.size == 0:
        return np.zeros(lt.pp, dtype=np.int64)

    def capacity(bound: float) -> np.ndarray:
        return np.array([(n * (fitted[s] <= bound)).max() for s in range(lt.pp)])

    lo, hi = 0, cand.size - 1
    while lo < hi:  # smallest B with Σ_s max{n : t_s(n) ≤ B} ≥ total
        mid = (lo + hi) // 2
        if capacity(cand[mid]).sum() >= total:
            hi = mid
        else:
            lo = mid + 1
    return np.maximum(capacity(cand[lo] * factor), 1)


def _chunks(prep: _Prepared, total: int, chunk: int):
    S = splits(total, np.ones(prep.lay.pp, dtype=np.int64), prep.hi)
    for i in range(0, len(S), chunk):
        yield S[i:i + chunk]


def _fastest_step1(prep: _Prepared, *, total: int, chunk: int) -> tuple[float, float | None]:
    """(time, smallest margin) of one layout's fastest plan after step 1."""
    best_t, best_margin = np.inf, None
    for S in _chunks(prep, total, chunk):
        _, _, a = fit(prep.tables, prep.tables.base(S))
        if a.time_ms.size and a.time_ms.min() < best_t:
            i = int(a.time_ms.argmin())
            best_t, best_margin = float(a.time_ms[i]), float(a.stats.min_margin[i])
    return best_t, best_margin


def _space_total(layouts: list[Layout], total: int, levels: tuple[str, ...]) -> tuple[int, int]:
    opts = tuple([0] + [len(stage_options(n, levels)) for n in range(1, total + 1)])
    with_rc = sum(count_with_options(total, lay.pp, opts) for lay in layouts)
    return with_rc, sum(count_compositions(total, lay.pp) for lay in layouts)


def _infeasible_reason(cluster: Cluster, model: ModelArch, space: SearchSpace, pt: PredictedTables) -> str:
    need = model_static_bytes(model) / 2**30
    have = sum(n.count * (n.gpu.memory_gib - space.reserve_gib) for n in cluster.nodes)
    if need > have:
        return (f"{model.name} needs ≥ {need:,.0f} GiB for weights, gradients and optimizer state (18 B/param); "
                f"cluster {cluster.name} has {have:,.0f} GiB usable ({space.reserve_gib} GiB reserve per GPU)")
    for g in cluster.gpu_types:
        if all(pt.max_layers[c] == 0 for c in pt.max_layers if c.gpu == g.name):
            return (f"{g.name} ({g.memory_gib:g} GiB) cannot hold even one layer of {model.name} at any tp in "
                    f"{list(space.tp_options)}; drop it from the cluster or set use_all_gpus: false")
    return (f"no layer split of {model.name} fits on {cluster.name} with any recompute level "
            f"(micro batch {list(space.micro_batch_options)}, tp {list(space.tp_options)}, pp ≤ {space.max_pp})")


def _default_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def _evaluate_layout(prep: _Prepared, *, total: int, chunk: int, weights: Weights, space: SearchSpace,
                     per_chunk: int):
    """Step 1 + step 2 and Φ for every split of one layout, chunk by chunk."""
    out = []
    for S in _chunks(prep, total, chunk):
        ok, base, a = fit(prep.tables, prep.tables.base(S))
        if not ok.any():
            out.append((len(S), None))
            continue
        a = refine(prep.tables, base, a, weights, epsilon_mib2=space.epsilon_mib2, target_margin=space.target_margin)
        score = log_score(a.time_ms, a.stats.max_mib, a.stats.variance_mib2, weights, space.epsilon_mib2)
        out.append((len(S), keep_chunk(S[ok], a, score, per_chunk=per_chunk, max_time_ratio=space.max_time_ratio)))
    return out


def shard_layouts(prepared: list[_Prepared], by: str = "layout") -> list[list[int]]:
    """Indices of `prepared` grouped into shards: one per layout, or one per (pp, GPU-type order)."""
    if by == "layout":
        return [[i] for i in range(len(prepared))]
    groups: dict[tuple, list[int]] = {}
    for i, p in enumerate(prepared):
        order = tuple(dict.fromkeys(p.lay.stage_gpus))
        groups.setdefault((p.lay.pp, order), []).append(i)
    return list(groups.values())


def _prepass_shard(preps: list[_Prepared], *, total: int, chunk: int) -> list[tuple[float, float | None]]:
    return [_fastest_step1(p, total=total, chunk=chunk) for p in preps]


def _evaluate_shard(preps: list[_Prepared], **kw) -> list[list]:
    return [_evaluate_layout(p, **kw) for p in preps]


def _thread_mapper(workers: int | None):
    @contextmanager
    def ctx():
        with ThreadPoolExecutor(max_workers=workers or _default_workers()) as ex:  # numpy releases the GIL
            yield ex.map
    return ctx()


def search(cluster: Cluster, model: ModelArch, space: SearchSpace, predictor: StagePredictor, *,
           weights: str | None = None, top_k: int = 10, chunk: int = 1 << 19, workers: int | None = None,
           mapper=None, shard_by: str = "layout") -> SearchResult:
    """Search the plan space; raises InfeasibleError (exit 3) with the reason when nothing fits.

    Layouts are evaluated in shards (`shard_by`: "layout" or "pp-order") through `mapper(fn, shards)`,
    which must return results in order — a thread pool by default; the Prefect search flow passes
    its task runner (threads or Dask). Merging in shard order makes the result independent of it.
    """
    t0 = time.perf_counter()
    check_space_input(model, space)
    chosen = parse_weights(weights or space.weights)
    seq = space.seq_len or model.seq_len
    layouts = enumerate_layouts(cluster, model, space)
    if not layouts:
        raise InfeasibleError(f"no layout of {model.name} on {cluster.name}: with use_all_gpus={space.use_all_gpus}, "
                              f"tp {list(space.tp_options)}, pp {space.min_pp}..{space.max_pp} and global batch "
                              f"{space.global_batch} no dp × Σtp uses the GPUs as required")
    pt = predict_tables(_contexts(layouts, model.layers), cluster, model, seq, space.recompute_levels,
                        space.reserve_gib, predictor)
    t_pred = time.perf_counter()
    prepared = [p for lay in layouts if (p := _prepare(lay, pt, cluster, model, seq, space.max_stage_slowdown))]
    shards = shard_layouts(prepared, shard_by)
    pool = CandidatePool(top_k=top_k, max_time_ratio=space.max_time_ratio)
    evaluated = feasible = 0
    with (nullcontext(mapper) if mapper is not None else _thread_mapper(workers)) as run_map:
        parts_of = [[prepared[i] for i in sh] for sh in shards]
        if chosen is None:  # auto: a step-1 pre-pass finds the fastest plan and its smallest margin
            firsts = [x for res in run_map(partial(_prepass_shard, total=model.layers, chunk=chunk), parts_of)
                      for x in res]
            chosen = auto_profile(cluster, min(firsts, key=lambda x: x[0])[1] if firsts else None)
        run = partial(_evaluate_shard, total=model.layers, chunk=chunk, weights=chosen, space=space,
                      per_chunk=pool.per_chunk)
        for sh, results in zip(shards, run_map(run, parts_of)):  # in order: deterministic results
            for li, parts in zip(sh, results):
                for n_eval, kept in parts:
                    evaluated += n_eval
                    if kept is not None:
                        feasible += len(kept.time_ms)
                        pool.add(li, kept)
    if feasible == 0:
        raise InfeasibleError(_infeasible_reason(cluster, model, space, pt))
    total, splits_total = _space_total(layouts, model.layers, space.recompute_levels)
    refs = pool.medians()

    def build(items):
        return [_candidate(prepared[li], S, a, model, cluster, space, seq, refs, chosen) for li, S, a in items]

    result = SearchResult(
        weights=chosen,
        space=SpaceCount(layouts=len(layouts), total=total, splits_total=splits_total, evaluated=evaluated,
                         feasible=feasible),
        refs=refs, top=build(pool.best_by_score()), top_time=build(pool.best_by_time()),
        pareto=pareto_front(build(pool.pareto_pool())),
        search_s=time.perf_counter() - t0, predict_s=pt.predict_s, signatures=pt.signatures,
        epsilon_mib2=space.epsilon_mib2, timings={"predict_tables_s": t_pred - t0},
    )
    return result


def _candidate(prep: _Prepared, S: np.ndarray, a: Assignment, model, cluster, space, seq, refs, w) -> PlanMetrics:
    lay, lt = prep.lay, prep.tables
    codes = lt.code[lt.base(S[None, :])[:, 0] * lt.k + a.level]
    rec = tuple(decode_option(int(c), int(n)) for c, n in zip(codes, S))
    plan = lay.to_plan(model, cluster, space.global_batch, seq, tuple(int(n) for n in S), rec)
    score = phi(a.time_ms, a.stats.max_mib, a.stats.variance_mib2, refs=refs, weights=w, epsilon_mib2=space.epsilon_mib2)
    # Feasible by construction: step 1 keeps only plans whose every stage fits capacity − reserve.
    return plan_metrics(plan, iteration_time_ms=a.time_ms, stage_time_ms=a.stage_ms, stage_peak_mib=a.stage_mib,
                        capacity_mib=lt.capacity_mib, stats=a.stats, feasible=True, phi=float(score))
