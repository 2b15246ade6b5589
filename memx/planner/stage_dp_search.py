"""The opt-in per-stage data-parallel space (`stage_data_parallel: true`; issue #27, docs/planner.md §Data
parallel per stage).

Layouts: every GPU type of the plan is one FlagScale process mesh — its stages share one tp and one dp
(FlagScale's mesh is [tp, cp, ep, dp, pp]: flagscale/train/arguments.py pre_validate_args), k stages of tp × dp
GPUs — in every type order, with the first mesh's dp and micro batch b_0 fixing B = dp_0 · b_0 samples per
micro batch (every dp_i dividing B, global_batch a multiple of B). Only layouts whose meshes differ in dp are
enumerated here: those with one dp are today's space, which the batched engine searches exactly.

Scoring stays outside the batched engine (memx.planner.tables / bounds / prepared know one dp and one micro
batch per layout): one predictor call for every (stage context, layers, recompute option) row of every layout
(contexts repeat across layouts and are predicted once), then per stage and layer count the fastest recompute
option whose point margin clears `margin_floor` (else the fastest that fits: the paper's step 1, §3.1.1), and
per layout the layer split minimising (m − 1) · max_s t_s + Σ_s t_s exactly, by a bottleneck-threshold dynamic
programme: for each candidate bottleneck τ (every tabled stage time), the least Σ_s t_s over splits whose
stages all take ≤ τ (a min-plus pass per stage over the layer counts). The best few splits of every layout are
re-scored by `estimate_plans` — the closed form of memx.planner.stage_dp, the same as `memx evaluate` — and the
best plan (clears the floor, then fastest: replica_search._better) replaces the pick when it beats it. Not
exhaustive over recomputation (no step-2 refinement) nor over the tail term in the split (it is in the
re-score); the bench (bench/stage_dp.py) reports what it finds on the Metis side-by-side problem.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import time

import numpy as np

from memx.domain.errors import InfeasibleError
from memx.domain.plan import Plan, Stage
from memx.domain.specs import Cluster, ModelArch, SearchSpace
from memx.domain.stage_dp import place_stage_groups, stage_dp_problems, stage_dps
from memx.planner import stage_dp
from memx.planner.estimate import estimate_plans, upper_margins
from memx.planner.metrics import PlanMetrics
from memx.planner.objective import phi
from memx.planner.predictions import params_per_rank
from memx.planner.replica_search import _better
from memx.planner.result import SearchResult, plan_key
from memx.planner.schedule import iteration_time_ms, stage_tail_ms
from memx.planner.signatures import predict_arrays, signature_columns
from memx.planner.space import _effective, _ends_ok, gpu_subsets, subset_precisions, valid_tps
from memx.planner.tables import decode_option, plan_contexts, stage_options

KEEP_PER_LAYOUT = 2  # splits per layout tabled (the best bottleneck thresholds)
RESCORED = 16  # candidates re-scored by estimate_plans, best tabled first


def _meshes(cluster: Cluster, model: ModelArch, space: SearchSpace, gpu: str) -> list[tuple[int, int, int]]:
    """(tp, dp, stages) of one GPU type's mesh: tp · dp · stages its GPUs (all of them with use_all_gpus)."""
    count = cluster.gpu_count(gpu)
    out = []
    for tp in valid_tps(model, cluster, gpu, space.tp_options):
        for dp in range(1, count // tp + 1):
            ks = [count // (tp * dp)] if space.use_all_gpus else range(1, count // (tp * dp) + 1)
            out += [(tp, dp, k) for k in ks if k >= 1 and (not space.use_all_gpus or k * tp * dp == count)]
    return out


def layouts(cluster: Cluster, model: ModelArch, space: SearchSpace) -> list[Plan]:
    """One probe plan (1 layer per stage) per layout of the per-stage-dp space (module docstring), deterministic."""
    if model.is_moe:  # not modelled with a per-stage dp (memx.domain.stage_dp.stage_dp_problems)
        return []
    seq = space.seq_len or model.seq_len
    subsets = [s for s in gpu_subsets(cluster, space) if len(s) > 1]
    precisions = subset_precisions(cluster, space, subsets) if subsets else {}
    out = []
    for subset in (s for s in subsets if s in precisions):
        for meshes in itertools.product(*(_meshes(cluster, model, space, g) for g in subset)):
            if len({dp for _, dp, _ in meshes}) == 1 or not space.min_pp <= sum(k for *_, k in meshes) <= min(
                    space.max_pp, model.layers):
                continue
            for order in itertools.permutations(range(len(subset))):
                out += _probes(cluster, model, space, [(subset[i], *meshes[i]) for i in order], seq, precisions[subset])
    return out


def _probes(cluster, model, space, meshes, seq, precision) -> list[Plan]:
    stages = tuple(Stage(gpu=g, tp=tp, layers=1, data_parallel=dp) for g, tp, dp, k in meshes for _ in range(k))
    if not _ends_ok(space.launcher, model, tuple(st.tp for st in stages)):
        return []
    dp0, out = stages[0].data_parallel, []
    for mb, do, sp in itertools.product(space.micro_batch_options, _effective(space.distributed_optimizer, True),
                                        _effective(space.sequence_parallel, max(st.tp for st in stages) > 1)):
        if space.global_batch % (dp0 * mb):
            continue
        probe = Plan(model=model.name, cluster=cluster.name, global_batch=space.global_batch, micro_batch=mb,
                     seq_len=seq, dp=dp0, stages=stages, distributed_optimizer=do, sequence_parallel=sp,
                     precision=precision)
        if not stage_dp_problems(probe, model) and place_stage_groups(probe, cluster) is not None:
            out.append(probe)
    return out


@functools.lru_cache(maxsize=1 << 14)
def _contexts(probe: Plan):
    return stage_dp.contexts(probe, plan_contexts(probe))


def _tables(probes: list[Plan], model: ModelArch, space: SearchSpace, predictor, levels: tuple[str, ...]):
    """{context: (time, peak, static, code) arrays over n = 0..L (n = 0 unused: inf)} from one predictor call."""
    ctxs = list(dict.fromkeys(c for p in probes for c in _contexts(p)))
    n_max = model.layers
    rows = [(i, n, code) for i in range(len(ctxs)) for n in range(1, n_max + 1) for code in stage_options(n, levels)]
    idx, layers, codes = (np.asarray(col, dtype=np.int64) for col in zip(*rows))
    seq = space.seq_len or model.seq_len
    pred = predict_arrays(predictor, signature_columns(ctxs, layers, codes, idx, model, seq))
    return ctxs, idx, layers, codes, pred


def _choose(cap_mib: float, reserve_mib: float, floor: float, t, peak, static, codes, layers, n_max: int):
    """Per layer count, the fastest option clearing the floor (else the fastest that fits): (time, peak, static,
    code) over n = 0..n_max (inf time where nothing fits)."""
    best_t, best_p, best_s = (np.full(n_max + 1, np.inf) for _ in range(3))
    best_c = np.zeros(n_max + 1, np.int64)
    fits = peak <= cap_mib - reserve_mib
    clears = fits & ((cap_mib - peak) / cap_mib >= floor)
    for n in range(1, n_max + 1):
        at = layers == n
        for ok in (clears & at, fits & at):
            if ok.any():
                j = np.flatnonzero(ok)[np.argmin(t[ok])]
                best_t[n], best_p[n], best_s[n], best_c[n] = t[j], peak[j], static[j], codes[j]
                break
    return best_t, best_p, best_s, best_c


def best_splits(t: np.ndarray, m: int, total: int, keep: int, bound: float = np.inf) -> list[tuple[int, ...]]:
    """The splits (n_s ≥ 1, Σ n_s = total) minimising (m − 1)·max_s t[s, n_s] + Σ_s t[s, n_s] (t: (pp, total + 1),
    inf where a stage cannot hold n layers), one per bottleneck threshold, best `keep` first (module docstring).
    Thresholds τ whose score cannot fall below `bound` ((m − 1)·τ + Σ_s min_n t[s, n] ≥ bound) are skipped, and so
    are those below the largest per-stage minimum (some stage would hold nothing)."""
    pp = t.shape[0]
    low = t[:, 1:].min(axis=1)
    if not np.isfinite(low).all():
        return []
    taus = np.unique(t[np.isfinite(t)])
    taus = taus[(taus >= low.max()) & ((m - 1) * taus + low.sum() < bound)]
    if taus.size == 0:
        return []
    l, n = np.arange(total + 1)[:, None], np.arange(total + 1)[None, :]
    src, blocked = np.where(n <= l, l - n, 0), np.where(n <= l, 0.0, np.inf)[None]  # D[τ, l − n] for every (l, n)
    D = np.full((taus.size, total + 1), np.inf)
    D[:, 0] = 0.0
    arg = []
    for s in range(pp):
        cost = np.where(t[s][None, :] <= taus[:, None], t[s][None, :], np.inf)  # (τ, n)
        cost[:, 0] = np.inf  # every stage holds at least one layer
        cand = D[:, src] + blocked + cost[:, None, :]  # (τ, l, n)
        pick = cand.argmin(axis=2)
        D = np.take_along_axis(cand, pick[:, :, None], axis=2)[:, :, 0]
        arg.append(pick)
    score = (m - 1) * taus + D[:, total]
    out: list[tuple[int, ...]] = []
    for k in np.argsort(score, kind="stable")[:keep]:
        if not score[k] < bound:
            break
        left, split = total, []
        for s in range(pp - 1, -1, -1):
            split.append(int(arg[s][k, left]))
            left -= split[-1]
        if tuple(reversed(split)) not in out:
            out.append(tuple(reversed(split)))
    return out


def candidates(cluster: Cluster, model: ModelArch, space: SearchSpace, predictor,
               levels: tuple[str, ...] | None = None, bound: float = np.inf) -> tuple[list[Plan], int]:
    """The per-stage-dp plans to re-score (the RESCORED best by their tabled iteration time, those that clear the
    floor first; only splits whose compute part (m − 1)·max t + Σ t is below `bound`) and the layouts enumerated."""
    levels = levels or space.recompute_levels
    probes = layouts(cluster, model, space)
    if not probes:
        return [], 0
    ctxs, idx, layers, codes, pred = _tables(probes, model, space, predictor, levels)
    chosen = {}
    for i, c in enumerate(ctxs):
        rows, gpu = np.flatnonzero(idx == i), cluster.gpu(c.gpu)
        chosen[c] = (*_choose(gpu.memory_mib, space.reserve_gib * 1024.0, space.margin_floor, pred["time_ms"][rows],
                              pred["peak_mem_mib"][rows], pred["static_mem_mib"][rows], codes[rows], layers[rows],
                              model.layers),
                     np.asarray(params_per_rank(c, np.arange(model.layers + 1), model), dtype=np.float64))
    tables = [(probe, _contexts(probe)) for probe in probes]
    tables = [(probe, pctx, np.stack([chosen[c][0] for c in pctx])) for probe, pctx in tables]
    low = [_lower_bound(t, probe.micro_batches, model.layers) for probe, _, t in tables]
    scored: list[tuple[tuple[bool, float], Plan]] = []
    for i in np.argsort(low, kind="stable"):  # most promising first; stop where none can enter the kept set
        probe, pctx, t = tables[i]
        kept = sorted(sc for sc, _ in scored if not sc[0])[:RESCORED]
        cut = min(bound, kept[-1][1]) if len(kept) == RESCORED else bound
        if low[i] >= cut:
            break
        splits = best_splits(t, probe.micro_batches, model.layers, KEEP_PER_LAYOUT, cut)
        links = _links(probe, cluster, model) if splits else None
        for split in splits:
            stages = tuple(dataclasses.replace(st, layers=n, **_recompute(int(chosen[c][3][n]), n))
                           for st, c, n in zip(probe.stages, pctx, split))
            plan = dataclasses.replace(probe, stages=stages)
            scored.append((_tabled(plan, [chosen[c] for c in pctx], split, links, cluster, space), plan))
    scored.sort(key=lambda x: x[0])
    return [p for _, p in scored[:RESCORED]], len(probes)


def _lower_bound(t: np.ndarray, m: int, total: int) -> float:
    """A lower bound on (m − 1)·max_s t_s + Σ_s t_s over a layout's splits: the bottleneck is at least the least τ
    at which the stages can hold every layer (stage s at most max{n : t[s, n] ≤ τ}), and each stage takes at least
    its fastest."""
    low = t[:, 1:].min(axis=1)
    taus = np.unique(t[np.isfinite(t)])
    if not np.isfinite(low).all() or taus.size == 0:
        return np.inf
    n = np.arange(t.shape[1])
    hold = (n[None, None, :] * (t[:, None, :] <= taus[None, :, None])).max(axis=2).sum(axis=0)  # (τ,)
    ok = np.flatnonzero(hold >= total)
    return np.inf if ok.size == 0 else float((m - 1) * max(taus[ok[0]], low.max()) + low.sum())


def _links(probe: Plan, cluster: Cluster, model: ModelArch) -> tuple[float, np.ndarray]:
    """(Σ 2·p2p ms, each stage's dp ring GB/s) of a layout: they do not depend on its layer split."""
    where = place_stage_groups(probe, cluster)
    return stage_dp.p2p_total_ms(cluster, probe, model, where), stage_dp.dp_ring_gbps(cluster, probe, where)


def _tabled(plan: Plan, tables, split, links, cluster: Cluster, space: SearchSpace) -> tuple[bool, float]:
    """(below the floor, iteration time) of a candidate from the tables (memx.planner.stage_dp's assembly)."""
    t, peak, static, _, params = (np.array([tb[k][n] for tb, n in zip(tables, split)]) for k in range(5))
    caps = np.array([cluster.gpu(st.gpu).memory_mib for st in plan.stages])
    tail = stage_tail_ms(static[:, None], params[:, None], [cluster.gpu(st.gpu).memory_bandwidth_gbps for st in plan.stages],
                         links[1], distributed_optimizer=plan.distributed_optimizer,
                         dp=np.asarray(stage_dps(plan), dtype=np.float64)[:, None], precision=plan.precision,
                         comm_scale=1.0)
    T = iteration_time_ms(t[:, None], plan.micro_batches, links[0], tail)[0]
    return (bool(np.min((caps - peak) / caps) < space.margin_floor), float(T))


def _recompute(code: int, n: int) -> dict:
    r, rl = decode_option(code, n)
    return {"recompute": r, "recompute_layers": rl}


def with_stage_dp(result: SearchResult, cluster: Cluster, model: ModelArch, space: SearchSpace, predictor,
                  level_sets: tuple[tuple[str, ...], ...]) -> SearchResult:
    """`result` with the best per-stage-dp plan as its pick when it beats the pick (floor first, then time)."""
    t0 = time.perf_counter()
    plans, n_layouts = [], 0
    pick_high = result.margins_high.get(plan_key(result.chosen.plan), result.chosen.min_margin)
    # only a faster plan can replace a pick that clears the floor (replica_search._better)
    bound = result.chosen.iteration_time_ms if pick_high >= space.margin_floor else np.inf
    for levels in level_sets:
        got, n = candidates(cluster, model, space, predictor, levels, bound)
        plans, n_layouts = plans + got, n_layouts + n
    timings = {**result.timings, "stage_dp_layouts": float(n_layouts), "stage_dp_plans": float(len(plans))}
    best = _best(_estimated(plans, cluster, model, predictor, space), model, predictor, space)
    timings["stage_dp_s"] = time.perf_counter() - t0
    if best is None:
        return dataclasses.replace(result, timings=timings)
    m, high = best
    m = dataclasses.replace(m, phi=float(phi(m.iteration_time_ms, m.max_mem_mib, m.mem_variance_mib2, refs=result.refs,
                                             weights=result.weights, epsilon_mib2=space.epsilon_mib2)))
    margins = {**result.margins_high, plan_key(m.plan): high}
    if _better(m, high, result.chosen, pick_high, space):
        return dataclasses.replace(result, pick=m, margins_high=margins, warnings=(), timings=timings)
    return dataclasses.replace(result, margins_high=margins, timings=timings)


def _estimated(plans: list[Plan], cluster: Cluster, model: ModelArch, predictor, space: SearchSpace) -> list[PlanMetrics]:
    return estimate_plans(plans, cluster, model, predictor, reserve_gib=space.reserve_gib) if plans else []


def _best(est: list[PlanMetrics], model: ModelArch, predictor, space: SearchSpace) -> tuple[PlanMetrics, float] | None:
    """The feasible plan that clears the floor, then is fastest (replica_search._better), with its smallest margin
    at the upper memory bound (the point margin for a predictor without intervals)."""
    est = [e for e in est if e.feasible]
    best: tuple[PlanMetrics, float] | None = None
    for e, h in zip(est, upper_margins(est, model, predictor)):
        cand = (e, e.min_margin if h is None else h)
        if best is None or _better(*cand, *best, space):
            best = cand
    return best


def search_stage_dp(cluster: Cluster, model: ModelArch, space: SearchSpace, predictor) -> tuple[PlanMetrics, float]:
    """The best per-stage-dp plan alone (the bench's side of the comparison); InfeasibleError when none fits."""
    plans, _ = candidates(cluster, model, space, predictor)
    best = _best(_estimated(plans, cluster, model, predictor, space), model, predictor, space)
    if best is None:
        raise InfeasibleError("no feasible plan with a per-stage data-parallel degree")
    return best
