"""The opt-in per-stage data-parallel space (`stage_data_parallel: true`; issue #27, docs/planner.md §Data
parallel per stage).

Layouts: every GPU type of the plan is one FlagScale process mesh — its stages share one tp and one dp
(FlagScale's mesh is [tp, cp, ep, dp, pp]: flagscale/train/arguments.py pre_validate_args), k stages of tp × dp
GPUs — in every type order, with the first mesh's dp and micro batch b_0 fixing B = dp_0 · b_0 samples per
micro batch (every dp_i dividing B, global_batch a multiple of B), and every cp of `context_parallel_options` the
launcher starts (`context_parallels`; one cp for the plan, tp · cp · dp · k GPUs per mesh). Only layouts whose
meshes differ in dp are enumerated here: those with one dp are today's space, which the batched engine searches exactly.

Scoring stays outside the batched engine (memx.planner.tables / bounds / prepared know one dp and one micro
batch per layout): one predictor call for every (stage context, layers, recompute option) row of every layout
(contexts repeat across layouts and are predicted once). The search is exact for the floor-then-fastest rule
(docs/planner.md §Data parallel per stage): first the fastest plan whose every stage
clears `margin_floor` (at the upper memory bound where the predictor gives one), then, only when none does, the
fastest that fits. With T = (m − 1)·max_s t_s + Σ_s t_s + fixed + max_s tail_s (memx.planner.stage_dp), per layout
the compute part's least value over splits is found by a bottleneck-threshold dynamic programme (`best_splits`:
for each candidate bottleneck τ the least Σ_s t_s over splits whose stages all take ≤ τ), each stage's option the
fastest eligible one at its layer count, and the tail term by an ε-constraint walk over the largest tail
(`_walk`), exact for the paper's T; under the cycle-mean assemblies (the default cycle-mean-drain included) the
walk's plan is the incumbent of memx.planner.exact_split's branch-and-bound over the split (`_layout_best`).
Layouts are visited in order of a lower bound and cut off by the best plan so far and by the incumbent (the uniform
pick). tests/unit/test_stage_dp_exact.py checks it against full enumeration under the paper's and the default
assembly. A mixture-of-experts model is searched at an ep per mesh (FlagScale's; session 15): every combination of
`expert_parallel_options` values dividing each mesh's dp_s · cp, all 1 or none (`_mesh_eps`); its contexts carry
each stage's ep, expert dp group and all-to-all links (memx.planner.stage_dp.with_stage_experts) and its rows the
MoE terms (memx.planner.moe.adjust), as estimate_plans scores them.
"""

from __future__ import annotations

import dataclasses
import itertools
import time

import numpy as np

from memx.domain.errors import InfeasibleError
from memx.domain.plan import Plan, Stage, moe_problems
from memx.domain.runtime import usable_capacity_mib
from memx.domain.specs import Cluster, ModelArch, SearchSpace
from memx.domain.stage_dp import place_stage_groups, stage_dp_problems, stage_groups
from memx.planner import exact_split, moe, stage_dp
from memx.planner.collectives import dp_latency_ms
from memx.planner.context_parallel import add_ring_terms, launcher_runs_cp
from memx.planner.estimate import estimate_plans, upper_margins
from memx.planner.metrics import PlanMetrics
from memx.planner.moe_dense import measured_dense_shift
from memx.planner.network import achieved
from memx.planner.predictions import params_per_rank
from memx.planner.pick import with_candidate
from memx.planner.result import SearchResult, plan_key
from memx.planner.drain import drained_tail_py
from memx.planner.schedule import (AssemblyCalibration, assembly_of, drains, iteration_time_ms, stage_tail_ms,
                                   steady_loop_ms)
from memx.planner.signatures import predict_arrays, signature_columns
from memx.planner.space import _effective, _ends_ok, gpu_subsets, subset_precisions, valid_tps
from memx.planner.tables import decode_option, stage_options


def _meshes(cluster: Cluster, model: ModelArch, space: SearchSpace, gpu: str, cp: int) -> list[tuple[int, int, int]]:
    """(tp, dp, stages) of one GPU type's mesh: tp · cp · dp · stages its GPUs (all of them with use_all_gpus)."""
    count = cluster.gpu_count(gpu) // cp
    out = []
    for tp in valid_tps(model, cluster, gpu, space.tp_options):
        for dp in range(1, count // tp + 1):
            ks = [count // (tp * dp)] if space.use_all_gpus else range(1, count // (tp * dp) + 1)
            out += [(tp, dp, k) for k in ks if k >= 1 and (not space.use_all_gpus or k * tp * dp * cp == cluster.gpu_count(gpu))]
    return out


def context_parallels(cluster: Cluster, space: SearchSpace, subset: tuple[str, ...], seq: int) -> list[int]:
    """The cp of SearchSpace.context_parallel_options a plan on `subset` may take: 2·cp divides the sequence
    (memx.domain.context_parallel) and the launcher starts cp on these GPUs (context_parallel.launcher_runs_cp:
    never under `flagscale`, whose heterogeneous ParallelContext asserts cp == 1)."""
    runs = launcher_runs_cp(space.launcher, [cluster.gpu(g) for g in subset])
    return [cp for cp in space.context_parallel_options if cp == 1 or (runs and seq % (2 * cp) == 0)]


def layouts(cluster: Cluster, model: ModelArch, space: SearchSpace) -> list[Plan]:
    """One probe plan (1 layer per stage) per layout of the per-stage-dp space (module docstring), deterministic."""
    seq = space.seq_len or model.seq_len
    subsets = [s for s in gpu_subsets(cluster, space) if len(s) > 1]
    precisions = subset_precisions(cluster, space, subsets) if subsets else {}
    out = []
    for subset in (s for s in subsets if s in precisions):
        for cp in context_parallels(cluster, space, subset, seq):
            for meshes in itertools.product(*(_meshes(cluster, model, space, g, cp) for g in subset)):
                if len({dp for _, dp, _ in meshes}) == 1 or not space.min_pp <= sum(k for *_, k in meshes) <= min(
                        space.max_pp, model.layers):
                    continue
                for order in itertools.permutations(range(len(subset))):
                    out += _probes(cluster, model, space, [(subset[i], *meshes[i]) for i in order], seq,
                                   precisions[subset], cp)
    return out


def _mesh_eps(model: ModelArch, space: SearchSpace, meshes, cp: int) -> list[tuple[int, ...]]:
    """Every ep per mesh (FlagScale's per-mesh ep): each of `expert_parallel_options` dividing the mesh's dp · cp,
    every mesh's 1 or none (pre_validate_args; memx.domain.stage_dp.stage_dp_problems); (1, …) for a dense model."""
    ones = tuple(1 for _ in meshes)
    if not model.is_moe:
        return [ones]
    big = [[e for e in space.expert_parallel_options if e > 1 and dp * cp % e == 0] for _, _, dp, _ in meshes]
    return [ones, *itertools.product(*big)]


def _probes(cluster, model, space, meshes, seq, precision, cp) -> list[Plan]:
    base = tuple(Stage(gpu=g, tp=tp, layers=1, data_parallel=dp) for g, tp, dp, k in meshes for _ in range(k))
    if not _ends_ok(space.launcher, model, tuple(st.tp for st in base)):
        return []
    out = []
    for eps in _mesh_eps(model, space, meshes, cp):
        # a stage carries its mesh's ep where it differs from the first mesh's (the plan's): memx.domain.stage_dp
        stage_ep = [e for e, (*_, k) in zip(eps, meshes) for _ in range(k)]
        stages = tuple(dataclasses.replace(st, expert_parallel=e if e != eps[0] else None)
                       for st, e in zip(base, stage_ep))
        out += _probe_options(cluster, model, space, stages, seq, precision, cp, eps[0])
    return out


def _probe_options(cluster, model, space, stages, seq, precision, cp, ep) -> list[Plan]:
    """One probe per micro batch, distributed-optimizer and sequence-parallel option that validates and places."""
    dp0, out = stages[0].data_parallel, []
    for mb, do, sp in itertools.product(space.micro_batch_options, _effective(space.distributed_optimizer, True),
                                        _effective(space.sequence_parallel, max(st.tp for st in stages) > 1)):
        if space.global_batch % (dp0 * mb):
            continue
        probe = Plan(model=model.name, cluster=cluster.name, global_batch=space.global_batch, micro_batch=mb,
                     seq_len=seq, dp=dp0, stages=stages, distributed_optimizer=do, sequence_parallel=sp,
                     precision=precision, context_parallel=cp, expert_parallel=ep)
        if not (stage_dp_problems(probe, model) or moe_problems(probe, model)) \
                and place_stage_groups(probe, cluster) is not None:
            out.append(probe)
    return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Rows:
    """One stage context's predicted rows (every layer count n and recompute option code) and what depends on n."""

    layers: np.ndarray  # (R,) n
    codes: np.ndarray  # (R,) recompute option
    time_ms: np.ndarray  # (R,)
    static_mib: np.ndarray  # (R,)
    params: np.ndarray  # (R,) parameters per rank at n layers
    fits: np.ndarray  # (R,) peak ≤ capacity − reserve
    margin: np.ndarray  # (R,) (capacity − peak) / capacity, the peak at the upper bound where given

    def eligible(self, floor: float | None) -> np.ndarray:
        """The rows that fit and, unless floor is None, whose margin clears it."""
        return self.fits if floor is None else self.fits & (self.margin >= floor)


def _tables(per_probe: list[tuple], model: ModelArch, space: SearchSpace, predictor, levels: tuple[str, ...],
            cluster: Cluster) -> dict:
    """{context: _Rows} for every stage context of `probes`, from one predictor call (a cp > 1 context with its
    ring's terms, memx.planner.context_parallel.add_ring_terms). A row's margin is taken at max(upper bound, point
    peak) — the point peak where the predictor gives no interval (memx.planner.estimate.upper_margins, the margin
    the pick compares)."""
    ctxs = list(dict.fromkeys(c for pctx in per_probe for c in pctx))
    pattern = [(n, code) for n in range(1, model.layers + 1) for code in stage_options(n, levels)]  # every context's
    per_n, per_code = (np.asarray(col, dtype=np.int64) for col in zip(*pattern))
    idx = np.repeat(np.arange(len(ctxs)), len(pattern))
    layers, codes = np.tile(per_n, len(ctxs)), np.tile(per_code, len(ctxs))
    seq = space.seq_len or model.seq_len
    sigs = signature_columns(ctxs, layers, codes, idx, model, seq)
    raw = predict_arrays(predictor, sigs)
    if model.is_moe:  # the router, the experts and their memory, as estimate._predict_rows adds them
        raw = moe.adjust({c: np.array(v, dtype=np.float64) for c, v in raw.items()}, sigs, model,
                         {g.name: g for g in cluster.gpu_types}, measured_dense_shift(predictor, sigs, model))
    pred = add_ring_terms(raw, sigs, ctxs, idx, cluster)  # cp > 1: the ring's time and buffers
    peak = pred["peak_mem_mib"]
    # the upper bound without the ring's buffers, as upper_margins takes it (estimate._predict_stages without a cluster)
    high = raw.get("peak_mem_mib_high", np.full_like(peak, np.nan))
    top = np.where(np.isnan(high), peak, np.maximum(high, peak))
    out, edges = {}, np.searchsorted(idx, np.arange(len(ctxs) + 1))  # rows come context by context
    for i, c in enumerate(ctxs):
        r, cap = np.arange(edges[i], edges[i + 1]), usable_capacity_mib(cluster.gpu(c.gpu))
        fits = peak[r] <= cap - space.reserve_gib * 1024.0
        params = np.asarray(params_per_rank(c, np.arange(model.layers + 1), model), dtype=np.float64)
        out[c] = _Rows(layers=layers[r], codes=codes[r], time_ms=pred["time_ms"][r], static_mib=pred["static_mem_mib"][r],
                       params=params[layers[r]], fits=fits, margin=(cap - top[r]) / cap)
    return out


def _fastest(rows: _Rows, ok: np.ndarray, n_max: int) -> tuple[np.ndarray, np.ndarray]:
    """Per layer count n = 0..n_max, the least time over the rows `ok` and that row (inf / -1 where none)."""
    t, arg = np.full(n_max + 1, np.inf), np.full(n_max + 1, -1)
    r = np.flatnonzero(ok)
    if r.size:
        r = r[np.lexsort((rows.time_ms[r], rows.layers[r]))]  # by n, then time: the first row of each n is its fastest
        first = r[np.r_[True, rows.layers[r][1:] != rows.layers[r][:-1]]]
        t[rows.layers[first]], arg[rows.layers[first]] = rows.time_ms[first], first
    return t, arg


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
    src, blocked = exact_split.min_plus_shifts(total)  # D[τ, l − n] for every (l, n)
    blocked = blocked[None]
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


def _lower_bounds(t: np.ndarray, m: np.ndarray, total: int) -> tuple[np.ndarray, np.ndarray]:
    """Lower bounds on (m − 1)·max_s t_s + Σ_s t_s over the splits of layouts of one depth (t: (G, pp, total + 1)),
    as its two terms. The bottleneck is at least every stage's fastest and at least the least τ at which the stages
    can hold every layer: stage s holds at most #{n ≥ 1 : g_s(n) ≤ τ} layers, g_s(n) = min_{n' ≥ n} t[s, n'] (non-
    decreasing in n), so that τ is the total-th smallest g over all stages and counts. Each stage takes at least its
    fastest (`exact_split.least_sums` gives the sharper, dearer sum bound)."""
    low = t[:, :, 1:].min(axis=2)  # (G, pp)
    g = np.minimum.accumulate(t[:, :, :0:-1], axis=2)  # suffix minima over n = total..1
    flat = g.reshape(len(t), -1)
    tau = np.partition(flat, total - 1, axis=1)[:, total - 1] if flat.shape[1] >= total else np.full(len(t), np.inf)
    with np.errstate(invalid="ignore"):  # inf · 0 where m = 1
        part = np.where(m > 1, (m - 1) * np.maximum(tau, low.max(axis=1)), 0.0)
    ok = np.isfinite(low).all(axis=1) & np.isfinite(tau)
    return np.where(ok, part, np.inf), np.where(ok, low.sum(axis=1), np.inf)


class _Layout:
    """One probe's stages in a phase: each stage's rows, eligible rows and tail per row (the optimizer step and
    T_dp over its own dp_s ring, memx.planner.stage_dp), and the plan's fixed Σ 2·p2p + overhead."""

    def __init__(self, probe: Plan, rows: list[_Rows], ok: list[np.ndarray], cluster: Cluster, model: ModelArch,
                 assembly: AssemblyCalibration, tails: dict):
        self.probe, self.rows, self.ok = probe, rows, ok
        where = place_stage_groups(probe, cluster)
        rings = stage_dp.dp_rings(cluster, probe, where)
        experts = stage_dp.stage_expert_latency_ms(probe, cluster, model)  # ep > 1: the expert collectives' latency
        tail = [_tail(r, probe, st, g, ring, float(e), cluster, assembly, tails)
                for r, st, g, ring, e in zip(rows, probe.stages, stage_groups(probe), rings, experts)]
        # the tied embedding's all-reduce on the first and last stage (a layout constant, ×c as stage_tail_ms)
        emb = assembly.comm_scale * stage_dp.embedding_ms(cluster, probe, model, where)
        self.tail = [tl + emb if s in (0, len(tail) - 1) else tl for s, tl in enumerate(tail)]
        p2p = stage_dp.boundary_p2p_ms(cluster, probe, model, where)
        self.fixed_ms = stage_dp.fixed_ms(probe, p2p, assembly)
        # pipeline_assembly cycle-mean: the boundaries' 2·c·p2p in the steady-state loops (schedule.steady_loop_ms)
        self.loop_ms = steady_loop_ms(assembly, p2p)
        # no split has a smaller largest tail: every stage holds some eligible row; cycle-mean-drain: the tail term
        # max_s (tail_s − D_s) is ≥ tail_0 (memx.planner.drain), so only stage 0's least tail is a floor
        self.drain = drains(assembly)
        floors = [float(tl[o].min()) for tl, o in zip(self.tail, ok)]
        self.tail_floor = floors[0] if self.drain else max(floors)

    def table(self, below: float, n_max: int) -> tuple[np.ndarray, np.ndarray]:
        """(pp, n_max + 1) least stage times over the eligible rows whose tail is < `below`, and their rows."""
        got = [_fastest(r, o & (tl < below), n_max) for r, o, tl in zip(self.rows, self.ok, self.tail)]
        return np.stack([t for t, _ in got]), np.stack([a for _, a in got])

    def plan(self, split: tuple[int, ...], picked) -> tuple[Plan, float, float, float, float]:
        """(plan, compute part + fixed as the plan is scored, the paper's compute part + fixed, its tail term, its
        largest tail) of a split with row `picked[s]` on stage s (the two compute parts equal unless
        pipeline_assembly is cycle-mean; the tail term is the largest tail unless it is cycle-mean-drain)."""
        stages = tuple(dataclasses.replace(st, layers=n, **_recompute(int(r.codes[j]), n))
                       for st, r, n, j in zip(self.probe.stages, self.rows, split, picked))
        t = np.array([r.time_ms[j] for r, j in zip(self.rows, picked)])
        tails = [float(tl[j]) for tl, j in zip(self.tail, picked)]
        tail = drained_tail_py(list(t), tails, self.loop_ms) if self.drain else max(tails)
        def compute(loop):
            return float(iteration_time_ms(t[:, None], self.probe.micro_batches, self.fixed_ms,
                                           np.zeros((len(t), 1)), loop)[0])

        paper = compute(None)
        return dataclasses.replace(self.probe, stages=stages), (paper if self.loop_ms is None else compute(
            self.loop_ms)), paper, tail, max(tails)

    def split_problem(self, total: int) -> exact_split.SplitProblem:
        """The layout as memx.planner.exact_split's problem: each stage's eligible rows, Pareto on (time, tail)."""
        return exact_split.SplitProblem(
            candidates=tuple(exact_split.pareto_rows(r.layers, r.time_ms, tl, o)
                             for r, o, tl in zip(self.rows, self.ok, self.tail)),
            micro_batches=self.probe.micro_batches, total_layers=total, fixed_ms=self.fixed_ms, drain=self.drain,
            loop_ms=None if self.loop_ms is None else tuple(float(x) for x in self.loop_ms[:, 0]))


def _tail(rows: _Rows, probe: Plan, stage: Stage, dp: int, ring: tuple[float, float], experts_ms: float,
          cluster: Cluster, assembly: AssemblyCalibration, cache: dict) -> np.ndarray:
    """Per row, the stage's tail without the embedding's all-reduce (optimizer step + T_dp over its dp = dp_s · cp
    ranks, latency included: schedule.stage_tail_ms, memx.planner.collectives.dp_latency_ms; `ring`: (GB/s, step
    latency ms); `experts_ms`: the expert collective's latency, stage_dp.stage_expert_latency_ms), cached per
    context, ring, dp and that latency."""
    key = (id(rows), ring, dp, experts_ms)
    if key not in cache:
        gpu, k = cluster.gpu(stage.gpu), rows.layers.size
        cache[key] = stage_tail_ms(rows.static_mib[:, None], rows.params[:, None], np.full(k, gpu.memory_bandwidth_gbps),
                                   np.full(k, ring[0]), distributed_optimizer=probe.distributed_optimizer, dp=dp,
                                   precision=probe.precision, comm_scale=assembly.comm_scale,
                                   collectives_ms=np.full(k, float(dp_latency_ms(dp, ring[1])) + experts_ms))[:, 0]
    return cache[key]


def _layout_best(lay: _Layout, n_max: int, best: float) -> tuple[Plan, float] | None:
    """The fastest plan of one layout over its eligible rows if it is faster than `best`, exactly: the ε-constraint
    walk (`_walk`), exact for the paper's assembly; under the cycle-mean assemblies (the default cycle-mean-drain
    included) the walk's plan is the incumbent of memx.planner.exact_split's branch-and-bound, which finds the
    fastest split below it."""
    found = _walk(lay, n_max, best)
    if lay.loop_ms is None and not lay.drain:
        return found
    bound = best if found is None else found[1]
    got = exact_split.solve(lay.split_problem(n_max), bound)
    if got is None:
        return found
    plan, compute, _, tail, _ = lay.plan(got[1], got[2])  # scored as the walk's plans are (within rounding of got[0])
    return (plan, compute + tail) if compute + tail < bound else found


def _walk(lay: _Layout, n_max: int, best: float) -> tuple[Plan, float] | None:
    """The ε-constraint walk over the largest tail (docs/planner.md §Data parallel per stage): the least
    compute part C_k = (m − 1)·max t + Σ t among splits whose rows all have tail < σ_k (σ_0 = ∞) is found by the
    bottleneck programme (`best_splits`), its plan's largest tail becomes σ_{k+1}; every split whose largest tail lies
    in [σ_{k+1}, σ_k) takes at least C_k + that tail, so the walk misses none, and it stops once
    C_k + fixed + the least reachable largest tail cannot beat `best`: exact for the paper's assembly. With
    pipeline_assembly cycle-mean each found split is scored with the cycle mean (≥ C_k, so the stop stays safe) but
    the programme still ranks splits by the paper's C_k; with cycle-mean-drain the found split's tail term is the
    drained one (memx.planner.drain) and the stop uses stage 0's least tail (a floor of it), but the walk still steps
    σ by the largest tail: a good incumbent there, not an exact search (`_layout_best`)."""
    m, found, below = lay.probe.micro_batches, None, np.inf
    while True:
        t, arg = lay.table(below, n_max)
        splits = best_splits(t, m, n_max, keep=1, bound=best - lay.fixed_ms - lay.tail_floor)
        if not splits:
            return found
        plan, compute, paper, tail, largest = lay.plan(splits[0], [int(arg[s, n]) for s, n in enumerate(splits[0])])
        if compute + tail < best:
            found, best = (plan, compute + tail), compute + tail
        if paper + lay.tail_floor >= best:  # the paper's compute part: a lower bound of the cycle mean's too
            return found
        below = largest  # σ_{k+1}: the largest tail, as above (stepping by the drained term skipped bands, session 14)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Space:
    """The per-stage-dp space of one recompute level set: its probes and each probe's stage rows."""

    probes: list[Plan]
    rows: list[list[_Rows]]


def _space(cluster: Cluster, model: ModelArch, space: SearchSpace, predictor, levels: tuple[str, ...]) -> _Space:
    probes = layouts(cluster, model, space)
    per_probe = [stage_dp.plan_stage_contexts(p, cluster, model) for p in probes]  # a MoE model's with its experts
    tables = _tables(per_probe, model, space, predictor, levels, cluster) if probes else {}
    return _Space(probes=probes, rows=[[tables[c] for c in pctx] for pctx in per_probe])


def _fastest_in(sp: _Space, cluster: Cluster, model: ModelArch, predictor, floor: float | None,
                bound: float, pipeline_assembly: str | None = None) -> tuple[Plan | None, float]:
    """The fastest plan of `sp` faster than `bound` whose every stage clears `floor` (fits, where floor is None),
    and its tabled iteration time: exact over its layouts, splits and recompute options (`_layout_best`)."""
    unique = {id(r): r for rs in sp.rows for r in rs}.values()
    ok = {id(r): r.eligible(floor) for r in unique}
    fastest = {id(r): _fastest(r, ok[id(r)], model.layers)[0] for r in unique}
    tables = [np.stack([fastest[id(r)] for r in rs]) for rs in sp.rows]
    part, low = np.full(len(tables), np.inf), np.full(len(tables), np.inf)
    for pp in {p.pp for p in sp.probes}:
        at = np.flatnonzero([p.pp == pp for p in sp.probes])
        part[at], rest = _lower_bounds(np.stack([tables[i] for i in at]),
                                       np.array([sp.probes[i].micro_batches for i in at]), model.layers)
        low[at] = part[at] + rest
    assembly, tails, found = assembly_of(predictor, pipeline_assembly), {}, None
    slack = min(0.0, assembly.overhead_ms)  # the fixed term's least value (Σ 2·p2p and the tails are ≥ 0)
    for i in np.argsort(low, kind="stable"):  # most promising first: no later layout's bound is smaller
        if low[i] + slack >= bound:
            break
        sharper = part[i] + exact_split.least_sums(tables[i], model.layers)[0][model.layers]
        if sharper + slack >= bound:
            continue
        lay = _Layout(sp.probes[i], sp.rows[i], [ok[id(r)] for r in sp.rows[i]], cluster, model, assembly, tails)
        got = _layout_best(lay, model.layers, bound) if sharper + lay.fixed_ms + lay.tail_floor < bound else None
        if got is not None:
            found, bound = got
    return found, bound


def floor_then_fastest(cluster: Cluster, model: ModelArch, space: SearchSpace, predictor,
                       level_sets: tuple[tuple[str, ...], ...], *, clear_below: float = np.inf,
                       fit_below: float = np.inf) -> tuple[Plan | None, int]:
    """The best plan of the per-stage-dp space under the floor-then-fastest rule against an
    incumbent, and the layouts enumerated: the fastest plan whose stages all clear `margin_floor` and that is faster
    than `clear_below`; when none exists, the fastest plan that fits and is faster than `fit_below` (−inf: none
    wanted, the incumbent clears the floor). Exact over every level set's layouts, splits and recompute options
    (`_layout_best`)."""
    cluster = achieved(cluster, predictor)  # the NICs as the predictor sees them (memx.planner.network)
    spaces = [_space(cluster, model, space, predictor, tuple(levels)) for levels in level_sets]
    n = sum(len(sp.probes) for sp in spaces)
    for floor, below in ((space.margin_floor, clear_below), (None, fit_below)):
        found = None
        for sp in spaces:
            plan, below = _fastest_in(sp, cluster, model, predictor, floor, below, space.pipeline_assembly)
            found = plan or found
        if found is not None:
            return found, n
    return None, n


def _recompute(code: int, n: int) -> dict:
    r, rl = decode_option(code, n)
    return {"recompute": r, "recompute_layers": rl}


def with_stage_dp(result: SearchResult, cluster: Cluster, model: ModelArch, space: SearchSpace, predictor,
                  level_sets: tuple[tuple[str, ...], ...]) -> SearchResult:
    """`result` with the per-stage-dp space's floor-then-fastest plan among its kept candidates and the pick rule
    applied again to them all (memx.planner.pick.with_candidate). Searched
    only for a plan that could win under floor-then-fastest against the pick: faster than it and clearing the floor
    when the pick clears it."""
    cluster = achieved(cluster, predictor)  # the NICs as the predictor sees them (memx.planner.network)
    t0 = time.perf_counter()
    pick_high = result.margins_high.get(plan_key(result.chosen.plan), result.chosen.min_margin)
    t_pick, clears = result.chosen.iteration_time_ms, pick_high >= space.margin_floor
    plan, n_layouts = floor_then_fastest(cluster, model, space, predictor, level_sets,
                                         clear_below=t_pick if clears else np.inf, fit_below=-np.inf if clears else t_pick)
    timings = {**result.timings, "stage_dp_layouts": float(n_layouts), "stage_dp_plans": float(plan is not None)}
    best = _rescored(plan, cluster, model, predictor, space)
    timings["stage_dp_s"] = time.perf_counter() - t0
    if best is None:
        return dataclasses.replace(result, timings=timings)
    return dataclasses.replace(with_candidate(result, *best, space, model, predictor), timings=timings)


def _rescored(plan: Plan | None, cluster: Cluster, model: ModelArch, predictor,
              space: SearchSpace) -> tuple[PlanMetrics, float] | None:
    """The found plan scored by `estimate_plans` (the given-plan closed form, memx.planner.stage_dp) with its smallest
    margin at the upper memory bound (the point margin for a predictor without intervals); None when there is no
    plan or it does not fit."""
    if plan is None:
        return None
    (e,) = estimate_plans([plan], cluster, model, predictor, reserve_gib=space.reserve_gib,
                          pipeline_assembly=space.pipeline_assembly)
    if not e.feasible:
        return None
    (h,) = upper_margins([e], model, predictor)
    return e, e.min_margin if h is None else h


def search_stage_dp(cluster: Cluster, model: ModelArch, space: SearchSpace, predictor) -> tuple[PlanMetrics, float]:
    """The best per-stage-dp plan alone (the bench's side of the comparison); InfeasibleError when none fits."""
    cluster = achieved(cluster, predictor)  # the NICs as the predictor sees them (memx.planner.network)
    plan, _ = floor_then_fastest(cluster, model, space, predictor, (space.recompute_levels,))
    best = _rescored(plan, cluster, model, predictor, space)
    if best is None:
        raise InfeasibleError("no feasible plan with a per-stage data-parallel degree")
    return best
