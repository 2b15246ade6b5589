"""The search: every layout × every layer split × per-stage recompute, exactly, in bounded memory.

1. Layouts, stage contexts, one batch of stage predictions, per-layout caps (`prepare`); the stage tables
   of all layouts stacked at once (memx.planner.tables.StackedTables) for the bounds and the scoring.
2. Exact counts of the space and of its feasible plans (generating functions, no enumeration).
3. The decision sets — top-k by time, top-k by Φ (within max_time_ratio of the fastest), the Pareto
   front of (T, margin), the safe sets above margin_floor (issue #22) — by branch-and-bound over boxes
   of layer splits of all layouts at once (memx.planner.bnb): boxes whose
   lower bounds (memx.planner.bounds) prove that none of their plans can enter a set are discarded;
   the rest are enumerated and scored by the vectorised engine. `exhaustive=True` scores every plan
   instead (the reference; memx.planner.exhaustive) and must give the same answer.
4. Φ's reference medians (memx.planner.medians): exact when the space has ≤ `exact_medians_max` splits,
   else from a seeded uniform sample of feasible plans with a stated quantile bound.
Memory is bounded by the chunk and the kept sets, never by the size of the space (docs/planner.md
§Search, docs/architecture.md §Search).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from functools import partial
from typing import Any

import numpy as np

from memx.domain.errors import InfeasibleError
from memx.domain.plan import with_idle_gpus, with_model_changes
from memx.domain.runtime import usable_capacity_mib
from memx.domain.specs import Cluster, ModelArch, SearchSpace, Weights
from memx.planner import moe
from memx.planner.bnb import Work
from memx.planner.bounds import SLACK, BoxBounds
from memx.planner.candidates import Cand, Keeper, pareto_front
from memx.planner.compositions import count_splits_many
from memx.planner.cost import model_static_bytes
from memx.planner.distributed import Inline, Pool, Problem, explore_pool
from memx.planner.exhaustive import exhaustive_search
from memx.planner.medians import exact_medians, sampled_medians
from memx.planner.metrics import PlanMetrics, corrected_plans, plan_metrics
from memx.planner.network import achieved
from memx.planner.objective import auto_profile, parse_weights, phi
from memx.planner.pick import apply_pick, front_tolerance
from memx.planner.predictions import PredictedTables, predict_tables
from memx.planner.prepared import Prepared, chunks, layout_contexts, prepare, prepare_many, score_rows, score_splits
from memx.planner.result import SearchResult, SpaceCount
from memx.planner.schedule import MemoryStats, assembly_of
from memx.planner.space import Layout, check_space_input, count_compositions, count_with_options, enumerate_layouts
from memx.planner.tables import LayoutTables, StackedTables, decode_option, stage_options
from memx.planner.variants import Variant, model_variants

__all__ = ["SearchResult", "SpaceCount", "search", "shard_layouts"]

MEDIAN_SAMPLE = 1 << 17  # feasible plans drawn for the medians of a large space
EXACT_MEDIANS_MAX = 1 << 18  # spaces with at most this many splits get exact medians
BOUNDS_BYTES = 1 << 27  # bound tables built at once (memx.planner.bounds.BoxBounds); more layouts: in chunks
Progress = Callable[[int, int], None]

# Names the tests and benchmarks use.
_Prepared, _prepare, _chunks, _contexts = Prepared, prepare, chunks, layout_contexts


def shard_layouts(prepared: list[Prepared], by: str = "layout") -> list[list[int]]:
    """Indices of `prepared` grouped into shards: one per layout, or one per (pp, GPU-type order)."""
    if by == "layout":
        return [[i] for i in range(len(prepared))]
    groups: dict[tuple, list[int]] = {}
    for i, p in enumerate(prepared):
        order = tuple(dict.fromkeys(p.lay.stage_gpus))
        groups.setdefault((p.lay.pp, order), []).append(i)
    return list(groups.values())


class _Shard:
    """The layouts of a shard with their stacked stage tables (memx.planner.tables.StackedTables) and bound
    tables (memx.planner.bounds.BoxBounds), built once and shared by the search's phases. Bound tables larger
    than BOUNDS_BYTES are built for chunks of layouts in turn (and not kept), so memory stays bounded."""

    def __init__(self, items: list[tuple[int, Prepared]], total: int, space: SearchSpace):
        self.items, self.total, self.space = items, total, space
        pp = max((p.lay.pp for _, p in items), default=1)
        rows = len(items[0][1].stages[0].fit) if items else 1
        per = max(1, BOUNDS_BYTES // BoxBounds.table_bytes(1, pp, rows))
        self.chunks = [list(range(i, min(i + per, len(items)))) for i in range(0, len(items), per)]
        self._kept: tuple[StackedTables, BoxBounds] | None = None
        self._shared: dict[int, Any] = {}  # a pool's handle of each kept chunk's tables (memx.planner.distributed)

    def stacked(self) -> StackedTables | None:
        """The stacked tables of every layout of the shard when they are kept (one chunk), else None."""
        return self.tables(self.chunks[0])[0] if len(self.chunks) == 1 else None

    def tables(self, chunk: list[int]) -> tuple[StackedTables, BoxBounds]:
        if self._kept is not None:
            return self._kept
        preps = [self.items[j][1] for j in chunk]
        st = StackedTables.of([(p.stages, p.pipe) for p in preps])
        hi = np.zeros((len(preps), st.pp), dtype=np.int64)
        for i, p in enumerate(preps):
            hi[i, :p.lay.pp] = p.hi
        out = st, BoxBounds(st, hi, self.total, self.space.target_margin)
        if len(self.chunks) == 1:
            self._kept = out
        return out

    def shared(self, pool: Pool, c: int, st: StackedTables, bounds: BoxBounds) -> Any:
        """Chunk c's tables (`st`, `bounds`: built by `tables`) sent to the pool's workers (once per search when they
        are kept; building them again here doubled the bound tables' CPU of a search of several chunks)."""
        if c in self._shared:
            return self._shared[c]
        chunk = self.chunks[c]
        handle = pool.share(Problem(tables=st, bounds=bounds, keys=np.array([self.items[j][0] for j in chunk])))
        if len(self.chunks) == 1:
            self._shared[c] = handle
        return handle


def _explore_shard(shard: list[tuple[int, Prepared]] | _Shard, *, weights: Weights | None, space: SearchSpace,
                   top_k: int, total: int, tick: Callable[[int], None] | None = None,
                   pool: Pool | None = None, time_floor_ms: float = 0.0) -> tuple[Keeper, Work]:
    """Branch-and-bound over a shard's layouts, their boxes bounded and their leaves scored together
    (memx.planner.bnb's rounds, in the order of memx.planner.distributed.explore_pool: on `pool`'s workers, or
    without one in this process, `Inline`); a layout whose root bound rules it out is discarded in the first round."""
    keeper = Keeper(top_k=1 if weights is None else top_k, max_time_ratio=space.max_time_ratio,
                    timed_only=weights is None, margin_floor=space.margin_floor,
                    balance_tolerance=space.balance_tolerance, time_floor_ms=time_floor_ms,
                    front_tolerance=front_tolerance(space))
    work = Work()
    sh = shard if isinstance(shard, _Shard) else _Shard(shard, total, space)
    pool = Inline() if pool is None else pool
    for c, chunk in enumerate(sh.chunks):
        st, bounds = sh.tables(chunk)
        handle = sh.shared(pool, c, st, bounds)
        work.add(explore_pool(pool, handle, bounds, keeper, weights, space, np.arange(len(chunk))))
        if tick is not None:
            tick(len(chunk))
    return keeper, work


def _run_phase(prepared: list[Prepared], shards: list[list[int]], run_map, tick, whole: _Shard | None,
               pool: Pool | None = None, **kw) -> tuple[Keeper, Work]:
    """One branch-and-bound phase: with one shared keeper (its boxes in this process or on `pool`), or through
    `run_map` per shard."""
    if run_map is None:
        return _explore_shard(whole, tick=tick, pool=pool, **kw)
    parts = [[(i, prepared[i]) for i in sh] for sh in shards]
    keeper, work = None, Work()
    for sh, (k, w) in zip(shards, run_map(partial(_explore_shard, **kw), parts)):  # in order: deterministic
        if keeper is None:
            keeper = k
        else:
            keeper.merge(k)
        work.add(w)
        tick(len(sh))
    return keeper, work


def search(cluster: Cluster, model: ModelArch, space: SearchSpace, predictor, *, weights: str | None = None,
           top_k: int = 10, chunk: int = 1 << 17, workers: int | None = None, mapper=None, shard_by: str = "layout",
           exhaustive: bool = False, on_progress: Progress | None = None, median_sample: int = MEDIAN_SAMPLE,
           exact_medians_max: int = EXACT_MEDIANS_MAX, refs: tuple[float, float, float] | None = None,
           pool: Pool | None = None) -> SearchResult:
    """Search the plan space; raises InfeasibleError (exit 3) with the reason when nothing fits.

    `mapper(fn, shards)` (results in order; Prefect's task runner, threads or Dask) runs the shards
    (`shard_by`: "layout" or "pp-order") each with its own kept sets, merged in shard order; without a
    mapper the layouts share one keeper in this process, most promising first (`workers` is accepted
    for compatibility: one shared keeper prunes far more than parallel shards would gain on few cores).
    `pool` (memx.planner.distributed: threads or a Dask cluster) explores the boxes of that one search on its
    workers, the kept sets merged here (not with a mapper).
    `on_progress(done, total)` is called as layouts finish (units: layouts per phase, plus the medians).
    The answer is the same in every mode, and the same as `exhaustive=True`. `refs`: given reference values
    for Φ (e.g. another search's medians): this search's medians are then not computed (the ranking and the
    pick never need them: log Φ differs from wT·log T + wM·log M + wV·log(V + ε) by a constant).
    """
    cluster = achieved(cluster, predictor)  # the NICs as the predictor sees them (memx.planner.network)
    t0 = time.perf_counter()
    if pool is not None and mapper is not None:
        raise ValueError("search: a pool distributes one search's boxes; a mapper runs shards: not both")
    given = refs
    variants = model_variants(model, space)  # [the job as given] unless the space lists heads/groups/seq options
    check_space_input(variants[0].model, space)
    chosen = parse_weights(weights or space.weights)
    total = model.layers
    per_variant = [enumerate_layouts(cluster, v.model, space) for v in variants]
    layouts = [lay for lays in per_variant for lay in lays]
    if not layouts:
        raise InfeasibleError(f"no layout of {model.name} on {cluster.name}: with use_all_gpus={space.use_all_gpus}, "
                              f"tp {list(space.tp_options)}, pp {space.min_pp}..{space.max_pp} and global batch "
                              f"{space.global_batch} no dp × Σtp uses the GPUs as required")
    # A variant is one more layout option: its layouts join the one list the search ranks (exact over the union).
    prepared, owner, pts, hits = [], [], [], []
    # a calibrated predictor's c, o and d (memx.learn.calibration), else identity; the space's 1F1B assembly
    assembly = assembly_of(predictor, space.pipeline_assembly)
    for vi, (v, lays) in enumerate(zip(variants, per_variant)):
        pt = predict_tables(layout_contexts(lays, total), cluster, v.model, v.seq_len, space.recompute_levels,
                            space.reserve_gib, predictor)
        hits.append(getattr(predictor, "last_hit_rate", None))  # of the table call, before any later query
        pts.append(pt)
        for p in prepare_many(lays, pt, cluster, v.model, v.seq_len, space.max_stage_slowdown, assembly):
            if p is not None:
                prepared.append(p)
                owner.append(vi)
    pt = pts[0] if len(pts) == 1 else _joined(pts)
    hit_rate = _hit_rate(hits, pts)
    t_pred = time.perf_counter()
    evaluated = sum(count_splits_many(total, [p.allowed(feasible=False) for p in prepared]))
    feasible = sum(count_splits_many(total, [p.allowed(feasible=True) for p in prepared]))
    if feasible == 0:
        raise InfeasibleError(_infeasible_reason(cluster, model, space, pt))
    phases = (1 if chosen is not None else 2) + (1 if exhaustive else 0)
    done = [0]
    units = phases * len(prepared) + 1

    def tick(n: int) -> None:
        done[0] += n
        if on_progress is not None:
            on_progress(min(done[0], units), units)

    timings = {"predict_tables_s": t_pred - t0}
    if exhaustive:
        keeper, chosen, refs, work = exhaustive_search(prepared, total=total, space=space, cluster=cluster,
                                                       weights=chosen, top_k=top_k, chunk=chunk, tick=tick)
        refs, sample = refs if given is None else given, 0
    else:
        shards = shard_layouts(prepared, shard_by)
        whole = _Shard(list(enumerate(prepared)), total, space) if mapper is None else None
        with nullcontext(mapper) as run_map, ThreadPoolExecutor(max_workers=1) as side:
            floor = 0.0
            if chosen is None:  # auto: the fastest plan after step 1 and its smallest margin decide
                first, _ = _run_phase(prepared, shards, run_map, tick, whole, pool, weights=None, space=space,
                                      top_k=1, total=total)
                chosen = auto_profile(cluster, first.by_time[0].margin if first.by_time else None)
                # Refinement only raises a plan's time (float32 rounding is monotone): every plan is ≥ the fastest
                # step-1 time, a floor of the final window (Keeper.time_floor_ms).
                floor = first.by_time[0].time_ms * (1 - SLACK) if first.by_time else 0.0
            t_pre = time.perf_counter()
            # The medians need no bound: computed beside the branch-and-bound (numpy releases the GIL).
            medians = None if given is not None else side.submit(
                _medians, prepared, chosen, space, total, evaluated, median_sample, exact_medians_max,
                whole.stacked() if whole is not None else None)
            keeper, work = _run_phase(prepared, shards, run_map, tick, whole, pool, weights=chosen, space=space,
                                      top_k=top_k, total=total, time_floor_ms=floor)
            timings["branch_and_bound_s"] = time.perf_counter() - t_pre
            refs, sample = medians.result() if medians is not None else (given, 0)
            timings["medians_wait_s"] = time.perf_counter() - t_pre - timings["branch_and_bound_s"]
    tick(1)
    if not keeper.by_time:
        raise InfeasibleError(_infeasible_reason(cluster, model, space, pt))

    tables: dict[int, LayoutTables] = {}

    def build(items: list[Cand]) -> list[PlanMetrics]:
        for c in items:
            if c.layout not in tables:
                tables[c.layout] = prepared[c.layout].build()
        return _corrected(predictor, [_candidate(prepared[c.layout].lay, tables[c.layout], c, variants[owner[c.layout]],
                                                 model, cluster, space, refs, chosen) for c in items], refs, chosen, space)

    return apply_pick(SearchResult(  # the pick rule, margin floor, (T, margin, V) front: memx.planner.pick
        weights=chosen,
        space=SpaceCount(layouts=len(layouts), total=_space_total(layouts, total, space.recompute_levels),
                         splits_total=sum(count_compositions(total, lay.pp) for lay in layouts), evaluated=evaluated,
                         feasible=feasible, scored=work.scored, discarded=evaluated - work.scored),
        refs=refs, refs_sample=sample, top=_reranked(predictor, build(keeper.best_by_score()), "phi"),
        top_time=_reranked(predictor, build(keeper.best_by_time()), "iteration_time_ms"),
        pareto=pareto_front(build(keeper.pareto())), safe=pareto_front(build(keeper.safe())),
        pareto_window_ms=keeper.front_cut_ms(),
        search_s=time.perf_counter() - t0, predict_s=pt.predict_s, signatures=pt.signatures,
        epsilon_mib2=space.epsilon_mib2, timings=timings,
        cache_hit_rate=None if hit_rate is None else float(hit_rate),
    ), space, model, predictor)


def _medians(prepared: list[Prepared], w: Weights, space: SearchSpace, total: int, evaluated: int, sample: int,
             exact_max: int, stacked: StackedTables | None = None) -> tuple[tuple[float, float, float], int]:
    """(medians of T, M, V over the feasible plans, sample size or 0 when exact); the sample is scored in one
    batch over all layouts (`stacked`: their StackedTables, when already built)."""
    def stats(sc):
        if sc is None:
            return None
        a = sc.assignment
        return a.time_ms, a.stats.max_mib, a.stats.variance_mib2

    if evaluated <= exact_max:
        values = [v for li, p in enumerate(prepared) for S in chunks(p, total, exact_max)
                  if (v := stats(score_splits(p.build(), li, S, w, space)))]
        return exact_medians(values), 0
    st = stacked if stacked is not None else StackedTables.of([(p.stages, p.pipe) for p in prepared])
    return sampled_medians([p.allowed(feasible=True) for p in prepared], total, sample, 0,
                           lambda li, S: stats(score_rows(st, li, S, w, space)))


def _space_total(layouts, total: int, levels: tuple[str, ...]) -> int:
    opts = tuple([0] + [len(stage_options(n, levels)) for n in range(1, total + 1)])
    return sum(count_with_options(total, lay.pp, opts) for lay in layouts)


def _infeasible_reason(cluster: Cluster, model: ModelArch, space: SearchSpace, pt: PredictedTables) -> str:
    need = (moe.model_static_bytes(model) if model.is_moe else model_static_bytes(model)) / 2**30
    usable = {g.name: usable_capacity_mib(g) / 1024.0 for g in cluster.gpu_types}  # GiB: nominal − driver reserve
    have = sum(n.count * (usable[n.gpu.name] - space.reserve_gib) for n in cluster.nodes)
    if need > have:
        # 18 B/param in all: the distributed optimizer shards 12 of them over dp ranks but still holds them once.
        return (f"{model.name} needs ≥ {need:,.0f} GiB for weights, gradients and optimizer state (18 B/param); "
                f"cluster {cluster.name} has {have:,.0f} GiB usable (nominal less the driver reserve, less "
                f"{space.reserve_gib} GiB reserve per GPU)")
    for g in cluster.gpu_types:
        if all(pt.max_layers[c] == 0 for c in pt.max_layers if c.gpu == g.name):
            return (f"{g.name} ({g.memory_gib:g} GiB, {usable[g.name]:.2f} GiB usable) cannot hold even one layer of "
                    f"{model.name} at any tp in {list(space.tp_options)}; drop it from the cluster or set "
                    "use_all_gpus: false")
    return (f"no layer split of {model.name} fits on {cluster.name} with any recompute level "
            f"(micro batch {list(space.micro_batch_options)}, tp {list(space.tp_options)}, pp ≤ {space.max_pp})")


def _joined(pts: list[PredictedTables]) -> PredictedTables:
    """The variants' table calls as one (counts and time summed; the first variant's tables, for messages)."""
    return dataclasses.replace(pts[0], signatures=sum(p.signatures for p in pts), predict_s=sum(p.predict_s for p in pts))


def _hit_rate(hits: list, pts: list[PredictedTables]) -> float | None:
    """The cache hit rate over the table calls, weighted by their signatures; None without a cache."""
    if any(h is None for h in hits):
        return None
    n = sum(p.signatures for p in pts)
    if len(hits) == 1 or not n:
        return float(hits[0])
    return float(sum(h * p.signatures for h, p in zip(hits, pts)) / n)


def _corrected(predictor, cands: list[PlanMetrics], refs, w: Weights, space: SearchSpace) -> list[PlanMetrics]:
    """The kept candidates re-scored with the predictor's plan-level correction (a calibrated plan residual,
    memx.learn.residual): T'' replaces T' and Φ is recomputed against the same medians; the branch and bound
    ranked with T', so this re-ranks the kept top-k (docs/architecture.md §Plan calibration)."""
    out = corrected_plans(predictor, cands)
    return [c if c.iteration_time_ms == o.iteration_time_ms else
            dataclasses.replace(c, phi=float(phi(c.iteration_time_ms, c.max_mem_mib, c.mem_variance_mib2, refs=refs,
                                                  weights=w, epsilon_mib2=space.epsilon_mib2)))
            for c, o in zip(out, cands)]


def _reranked(predictor, cands: list[PlanMetrics], by: str) -> list[PlanMetrics]:
    """The kept candidates in the order of `by` again where a plan-level correction may have moved them; as
    the keeper ranked them otherwise."""
    return sorted(cands, key=lambda m: getattr(m, by)) if hasattr(predictor, "correct_plans") else cands


def _candidate(lay: Layout, lt: LayoutTables, c: Cand, variant: Variant, model, cluster, space, refs, w) -> PlanMetrics:
    S = np.asarray(c.split)
    codes = lt.code[lt.base(S[None, :])[:, 0] * lt.k + c.level]
    rec = tuple(decode_option(int(code), int(n)) for code, n in zip(codes, S))
    plan = lay.to_plan(model, cluster, space.global_batch, variant.seq_len, c.split, rec)
    if variant.model is not model:  # a different training job: the plan records what changed
        plan = with_model_changes(plan, variant.model, model)
    if not space.use_all_gpus or space.launcher == "megatron":  # the plan says which GPUs it leaves out (a Megatron job: one vendor's)
        plan = with_idle_gpus(plan, cluster)
    score = phi(c.time_ms, c.max_mib, c.var_mib2, refs=refs, weights=w, epsilon_mib2=space.epsilon_mib2)
    stats = MemoryStats(max_mib=np.float32(c.max_mib), variance_mib2=np.float32(c.var_mib2), min_margin=np.float32(c.margin))
    # Feasible by construction: step 1 keeps only plans whose every stage fits capacity − reserve.
    return plan_metrics(plan, iteration_time_ms=c.time_ms, stage_time_ms=c.stage_ms, stage_peak_mib=c.stage_mib,
                        capacity_mib=lt.capacity_mib, stats=stats, feasible=True, phi=float(score),
                        min_margin_high=None if np.isnan(c.margin_high) else c.margin_high)
